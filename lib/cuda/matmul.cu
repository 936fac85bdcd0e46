// MUL_MAT, MUL_MAT_ID and MOE_UP_GATE on the CUDA backend: host-side argument checks (the CPU
// backend's rules, plus the GPU kernels' own preconditions), then dispatch by batch size:
//   <= kGemvMaxCols activation rows / tokens: GEMV reading the weights directly (matmul_gemv.cu);
//   more: tensor cores (matmul_gemm.cu; expert ops grouped by expert on the device, matmul_moe.cu).
// Checks read only shapes, types and strides, never device data, so nothing here synchronises; ids
// are validated by the kernels (kErrorBadIndex, NaN outputs). The scratch a node needs is computed
// by the same layout code that carves it (mm::Carver), so matmul_scratch_bytes() and the kernels agree.
#include <cstdint>
#include <limits>
#include <string>

#include "cuda/cuda_common.cuh"
#include "cuda/matmul.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {

namespace mm {

WeightArg weight_arg(const Tensor& w) {
    WeightArg a;
    a.data = static_cast<const uint8_t*>(w.data);
    a.type = w.type;
    a.k = w.ne[0];
    a.n = w.ne[1];
    a.n_expert = w.ne[2];
    a.nb1 = static_cast<int64_t>(w.nb[1]);
    a.nb2 = static_cast<int64_t>(w.nb[2]);
    a.end = a.n > 0 && a.n_expert > 0
                ? a.data + (a.n_expert - 1) * a.nb2 + (a.n - 1) * a.nb1 + static_cast<int64_t>(row_bytes(w.type, a.k))
                : a.data;
    return a;
}

RowsF32 rows_f32(const Tensor& x) {
    RowsF32 r;
    r.data = static_cast<const uint8_t*>(x.data);
    r.ne1 = x.ne[1];
    r.ne2 = x.ne[2];
    r.nb1 = static_cast<int64_t>(x.nb[1]);
    r.nb2 = static_cast<int64_t>(x.nb[2]);
    r.nb3 = static_cast<int64_t>(x.nb[3]);
    return r;
}

}  // namespace mm

