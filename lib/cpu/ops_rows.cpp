// Row selection and routing ops: GET_ROWS (embedding look-up from any weight type), and the MoE router
// helpers TOPK, GATHER and WEIGHTED_SUM.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {
namespace {

// Ids are checked in a serial pre-pass (they are few) so that the parallel loops cannot fail.
// allow_none: kNoExpert is valid too (GET_ROWS of expert biases in a split expert block).
Status check_ids(const char* op, const Tensor& ids, int64_t limit, const char* what, bool allow_none = false) {
    for (int64_t r = 0; r < ids.n_rows(); ++r) {
        const auto* row = reinterpret_cast<const int32_t*>(ops::row_ptr(ids, r));
        for (int64_t i = 0; i < ids.ne[0]; ++i) {
            if ((row[i] < 0 || row[i] >= limit) && !(allow_none && row[i] == kNoExpert)) {
                return out_of_range(std::string(op) + ": src1[" + std::to_string(i) + ", " + std::to_string(r) +
                                    "] = " + std::to_string(row[i]) + " is not a valid " + what + " (0 <= id < " +
                                    std::to_string(limit) + (allow_none ? ", or -1 for none)" : ")"));
            }
        }
    }
    return Status::ok();
}

Status check_2d(const char* op, const char* role, const Tensor& t) {
    if (t.ne[2] != 1 || t.ne[3] != 1) {
        return invalid_argument(std::string(op) + ": " + role + " must be 2-D, got shape " + ops::shape_str(t));
    }
    return Status::ok();
}

}  // namespace

Status get_rows(Tensor& dst) {
    if (dst.op != Op::GET_ROWS) return invalid_argument(std::string("get_rows: dst.op is ") + op_name(dst.op));
    const Tensor* w = dst.src[0];
    if (w == nullptr || w->data == nullptr)
        return invalid_argument("GET_ROWS: src0 (weight) is missing or has no data");
    const TypeTraits* tt = type_traits(static_cast<int32_t>(w->type));
    if (tt == nullptr || tt->to_float == nullptr || w->type == Type::I32) {
        return unimplemented("GET_ROWS: src0 type " + ops::type_str(w->type) + " is not supported");
    }
    if (w->nb[0] != static_cast<size_t>(tt->block_bytes)) {
        return unimplemented("GET_ROWS: src0 rows must be contiguous (nb[0] = " + std::to_string(w->nb[0]) + ")");
    }
    MOE_RETURN_IF_ERROR(check_2d("GET_ROWS", "src0", *w));
    MOE_RETURN_IF_ERROR(ops::check_operand("GET_ROWS", "src1 (ids)", dst.src[1], Type::I32));
    MOE_RETURN_IF_ERROR(ops::check_operand("GET_ROWS", "dst", &dst, Type::F32));
    const Tensor& ids = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_2d("GET_ROWS", "dst", dst));
    if (ids.n_rows() != 1 || dst.ne[0] != w->ne[0] || dst.ne[1] != ids.ne[0]) {
        return invalid_argument("GET_ROWS: dst " + ops::shape_str(dst) + " does not match src0 " + ops::shape_str(*w) +
                                " and src1 " + ops::shape_str(ids));
    }
    MOE_RETURN_IF_ERROR(check_ids("GET_ROWS", ids, w->ne[1], "row of src0", true));
    const auto* id = ids.as<int32_t>();
    const int64_t k = dst.ne[0];
    const DequantizeRowFn to_float = tt->to_float;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, dst.ne[1], ops::row_grain(k)),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          for (int64_t t = r.begin(); t < r.end(); ++t) {
                              auto* d = reinterpret_cast<float*>(dst.row(t));
                              if (id[t] == kNoExpert) {
                                  std::fill(d, d + k, 0.0f);
                              } else {
                                  to_float(w->row(id[t]), d, k);
                              }
                          }
                      });
    return Status::ok();
}

Status topk(Tensor& dst) {
    if (dst.op != Op::TOPK) return invalid_argument(std::string("topk: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("TOPK", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("TOPK", "dst", &dst, Type::I32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(check_2d("TOPK", "src0", x));
    const int32_t k = dst.params.i[0];
    const int64_t n = x.ne[0];
    if (k <= 0 || k > n) {
        return invalid_argument("TOPK: params.i[0] (k) = " + std::to_string(k) + " must be in [1, " +
                                std::to_string(n) + "]");
    }
    if (dst.ne[0] != k || dst.ne[1] != x.ne[1] || dst.ne[2] != 1 || dst.ne[3] != 1) {
        return invalid_argument("TOPK: dst shape " + ops::shape_str(dst) + ", expected [" + std::to_string(k) + ", " +
                                std::to_string(x.ne[1]) + "]");
    }
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, x.ne[1], ops::row_grain(n * k, 1 << 15)),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          // A sorted list of the best k so far; insertion is O(k) and k is small (experts used).
                          std::vector<float> best_v(static_cast<size_t>(k));
                          std::vector<int32_t> best_i(static_cast<size_t>(k));
                          for (int64_t t = r.begin(); t < r.end(); ++t) {
                              const auto* xr = reinterpret_cast<const float*>(x.row(t));
                              int32_t filled = 0;
                              for (int64_t e = 0; e < n; ++e) {
                                  const float v = ops::rank_key(xr[e]);
                                  // Later indices lose ties, so only a strictly larger value enters a full list.
                                  if (filled == k && !(v > best_v[k - 1])) continue;
                                  int32_t pos = filled < k ? filled++ : k - 1;
                                  while (pos > 0 && v > best_v[pos - 1]) {
                                      best_v[pos] = best_v[pos - 1];
                                      best_i[pos] = best_i[pos - 1];
                                      --pos;
                                  }
                                  best_v[pos] = v;
                                  best_i[pos] = static_cast<int32_t>(e);
                              }
                              auto* d = reinterpret_cast<int32_t*>(dst.row(t));
                              for (int32_t j = 0; j < k; ++j) d[j] = best_i[j];
                          }
                      });
    return Status::ok();
}

