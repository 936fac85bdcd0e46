#include "cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/allocator.h"
#include "core/backend_registry.h"
#include "cpu/host_read.h"

namespace moe::cpu {

StatusOr<std::unique_ptr<Buffer>> HostBuffer::allocate(Backend* backend, size_t size) {
    const size_t rounded = (std::max<size_t>(size, 1) + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
        return resource_exhausted("cannot allocate " + std::to_string(size) + " bytes of host memory");
    }
    return std::unique_ptr<Buffer>(new HostBuffer(backend, p, size));
}

HostBuffer::~HostBuffer() { std::free(data_); }

namespace {
int resolve_threads(int n) {
    if (n > 0) return n;
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? static_cast<int>(hw) : 1;
}
}  // namespace

CpuBackend::CpuBackend(int n_threads, bool fuse_moe_ffn)
    : n_threads_(resolve_threads(n_threads)), fuse_moe_ffn_(fuse_moe_ffn), arena_(n_threads_) {}

bool CpuBackend::supports_op(const Tensor& node) const {
    switch (node.op) {
        case Op::MUL_MAT:
        case Op::MUL_MAT_ID:
        case Op::MOE_UP_GATE:
        case Op::MUL_MAT_HEADS:
            return supports_matmul_type(node.src[0]->type);
        case Op::COUNT:
            return false;
        default:
            return true;
    }
}

StatusOr<std::unique_ptr<Buffer>> CpuBackend::alloc_buffer(size_t size) { return HostBuffer::allocate(this, size); }

Status CpuBackend::compute_node(Tensor& node) {
    switch (node.op) {
        case Op::NONE:
        case Op::VIEW: return Status::ok();
        case Op::GET_ROWS: return get_rows(node);
        case Op::RMS_NORM: return rms_norm(node);
        case Op::MUL:
        case Op::ADD: return binary(node);
        case Op::MUL_MAT: return mul_mat(node, scratch_);
        case Op::MUL_MAT_ID: return mul_mat_id(node, scratch_);
        case Op::MOE_UP_GATE: return moe_up_gate(node, scratch_);
        case Op::ROPE: return rope(node);
        case Op::ATTENTION: return attention(node, scratch_);
        case Op::SOFTMAX: return softmax(node);
        case Op::TOPK: return topk(node);
        case Op::GATHER: return gather(node);
        case Op::WEIGHTED_SUM: return weighted_sum(node);
        case Op::MASK_IDS: return mask_ids(node);
        case Op::SILU:
        case Op::SIGMOID: return unary(node);
        case Op::NORM_SCALE: return norm_scale(node);
        case Op::SWIGLU:
        case Op::SWIGLU_OAI: return glu(node);
        case Op::CPY: return cpy(node);
        case Op::CONCAT: return concat(node);
        case Op::MUL_MAT_HEADS: return mul_mat_heads(node, scratch_);
        case Op::GROUP_MASK: return group_mask(node);
        case Op::COUNT: break;
    }
    return unimplemented(std::string("cpu backend: op ") + op_name(node.op));
}

namespace {

// The scheduler must hand the CPU only host memory; device memory here is a scheduling bug, caught
// before a kernel dereferences it.
Status check_host_addressable(const Tensor& node) {
    auto device_resident = [](const Tensor* t) {
        const Buffer* b = storage_of(t)->buffer;
        return b != nullptr && !b->is_host();
    };
    if (device_resident(&node)) return internal_error("cpu: output '" + node.name + "' is in device memory");
    for (const Tensor* s : node.src) {
        if (s != nullptr && device_resident(s)) {
            return internal_error(std::string("cpu: operand '") + s->name + "' of " + op_name(node.op) +
                                  " is in device memory");
        }
    }
    return Status::ok();
}

}  // namespace

Status CpuBackend::compute(std::span<Tensor* const> nodes) {
    for (const Tensor* node : nodes) MOE_RETURN_IF_ERROR(check_host_addressable(*node));
    Status status;
    arena_.arena().execute([&] {
        for (size_t i = 0; i < nodes.size(); ++i) {
            Tensor* node = nodes[i];
            const bool fused = fuse_moe_ffn_ && i + 1 < nodes.size() && moe_ffn_fusable(*node, *nodes[i + 1]);
            status = fused ? moe_ffn(*node, *nodes[i + 1], scratch_, down_scratch_) : compute_node(*node);
            if (!status.is_ok()) {
                status = status.with_context(std::string("cpu ") + (fused ? "MOE_UP_GATE + MUL_MAT_ID" : op_name(node->op)) +
                                             (node->name.empty() ? "" : " '" + node->name + "'"));
                return;
            }
            if (fused) ++i;
        }
    });
    return status;
}

Status CpuBackend::copy_to_device(void* dst, const void* src_host, size_t n) {
    if (n != 0) std::memcpy(dst, src_host, n);
    return Status::ok();
}

Status CpuBackend::copy_to_host(void* dst_host, const void* src, size_t n) {
    if (n != 0) std::memcpy(dst_host, src, n);
    return Status::ok();
}

void register_backend() {
    register_backend_factory(BackendFactory{
        "cpu",
        [] { return 1; },
        [](const BackendOptions& o) -> StatusOr<std::unique_ptr<Backend>> {
            return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(o.n_threads, o.config.cpu_moe_fusion));
        },
        {},
        [](const BandwidthOptions& o) { return measure_host_read(o); },
    });
}

}  // namespace moe::cpu