namespace {

using ops::shape_str;
using ops::type_str;

bool kernel_type(Type t) {
    return t == Type::F32 || t == Type::F16 || t == Type::BF16 || t == Type::Q8_0 || t == Type::Q4_0 ||
           t == Type::MXFP4;
}

Status check_weights(const char* op, const char* role, const Tensor* w, int max_dims) {
    const std::string who = std::string(op) + ": " + role;
    if (w == nullptr) return invalid_argument(who + " is missing");
    if (w->data == nullptr) return invalid_argument(who + " has no data");
    if (!kernel_type(w->type)) {
        return unimplemented(who + " type " + type_str(w->type) + " is not supported by the CUDA matmul kernels");
    }
    for (int d = max_dims; d < 4; ++d) {
        if (w->ne[d] != 1) {
            return invalid_argument(who + " must have at most " + std::to_string(max_dims) + " dimensions, got shape " +
                                    shape_str(*w));
        }
    }
    if (w->ne[0] % kQK != 0) {
        return unimplemented(who + " has " + std::to_string(w->ne[0]) +
                             " elements per row; the CUDA kernels need a multiple of 32");
    }
    const size_t rb = static_cast<size_t>(row_bytes(w->type, w->ne[0]));
    if (w->nb[0] != static_cast<size_t>(traits(w->type).block_bytes) || (w->ne[1] > 1 && w->nb[1] < rb) ||
        (w->ne[2] > 1 && w->nb[2] < w->nb[1] * static_cast<size_t>(w->ne[1]))) {
        return unimplemented(who + " rows must be contiguous and must not overlap (nb = [" + std::to_string(w->nb[0]) +
                             ", " + std::to_string(w->nb[1]) + ", " + std::to_string(w->nb[2]) + "])");
    }
    if (w->ne[1] > std::numeric_limits<int32_t>::max() || w->ne[0] / kQK > std::numeric_limits<int32_t>::max()) {
        return unimplemented(who + " shape " + shape_str(*w) + " is too large for the CUDA kernels");
    }
    return Status::ok();
}

Status check_dst(const char* op, const Tensor& dst, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    MOE_RETURN_IF_ERROR(ops::check_operand(op, "dst", &dst, Type::F32));
    if (dst.ne[0] != n0 || dst.ne[1] != n1 || dst.ne[2] != n2 || dst.ne[3] != n3) {
        return invalid_argument(std::string(op) + ": dst has shape " + shape_str(dst) + ", expected [" +
                                std::to_string(n0) + ", " + std::to_string(n1) + ", " + std::to_string(n2) + ", " +
                                std::to_string(n3) + "]");
    }
    size_t expect = 4;
    for (int d = 0; d < 4; ++d) {
        if (dst.ne[d] > 1 && dst.nb[d] != expect) {
            return unimplemented(std::string(op) + ": dst must be contiguous (nb[" + std::to_string(d) +
                                 "] = " + std::to_string(dst.nb[d]) + ", expected " + std::to_string(expect) + ")");
        }
        expect *= static_cast<size_t>(dst.ne[d]);
    }
    return Status::ok();
}

// ids I32 [n_used, T] with contiguous rows (values are checked on the device).
Status check_ids(const char* op, const char* role, const Tensor* ids, int64_t n_tokens) {
    MOE_RETURN_IF_ERROR(ops::check_operand(op, role, ids, Type::I32));
    if (ids->ne[1] != n_tokens || ids->ne[2] != 1 || ids->ne[3] != 1 || ids->ne[0] < 1) {
        return invalid_argument(std::string(op) + ": " + role + " has shape " + shape_str(*ids) +
                                ", expected [n_used, " + std::to_string(n_tokens) + "]");
    }
    if (ids->nb[1] % 4 != 0) {
        return unimplemented(std::string(op) + ": " + role + " row stride nb[1] = " + std::to_string(ids->nb[1]) +
                             " is not a multiple of 4");
    }
    if (ids->ne[0] * n_tokens > std::numeric_limits<int32_t>::max()) {
        return unimplemented(std::string(op) + ": " + std::to_string(ids->ne[0] * n_tokens) +
                             " (token, expert) pairs are too many for the CUDA kernels");
    }
    return Status::ok();
}

Status check_bias(const char* op, const char* role, const Tensor* b, int64_t f, int64_t e) {
    if (b == nullptr) return Status::ok();
    MOE_RETURN_IF_ERROR(ops::check_operand(op, role, b, Type::F32));
    if (b->ne[0] != f || b->ne[1] != e || b->ne[2] != 1 || b->ne[3] != 1) {
        return invalid_argument(std::string(op) + ": " + role + " has shape " + shape_str(*b) + ", expected [" +
                                std::to_string(f) + ", " + std::to_string(e) + "]");
    }
    if (b->nb[1] % 4 != 0) {
        return unimplemented(std::string(op) + ": " + role + " row stride nb[1] = " + std::to_string(b->nb[1]) +
                             " is not a multiple of 4");
    }
    return Status::ok();
}

// ---- MUL_MAT ----

struct DenseOp {
    mm::WeightArg w;
    const Tensor* x = nullptr;
    int64_t m = 0;
};

StatusOr<DenseOp> parse_mul_mat(const Tensor& dst) {
    constexpr const char* kOp = "MUL_MAT";
    if (dst.op != Op::MUL_MAT) return invalid_argument(std::string("mul_mat: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src0 (weight)", dst.src[0], 2));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "src1", dst.src[1], Type::F32));
    const Tensor& w = *dst.src[0];
    const Tensor& x = *dst.src[1];
    if (x.ne[0] != w.ne[0]) {
        return invalid_argument(std::string(kOp) + ": src1 has " + std::to_string(x.ne[0]) +
                                " elements per row, src0 (weight) has " + std::to_string(w.ne[0]));
    }
    MOE_RETURN_IF_ERROR(check_dst(kOp, dst, w.ne[1], x.ne[1], x.ne[2], x.ne[3]));
    if (x.n_rows() > std::numeric_limits<int32_t>::max()) {
        return unimplemented(std::string(kOp) + ": src1 has too many rows for the CUDA kernels");
    }
    DenseOp d;
    d.w = mm::weight_arg(w);
    d.x = &x;
    d.m = x.n_rows();
    return d;
}

size_t dense_scratch(const DenseOp& d) {
    if (d.m <= mm::kGemvMaxCols) return static_cast<size_t>(d.m) * mm::gemv_act_row_bytes(d.w.type, d.w.k);
    return mm::gemm_dense_scratch(d.w, *d.x);
}

// ---- MUL_MAT_ID / MOE_UP_GATE ----

