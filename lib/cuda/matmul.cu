// MUL_MAT, MUL_MAT_ID and MOE_UP_GATE on the CUDA backend: host-side argument checks (the CPU
// backend's rules, plus the GPU kernels' own preconditions), then dispatch by batch size:
//   <= kGemvMaxCols activation rows / tokens: GEMV reading the weights directly (matmul_gemv.cu);
//   more: tensor cores (matmul_gemm.cu; expert ops grouped by expert on the device, matmul_moe.cu).
// Checks read only shapes, types and strides, never device data, so nothing here synchronises; ids
// are validated by the kernels (kErrorBadIndex, NaN outputs). The scratch a node needs is computed
// by the same layout code that carves it (mm::Carver), so matmul_scratch_bytes() and the kernels agree.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "cuda/cuda_common.cuh"
#include "cuda/fusion_plan.h"
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
    a.constant = w.is_weight;
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
           t == Type::MXFP4 || qd::decodes(t);
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
    const int64_t per_block = traits(w->type).block_size;
    if (w->ne[0] % kQK != 0 || w->ne[0] % per_block != 0) {
        return unimplemented(who + " has " + std::to_string(w->ne[0]) + " elements per row; the CUDA kernels need a multiple of " +
                             std::to_string(std::max<int64_t>(kQK, per_block)));
    }
    // The decoders read fp16 scales as 2-byte words (every decoded block size is even).
    if (qd::decodes(w->type) && (reinterpret_cast<uintptr_t>(w->data) | w->nb[1] | w->nb[2]) % 2 != 0) {
        return unimplemented(who + " (" + type_str(w->type) + ") data and row strides must be 2-byte aligned");
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
    return mm::gemm_dense_scratch(std::span<const mm::WeightArg>(&d.w, 1), *d.x);
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

// An expert product (MOE_UP_GATE or MUL_MAT_ID) as its kernels take it; an error for any other op.
StatusOr<mm::MoeArgs> parse_expert_product(const Tensor& node) {
    return node.op == Op::MOE_UP_GATE ? parse_moe_up_gate(node) : parse_mul_mat_id(node);
}

// Whether the expert product `node` passes its checks, has work and takes the GEMV path.
bool expert_product_takes_gemv(const Tensor& node) {
    const StatusOr<mm::MoeArgs> a = parse_expert_product(node);
    return a.is_ok() && a->n_tokens > 0 && a->w.n > 0 && mm::moe_takes_gemv(*a);
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

size_t matmul_scratch_bytes(const Tensor& node, ExpertGemmDecode decode) {
    switch (node.op) {
        case Op::MUL_MAT: {
            const StatusOr<DenseOp> d = parse_mul_mat(node);
            return d.is_ok() ? dense_scratch(*d) : 0;
        }
        case Op::MUL_MAT_ID:
        case Op::MOE_UP_GATE: {
            StatusOr<mm::MoeArgs> a = parse_expert_product(node);
            if (!a.is_ok()) return 0;
            a->decode = decode;
            return mm::moe_scratch(*a);
        }
        default: return 0;
    }
}

namespace {

// Bytes between the F32 rows of x when the GEMV kernel can read them in place (float weights): rows
// back to back, 16-byte aligned; 0 when they must be copied.
int64_t direct_row_stride(const Tensor& x) {
    if (x.type != Type::F32 || x.nb[0] != 4 || x.ne[0] % 4 != 0 || reinterpret_cast<uintptr_t>(x.data) % 16 != 0) {
        return 0;
    }
    size_t expect = 4 * static_cast<size_t>(x.ne[0]);
    for (int d = 1; d < 4; ++d) {
        if (x.ne[d] > 1 && x.nb[d] != expect) return 0;
        expect *= static_cast<size_t>(x.ne[d]);
    }
    return 4 * x.ne[0];
}

// One weight of a GEMV launch: its MUL_MAT and, optionally, the ADD of a bias row to its result.
struct GemvUnit {
    DenseOp d;
    const Tensor* mm = nullptr;
    float* out = nullptr;
    const float* bias = nullptr;
    float* out2 = nullptr;
    const Tensor* add = nullptr;
};

// The products of `units` (one activation x, the same weight type and k) in one GEMV launch. The
// activation comes from ctx.q8_act when a fused norm has quantised it already, is read in place for
// float weights when no output overlaps it, and is prepared into scratch otherwise.
Status run_gemv_units(std::span<const GemvUnit> units, const OpContext& ctx, const mm::RouterTail* router = nullptr,
                      bool* routed = nullptr) {
    const DenseOp& d0 = units[0].d;
    const Tensor& x = *d0.x;
    const void* acts = ctx.scratch;
    int64_t act_stride = 0;
    bool prepare = true;
    if (mm::q8_acts(d0.w.type)) {
        if (ctx.q8_act != nullptr) {
            acts = ctx.q8_act;
            prepare = false;
        }
    } else if (const int64_t stride = direct_row_stride(x); stride > 0) {
        const ByteRange xr = byte_range(x);
        bool clear = true;  // the kernel reads x while its blocks write the outputs
        for (const GemvUnit& u : units) {
            clear = clear && !xr.overlaps(byte_range(*u.mm)) && (u.add == nullptr || !xr.overlaps(byte_range(*u.add)));
        }
        if (clear) {
            acts = x.data;
            act_stride = stride;
            prepare = false;
        }
    }
    if (prepare) {
        MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT", dense_scratch(d0), ctx));
        MOE_RETURN_IF_ERROR(mm::gemv_prepare(mm::rows_f32(x), d0.m, d0.w.k, d0.w.type, ctx.scratch, ctx.stream));
    }
    mm::WeightArg ws[mm::kMaxGemvSegs];
    mm::GemvOut outs[mm::kMaxGemvSegs];
    for (size_t i = 0; i < units.size(); ++i) {
        ws[i] = units[i].d.w;
        ws[i].kquant_gemv = ctx.kquant_gemv;
        ws[i].float_gemv = ctx.float_gemv;
        outs[i] = mm::GemvOut{&ws[i], units[i].out, units[i].bias, units[i].out2};
    }
    return mm::gemv_multi(std::span<const mm::GemvOut>(outs, units.size()), nullptr, acts, act_stride, d0.m, nullptr,
                          nullptr, ctx.stream, router, routed);
}

}  // namespace

Status mul_mat(Tensor& dst, const OpContext& ctx) {
    MOE_ASSIGN_OR_RETURN(const DenseOp d, parse_mul_mat(dst));
    if (d.m == 0 || d.w.n == 0) return Status::ok();
    auto* out = static_cast<float*>(dst.data);
    if (d.m <= mm::kGemvMaxCols) {
        GemvUnit u;
        u.d = d;
        u.mm = &dst;
        u.out = out;
        return run_gemv_units(std::span<const GemvUnit>(&u, 1), ctx);
    }
    MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT", dense_scratch(d), ctx));
    return mm::gemm_dense(std::span<const mm::WeightArg>(&d.w, 1), *d.x, std::span<float* const>(&out, 1), ctx);
}

namespace {

// The products of a kDenseGroup, checked as the planner matched them (mul_mat_takes_dequant_gemm, one
// activation, one weight type and K).
Status parse_dense_group(std::span<Tensor* const> parts, std::array<mm::WeightArg, mm::kMaxDenseGroup>& ws,
                         std::array<float*, mm::kMaxDenseGroup>& outs, const Tensor*& x) {
    if (parts.empty() || parts.size() > static_cast<size_t>(mm::kMaxDenseGroup)) {
        return internal_error("mul_mat_dense_group: " + std::to_string(parts.size()) + " products");
    }
    for (size_t i = 0; i < parts.size(); ++i) {
        MOE_ASSIGN_OR_RETURN(const DenseOp d, parse_mul_mat(*parts[i]));
        if (!mm::gemm_dense_dequantises(d.w.type, d.m) || d.m <= mm::kGemvMaxCols ||
            (i > 0 && (d.x->data != x->data || d.m != x->n_rows() || d.w.type != ws[0].type || d.w.k != ws[0].k))) {
            return internal_error("mul_mat_dense_group: the products do not share one dequantising activation");
        }
        if (i == 0) x = d.x;
        ws[i] = d.w;
        outs[i] = static_cast<float*>(parts[i]->data);
    }
    return Status::ok();
}

}  // namespace

size_t mul_mat_dense_group_scratch(std::span<Tensor* const> parts) {
    std::array<mm::WeightArg, mm::kMaxDenseGroup> ws{};
    std::array<float*, mm::kMaxDenseGroup> outs{};
    const Tensor* x = nullptr;
    if (!parse_dense_group(parts, ws, outs, x).is_ok()) return 0;  // the launch reports the error
    return mm::gemm_dense_scratch(std::span<const mm::WeightArg>(ws.data(), parts.size()), *x);
}

Status mul_mat_dense_group(std::span<Tensor* const> parts, const OpContext& ctx) {
    std::array<mm::WeightArg, mm::kMaxDenseGroup> ws{};
    std::array<float*, mm::kMaxDenseGroup> outs{};
    const Tensor* x = nullptr;
    MOE_RETURN_IF_ERROR(parse_dense_group(parts, ws, outs, x));
    const std::span<const mm::WeightArg> units(ws.data(), parts.size());
    MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT", mm::gemm_dense_scratch(units, *x), ctx));
    return mm::gemm_dense(units, *x, std::span<float* const>(outs.data(), parts.size()), ctx);
}

namespace {

// mul_mat_group(), optionally with the router's selection in the launch (mul_mat_router).
Status mul_mat_group_routed(std::span<Tensor* const> parts, const OpContext& ctx, const mm::RouterTail* router,
                            bool* routed) {
    GemvUnit units[mm::kMaxGemvSegs];
    size_t n = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
        Tensor& p = *parts[i];
        if (p.op == Op::MUL_MAT) {
            if (n == mm::kMaxGemvSegs) return internal_error("mul_mat_group: more than 3 products");
            MOE_ASSIGN_OR_RETURN(units[n].d, parse_mul_mat(p));
            units[n].mm = &p;
            units[n].out = static_cast<float*>(p.data);
            const DenseOp& d = units[n].d;
            if (d.m > mm::kGemvMaxCols || (n > 0 && (d.m != units[0].d.m || d.w.type != units[0].d.w.type ||
                                                     d.w.k != units[0].d.w.k || d.x->data != units[0].d.x->data))) {
                return internal_error("mul_mat_group: the products do not share one GEMV activation");
            }
            ++n;
            continue;
        }
        // The ADD of a bias row to the previous product (matched by the planner).
        if (p.op != Op::ADD || n == 0 || units[n - 1].add != nullptr) return internal_error("mul_mat_group: unexpected part");
        GemvUnit& u = units[n - 1];
        const Tensor* m = parts[i - 1];
        const Tensor* b = p.src[0] == m || (p.src[0] != nullptr && p.src[0]->data == m->data) ? p.src[1] : p.src[0];
        if (b == nullptr || b->data == nullptr || p.data == nullptr || b->ne[0] != m->ne[0]) {
            return internal_error("mul_mat_group: the ADD is not a bias row of the product");
        }
        u.bias = static_cast<const float*>(b->data);
        u.out2 = static_cast<float*>(p.data);
        u.add = &p;
    }
    if (n == 0) return internal_error("mul_mat_group: no product");
    if (units[0].d.m == 0) return Status::ok();
    // Products that only their bias add reads, whose bytes a later part overwrites: not written.
    std::array<bool, kMaxParts> dead{};
    group_dead_products(parts, dead);
    for (size_t i = 0, u = 0; i < parts.size(); ++i) {
        if (parts[i]->op != Op::MUL_MAT) continue;
        if (dead[i] && units[u].bias != nullptr) units[u].out = nullptr;
        ++u;
    }
    return run_gemv_units(std::span<const GemvUnit>(units, n), ctx, router, routed);
}

}  // namespace

Status mul_mat_group(std::span<Tensor* const> parts, const OpContext& ctx) {
    return mul_mat_group_routed(parts, ctx, nullptr, nullptr);
}

Status mul_mat_router(std::span<Tensor* const> parts, const OpContext& ctx) {
    const size_t n = parts.size();
    if (n < 4 || parts[n - 3]->op != Op::TOPK || parts[n - 2]->op != Op::GATHER || parts[n - 1]->op != Op::SOFTMAX) {
        return internal_error("mul_mat_router: expected MUL_MAT [ADD] TOPK GATHER SOFTMAX");
    }
    const std::span<Tensor* const> product = parts.first(n - 3);
    const std::span<Tensor* const> select = parts.last(3);
    const Tensor& tk = *select[0];
    mm::RouterTail tail;
    tail.x = ops::view_of(*tk.src[0]);
    tail.ids = ops::view_of(tk);
    tail.vals = ops::view_of(*select[1]);
    tail.probs = ops::view_of(*select[2]);
    tail.k = tk.params.i[0];
    tail.counter = ctx.router_counter;
    if (tk.src[0] != product.back() || tk.src[0]->ne[1] != 1) {
        return internal_error("mul_mat_router: the router does not select from the product's one row");
    }
    bool routed = false;
    MOE_RETURN_IF_ERROR(mul_mat_group_routed(product, ctx, &tail, &routed));
    // Where the product took another kernel, the selection is its own launch (router_select's checks).
    return routed ? Status::ok() : router_select(select, ctx);
}

Status mul_mat_id(Tensor& dst, const OpContext& ctx) {
    MOE_ASSIGN_OR_RETURN(mm::MoeArgs a, parse_mul_mat_id(dst));
    a.decode = ctx.expert_decode;
    a.w.kquant_gemv = ctx.kquant_gemv;
    MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT_ID", mm::moe_scratch(a), ctx));
    return mm::moe_run(a, ctx);
}

Status mul_mat_id_bias(std::span<Tensor* const> parts, const OpContext& ctx) {
    if (parts.size() != 3 || parts[1]->op != Op::GET_ROWS || parts[2]->op != Op::ADD) {
        return internal_error("mul_mat_id_bias: the parts are not MUL_MAT_ID, GET_ROWS, ADD");
    }
    MOE_ASSIGN_OR_RETURN(mm::MoeArgs a, parse_mul_mat_id(*parts[0]));
    const Tensor* bias = parts[1]->src[0];
    if (bias == nullptr || bias->type != Type::F32 || bias->data == nullptr || parts[1]->data == nullptr ||
        parts[2]->data == nullptr || !mm::moe_takes_gemv(a)) {
        return internal_error("mul_mat_id_bias: not a GEMV product with F32 bias rows (as planned)");
    }
    a.bias.rows = static_cast<const float*>(bias->data);
    a.bias.stride = static_cast<int64_t>(bias->nb[1] / 4);
    a.bias.picked = static_cast<float*>(parts[1]->data);
    a.bias.sum = static_cast<float*>(parts[2]->data);
    a.decode = ctx.expert_decode;
    a.w.kquant_gemv = ctx.kquant_gemv;
    MOE_RETURN_IF_ERROR(check_scratch("MUL_MAT_ID", mm::moe_scratch(a), ctx));
    return mm::moe_run(a, ctx);
}

Status dequant_rows_bf16(const Tensor& w, void* dst, cudaStream_t stream) {
    MOE_RETURN_IF_ERROR(check_weights("dequant_rows_bf16", "w", &w, 2));
    if (w.type == Type::F32) return unimplemented("dequant_rows_bf16: F32 weights have no BF16 decode");
    if (w.ne[0] == 0 || w.ne[1] == 0) return Status::ok();
    if (dst == nullptr) return invalid_argument("dequant_rows_bf16: dst is null");
    if (w.ne[0] / kQK > int64_t{32} * ops::kMaxGridYZ) {
        return unimplemented("dequant_rows_bf16: rows of " + std::to_string(w.ne[0]) + " elements are too long");
    }
    return mm::dequant_bf16(mm::weight_arg(w), 0, w.ne[1], dst, stream);
}

Status moe_up_gate(Tensor& dst, const OpContext& ctx) {
    MOE_ASSIGN_OR_RETURN(mm::MoeArgs a, parse_moe_up_gate(dst));
    a.decode = ctx.expert_decode;
    a.w.kquant_gemv = ctx.kquant_gemv;
    MOE_RETURN_IF_ERROR(check_scratch("MOE_UP_GATE", mm::moe_scratch(a), ctx));
    return mm::moe_run(a, ctx);
}

const Tensor* gemv_q8_activation(const Tensor& node) {
    switch (node.op) {
        case Op::MUL_MAT: {
            const StatusOr<DenseOp> d = parse_mul_mat(node);
            if (!d.is_ok() || d->m == 0 || d->m > mm::kGemvMaxCols || !mm::q8_acts(d->w.type)) return nullptr;
            return d->x;
        }
        case Op::MUL_MAT_ID: {
            const StatusOr<mm::MoeArgs> a = parse_mul_mat_id(node);
            if (!a.is_ok() || a->b_rows != 1 || !mm::q8_acts(a->w.type) || !mm::moe_takes_gemv(*a)) return nullptr;
            return node.src[1];
        }
        case Op::MOE_UP_GATE: {
            const StatusOr<mm::MoeArgs> a = parse_moe_up_gate(node);
            if (!a.is_ok() || !mm::q8_acts(a->w.type) || !mm::moe_takes_gemv(*a)) return nullptr;
            return node.src[2];
        }
        default: return nullptr;
    }
}

bool mul_mat_id_takes_gemv(const Tensor& node) { return node.op == Op::MUL_MAT_ID && expert_product_takes_gemv(node); }

bool expert_route_carries(const Tensor& built, const Tensor& next) {
    if (next.op != Op::MUL_MAT_ID) return false;
    const StatusOr<mm::MoeArgs> b = parse_expert_product(built);
    const StatusOr<mm::MoeArgs> n = parse_mul_mat_id(next);
    if (!b.is_ok() || !n.is_ok() || !mm::moe_routes_match(*b, *n)) return false;
    // The ids the route was built from are still the ids `next` reads: `built` wrote none of their bytes.
    return !byte_range(built).overlaps(byte_range(*next.src[2]));
}

bool span_cut_after(const Tensor& node) {
    if (node.op == Op::MOE_UP_GATE) return expert_product_takes_gemv(node);
    if (node.op == Op::MUL_MAT_ID) return !expert_product_takes_gemv(node);
    return false;
}

bool step_cut_after(const Tensor& node) {
    const int layer = node.layer;
    return layer >= 0 && ((layer + 1) & layer) == 0 && span_cut_after(node);
}

bool mul_mat_takes_row_kernel(const Tensor& node) {
    if (node.op != Op::MUL_MAT) return false;
    const StatusOr<DenseOp> d = parse_mul_mat(node);
    return d.is_ok() && d->m == 1 && !mm::is_quant(d->w.type) && !qd::decodes(d->w.type) && d->w.n > 0 &&
           d->w.n <= mm::kRowKernelMaxRows;
}

bool mul_mat_takes_gemv(const Tensor& node) {
    if (node.op != Op::MUL_MAT) return false;
    const StatusOr<DenseOp> d = parse_mul_mat(node);
    return d.is_ok() && d->m >= 1 && d->m <= mm::kGemvMaxCols && d->w.n > 0;
}

bool mul_mat_takes_dequant_gemm(const Tensor& node) {
    if (node.op != Op::MUL_MAT) return false;
    const StatusOr<DenseOp> d = parse_mul_mat(node);
    return d.is_ok() && d->m > mm::kGemvMaxCols && mm::gemm_dense_dequantises(d->w.type, d->m) && d->w.n > 0;
}

}  // namespace moe::cuda