Status gather(Tensor& dst) {
    if (dst.op != Op::GATHER) return invalid_argument(std::string("gather: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("GATHER", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("GATHER", "src1 (ids)", dst.src[1], Type::I32));
    MOE_RETURN_IF_ERROR(ops::check_operand("GATHER", "dst", &dst, Type::F32));
    const Tensor& x = *dst.src[0];
    const Tensor& ids = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_2d("GATHER", "src0", x));
    MOE_RETURN_IF_ERROR(check_2d("GATHER", "src1 (ids)", ids));
    if (ids.ne[1] != x.ne[1] || !ops::same_shape(dst, ids)) {
        return invalid_argument("GATHER: src0 " + ops::shape_str(x) + ", src1 " + ops::shape_str(ids) + " and dst " +
                                ops::shape_str(dst) + " do not match");
    }
    MOE_RETURN_IF_ERROR(check_ids("GATHER", ids, x.ne[0], "index into a src0 column"));
    const int64_t k = ids.ne[0];
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, x.ne[1], ops::row_grain(k, 4096)),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          for (int64_t t = r.begin(); t < r.end(); ++t) {
                              const auto* xr = reinterpret_cast<const float*>(x.row(t));
                              const auto* ir = reinterpret_cast<const int32_t*>(ids.row(t));
                              auto* d = reinterpret_cast<float*>(dst.row(t));
                              for (int64_t j = 0; j < k; ++j) d[j] = xr[ir[j]];
                          }
                      });
    return Status::ok();
}

Status mask_ids(Tensor& dst) {
    MOE_RETURN_IF_ERROR(op_checks::check_mask_ids(dst));
    const Tensor& ids = *dst.src[0];
    const Tensor& groups = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_ids("MASK_IDS", ids, groups.ne[0], "expert id", true));
    const auto* group = groups.as<int32_t>();
    const int32_t keep = dst.params.i[0];
    const bool remap = dst.params.i[1] != 0;
    for (int64_t t = 0; t < ids.ne[1]; ++t) {
        const auto* in = reinterpret_cast<const int32_t*>(ids.row(t));
        auto* out = reinterpret_cast<int32_t*>(dst.row(t));
        for (int64_t j = 0; j < ids.ne[0]; ++j) {
            const int32_t e = in[j];
            out[j] = e == kNoExpert ? kNoExpert : remap ? group[e] : group[e] == keep ? e : kNoExpert;
        }
    }
    return Status::ok();
}

Status weighted_sum(Tensor& dst) {
    if (dst.op != Op::WEIGHTED_SUM) return invalid_argument(std::string("weighted_sum: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("WEIGHTED_SUM", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("WEIGHTED_SUM", "src1 (weights)", dst.src[1], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("WEIGHTED_SUM", "dst", &dst, Type::F32));
    const Tensor& y = *dst.src[0];
    const Tensor& w = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_2d("WEIGHTED_SUM", "src1 (weights)", w));
    if (y.ne[3] != 1 || y.ne[1] != w.ne[0] || y.ne[2] != w.ne[1] || dst.ne[0] != y.ne[0] || dst.ne[1] != y.ne[2] ||
        dst.ne[2] != 1 || dst.ne[3] != 1) {
        return invalid_argument("WEIGHTED_SUM: src0 " + ops::shape_str(y) + ", src1 " + ops::shape_str(w) +
                                " and dst " + ops::shape_str(dst) + " do not match ([N, k, T], [k, T] -> [N, T])");
    }
    const int64_t n = y.ne[0];
    const int64_t k = y.ne[1];
    MOE_RETURN_IF_ERROR(op_checks::check_weighted_sum_ids(dst));
    if (const Tensor* ids = dst.src[2]) {
        // A part of a split expert block: only the slots of its own experts (the others are unwritten).
        tbb::parallel_for(tbb::blocked_range<int64_t>(0, y.ne[2], ops::row_grain(n * k)),
                          [&](const tbb::blocked_range<int64_t>& r) {
                              for (int64_t t = r.begin(); t < r.end(); ++t) {
                                  const auto* wr = reinterpret_cast<const float*>(w.row(t));
                                  const auto* ir = reinterpret_cast<const int32_t*>(ids->row(t));
                                  auto* d = reinterpret_cast<float*>(dst.row(t));
                                  std::fill(d, d + n, 0.0f);
                                  for (int64_t j = 0; j < k; ++j) {
                                      if (ir[j] == kNoExpert) continue;
                                      const float c = wr[j];
                                      const auto* yr = reinterpret_cast<const float*>(y.row(j, t));
                                      for (int64_t i = 0; i < n; ++i) d[i] += c * yr[i];
                                  }
                              }
                          });
        return Status::ok();
    }
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, y.ne[2], ops::row_grain(n * k)),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          for (int64_t t = r.begin(); t < r.end(); ++t) {
                              const auto* wr = reinterpret_cast<const float*>(w.row(t));
                              auto* d = reinterpret_cast<float*>(dst.row(t));
                              const auto* y0 = reinterpret_cast<const float*>(y.row(0, t));
                              for (int64_t i = 0; i < n; ++i) d[i] = wr[0] * y0[i];
                              for (int64_t j = 1; j < k; ++j) {
                                  const float c = wr[j];
                                  const auto* yr = reinterpret_cast<const float*>(y.row(j, t));
                                  for (int64_t i = 0; i < n; ++i) d[i] += c * yr[i];
                              }
                          }
                      });
    return Status::ok();
}

}  // namespace moe::cpu