StatusOr<mm::MoeArgs> parse_mul_mat_id(const Tensor& dst) {
    constexpr const char* kOp = "MUL_MAT_ID";
    if (dst.op != Op::MUL_MAT_ID) return invalid_argument(std::string("mul_mat_id: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src0 (experts)", dst.src[0], 3));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "src1", dst.src[1], Type::F32));
    const Tensor& w = *dst.src[0];
    const Tensor& x = *dst.src[1];
    const int64_t n_tokens = x.ne[2];
    if (x.ne[0] != w.ne[0] || x.ne[3] != 1) {
        return invalid_argument(std::string(kOp) + ": src1 has shape " + shape_str(x) + ", expected [" +
                                std::to_string(w.ne[0]) + ", B, T]");
    }
    MOE_RETURN_IF_ERROR(check_ids(kOp, "src2 (ids)", dst.src[2], n_tokens));
    const Tensor& ids = *dst.src[2];
    const int64_t n_used = ids.ne[0];
    if (x.ne[1] != 1 && x.ne[1] != n_used) {
        return invalid_argument(std::string(kOp) + ": src1 has " + std::to_string(x.ne[1]) +
                                " rows per token; expected 1 or n_used = " + std::to_string(n_used));
    }
    MOE_RETURN_IF_ERROR(check_dst(kOp, dst, w.ne[1], n_used, n_tokens, 1));
    mm::MoeArgs a;
    a.w = mm::weight_arg(w);
    a.x = mm::rows_f32(x);
    a.b_rows = x.ne[1];
    a.ids = static_cast<const int32_t*>(ids.data);
    a.ids_stride = static_cast<int64_t>(ids.nb[1] / 4);
    a.n_used = n_used;
    a.n_tokens = n_tokens;
    a.dst = static_cast<float*>(dst.data);
    return a;
}

StatusOr<mm::MoeArgs> parse_moe_up_gate(const Tensor& dst) {
    constexpr const char* kOp = "MOE_UP_GATE";
    if (dst.op != Op::MOE_UP_GATE) return invalid_argument(std::string("moe_up_gate: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src0 (up)", dst.src[0], 3));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src1 (gate)", dst.src[1], 3));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "src2 (x)", dst.src[2], Type::F32));
    const Tensor& up = *dst.src[0];
    const Tensor& gate = *dst.src[1];
    const Tensor& x = *dst.src[2];
    if (!ops::same_shape(up, gate)) {
        return invalid_argument(std::string(kOp) + ": src1 (gate) has shape " + shape_str(gate) + ", src0 (up) has " +
                                shape_str(up));
    }
    if (up.type != gate.type || up.nb[1] != gate.nb[1] || up.nb[2] != gate.nb[2]) {
        return unimplemented(std::string(kOp) + ": the CUDA kernel reads up and gate in one pass and needs the same "
                             "type and strides; got up " + type_str(up.type) + " and gate " + type_str(gate.type));
    }
    const int64_t k = up.ne[0];
    const int64_t f = up.ne[1];
    const int64_t n_expert = up.ne[2];
    const int64_t n_tokens = x.ne[1];
    if (x.ne[0] != k || x.ne[2] != 1 || x.ne[3] != 1) {
        return invalid_argument(std::string(kOp) + ": src2 (x) has shape " + shape_str(x) + ", expected [" +
                                std::to_string(k) + ", T]");
    }
    MOE_RETURN_IF_ERROR(check_ids(kOp, "src3 (ids)", dst.src[3], n_tokens));
    const Tensor& ids = *dst.src[3];
    const int64_t n_used = ids.ne[0];
    MOE_RETURN_IF_ERROR(check_bias(kOp, "src4 (up bias)", dst.src[4], f, n_expert));
    MOE_RETURN_IF_ERROR(check_bias(kOp, "src5 (gate bias)", dst.src[5], f, n_expert));
    if (dst.src[4] != nullptr && dst.src[5] != nullptr && dst.src[4]->nb[1] != dst.src[5]->nb[1]) {
        return unimplemented(std::string(kOp) + ": up and gate biases must have the same row stride");
    }
    MOE_RETURN_IF_ERROR(check_dst(kOp, dst, f, n_used, n_tokens, 1));
    const auto act = static_cast<Activation>(dst.params.i[0]);
    if (act != Activation::SILU && act != Activation::SWIGLU_OAI) {
        return invalid_argument(std::string(kOp) + ": params.i[0] = " + std::to_string(dst.params.i[0]) +
                                " is not an Activation (0 = SILU, 1 = SWIGLU_OAI)");
    }
    mm::MoeArgs a;
    a.w = mm::weight_arg(up);
    a.fused = true;
    a.gate = mm::weight_arg(gate);
    a.glu.act = static_cast<int>(act);
    a.glu.alpha = dst.params.f[0] != 0.0f ? dst.params.f[0] : 1.702f;
    a.glu.limit = dst.params.f[1] != 0.0f ? dst.params.f[1] : 7.0f;
    if (act == Activation::SWIGLU_OAI && !(a.glu.limit > 0.0f)) {
        return invalid_argument(std::string(kOp) + ": params.f[1] (limit) must be > 0, got " +
                                std::to_string(a.glu.limit));
    }
    a.glu.bias_up = dst.src[4] != nullptr ? static_cast<const float*>(dst.src[4]->data) : nullptr;
    a.glu.bias_gate = dst.src[5] != nullptr ? static_cast<const float*>(dst.src[5]->data) : nullptr;
    const Tensor* any_bias = dst.src[4] != nullptr ? dst.src[4] : dst.src[5];
    a.glu.bias_stride = any_bias != nullptr ? static_cast<int64_t>(any_bias->nb[1] / 4) : 0;
    a.x = mm::rows_f32(x);
    a.b_rows = 1;
    a.ids = static_cast<const int32_t*>(ids.data);
    a.ids_stride = static_cast<int64_t>(ids.nb[1] / 4);
    a.n_used = n_used;
    a.n_tokens = n_tokens;
    a.dst = static_cast<float*>(dst.data);
    return a;
}

