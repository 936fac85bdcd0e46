// The per-head ops of multi-head latent attention: CONCAT (query = [absorbed nope part, rope part]; the
// prefill form's F16 keys and values, and its F32 copy of the cached latents) and MUL_MAT_HEADS (one weight
// matrix per head, W_UK and W_UV).
//
// MUL_MAT_HEADS is MUL_MAT_ID with the head as the expert: head h's row of token t goes through matrix
// h, so ids[h, t] = h and the expert kernels (activation quantisation, per-matrix GEMMs over every
// token, strided rows) do the work.
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {

Status concat(Tensor& dst) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_concat(dst));  // shared with the other backend
    const Tensor& a = *dst.src[0];
    const Tensor* b = dst.src[1];
    const size_t a_out = static_cast<size_t>(a.ne[0]) * ops::elem_size(dst.type);
    const bool b_shared = b != nullptr && b->ne[1] == 1;
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = ops::split_row(dst, r);
        uint8_t* d = dst.row(ri.i1, ri.i2);
        ops::convert_row(a.row(ri.i1, ri.i2), a.type, d, dst.type, a.ne[0]);
        if (b != nullptr) ops::convert_row(b->row(b_shared ? 0 : ri.i1, ri.i2), b->type, d + a_out, dst.type, b->ne[0]);
    });
    return Status::ok();
}

Status mul_mat_heads(Tensor& dst, Scratch& scratch) {
    if (dst.op != Op::MUL_MAT_HEADS) {
        return invalid_argument(std::string("mul_mat_heads: dst.op is ") + op_name(dst.op));
    }
    const Tensor* w = dst.src[0];
    const Tensor* x = dst.src[1];
    if (w == nullptr || x == nullptr) return invalid_argument("MUL_MAT_HEADS: src0 and src1 are required");
    if (w->ne[2] != x->ne[1] || x->ne[3] != 1) {
        return invalid_argument("MUL_MAT_HEADS: src0 " + ops::shape_str(*w) + " and src1 " + ops::shape_str(*x) +
                                " do not match ([K, N, H], [K, H, T])");
    }
    const int64_t n_head = x->ne[1];
    const int64_t n_tok = x->ne[2];
    std::vector<int32_t> ids(static_cast<size_t>(n_head * n_tok));
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t h = 0; h < n_head; ++h) ids[static_cast<size_t>(t * n_head + h)] = static_cast<int32_t>(h);
    }
    Tensor id_tensor;
    const int64_t id_ne[2] = {n_head, n_tok};
    set_shape(id_tensor, Type::I32, 2, id_ne);
    id_tensor.data = ids.data();

    // The same output, computed as the expert product (which names its operands MUL_MAT_ID's way).
    Tensor as_experts = dst;
    as_experts.op = Op::MUL_MAT_ID;
    as_experts.src[2] = &id_tensor;
    Status s = mul_mat_id(as_experts, scratch);
    if (!s.is_ok()) return s.with_context("MUL_MAT_HEADS");
    return Status::ok();
}

}  // namespace moe::cpu