Status check_scratch(const char* op, size_t need, const OpContext& ctx) {
    if (need > 0 && (ctx.scratch == nullptr || ctx.scratch_size < need)) {
        return invalid_argument(std::string(op) + ": needs " + std::to_string(need) + " bytes of scratch, OpContext has " +
                                std::to_string(ctx.scratch == nullptr ? 0 : ctx.scratch_size));
    }
    return Status::ok();
}

}  // namespace

bool supports_matmul_type(Type weight_type) { return kernel_type(weight_type); }

size_t matmul_scratch_bytes(const Tensor& node) {
    switch (node.op) {
        case Op::MUL_MAT: {
            const StatusOr<DenseOp> d = parse_mul_mat(node);
            return d.is_ok() ? dense_scratch(*d) : 0;
        }
        case Op::MUL_MAT_ID: {
            const StatusOr<mm::MoeArgs> a = parse_mul_mat_id(node);
            return a.is_ok() ? mm::moe_scratch(*a) : 0;
        }
        case Op::MOE_UP_GATE: {
            const StatusOr<mm::MoeArgs> a = parse_moe_up_gate(node);
            return a.is_ok() ? mm::moe_scratch(*a) : 0;
        }
        default: return 0;
    }
}

Status mul_mat(Tensor& dst, const OpContext& ctx) {
    MOE_ASSIGN_OR_RETURN(const DenseOp d, parse_mul_mat(dst));
    if (d.m == 0 || d.w.n == 0) return Status::ok();
    MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT", dense_scratch(d), ctx));
    auto* out = static_cast<float*>(dst.data);
    if (d.m <= mm::kGemvMaxCols) {
        MOE_RETURN_IF_ERROR(mm::gemv_prepare(mm::rows_f32(*d.x), d.m, d.w.k, d.w.type, ctx.scratch, ctx.stream));
        return mm::gemv(d.w, nullptr, ctx.scratch, d.m, nullptr, nullptr, out, ctx.stream);
    }
    return mm::gemm_dense(d.w, *d.x, out, ctx);
}

Status mul_mat_id(Tensor& dst, const OpContext& ctx) {
    MOE_ASSIGN_OR_RETURN(const mm::MoeArgs a, parse_mul_mat_id(dst));
    MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT_ID", mm::moe_scratch(a), ctx));
    return mm::moe_run(a, ctx);
}

Status moe_up_gate(Tensor& dst, const OpContext& ctx) {
    MOE_ASSIGN_OR_RETURN(const mm::MoeArgs a, parse_moe_up_gate(dst));
    MOE_RETURN_IF_ERROR(check_scratch("MOE_UP_GATE", mm::moe_scratch(a), ctx));
    return mm::moe_run(a, ctx);
}

}  // namespace moe::cuda
