#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "core/backend_registry.h"
#include "core/device_memory.h"
#include "core/host_registry.h"
#include "core/quant_decode.h"
#include "core/upload_share.h"
#include "cuda/bandwidth.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.cuh"
#include "cuda/device_scope.h"
#include "cuda/host_copy.h"
#include "cuda/launch.cuh"
#include "cuda/mapped_copy.cuh"

namespace moe::cuda {

namespace {
// PDL without MOEINFER_CUDA_PDL set. On: with the implicit trigger of launch.cuh, all-GPU tg128 on the
// H100 was 9% faster for Q30-16 and unchanged for G20 (docs/PERF.md, 2026-11-23); an explicit early
// trigger had been 3% slower.
constexpr bool kPdlByDefault = true;

// cuBLAS's workspace: 32 MiB is what cuBLAS itself reserves on Hopper.
constexpr size_t kCublasWorkspace = size_t{32} << 20;

DeviceMemoryMeter& cuda_meter() { return DeviceMemoryMeter::of("cuda"); }

// Free memory of the current device as the driver reports it, or why it cannot say (a GPU another
// process holds in exclusive-process mode cannot be opened).
StatusOr<size_t> query_device_free() {
    size_t free = 0, total = 0;
    const cudaError_t err = cudaMemGetInfo(&free, &total);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_status(err, "cudaMemGetInfo");
    }
    return free;
}

// The same, 0 when it cannot say.
size_t current_device_free() {
    const StatusOr<size_t> free = query_device_free();
    return free.is_ok() ? *free : 0;
}

// cudaMalloc of n bytes (at least 1) on the current device, counted by the "cuda" meter, whose test
// hook may refuse it: RESOURCE_EXHAUSTED naming the bytes asked and free when the device (or the hook)
// cannot give them; *p is nullptr then.
Status metered_malloc(void** p, size_t n) {
    *p = nullptr;
    const size_t bytes = std::max<size_t>(n, 1);
    MOE_RETURN_IF_ERROR(cuda_meter().acquire(bytes, current_device_free(), "cuda"));
    const cudaError_t err = cudaMalloc(p, bytes);
    if (err == cudaSuccess) return Status::ok();
    (void)cudaGetLastError();
    *p = nullptr;
    cuda_meter().release(bytes);
    if (err != cudaErrorMemoryAllocation) return cuda_status(err, ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    cuda_meter().note_refused();
    return device_exhausted("cuda", bytes, cuda_meter().free_bytes(current_device_free()));
}

// Frees what metered_malloc(p, n) gave; nullptr is a no-op.
void metered_free(void* p, size_t n) {
    if (p == nullptr) return;
    cudaFree(p);
    cuda_meter().release(std::max<size_t>(n, 1));
}
}  // namespace

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

Status check_device(int device) {
    const int n = device_count();
    if (n == 0) return failed_precondition("no CUDA device found (CUDA device " + std::to_string(device) + " asked for)");
    if (device < 0 || device >= n) {
        return invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                                " device(s) found: 0.." + std::to_string(n - 1) + ")");
    }
    return Status::ok();
}

StatusOr<std::unique_ptr<Buffer>> DeviceBuffer::allocate(Backend* backend, int device, size_t size) {
    MOE_CUDA_DEVICE_SCOPE(device);
    void* p = nullptr;
    MOE_RETURN_IF_ERROR(metered_malloc(&p, size));
    return std::unique_ptr<Buffer>(new DeviceBuffer(backend, device, p, size));
}

DeviceBuffer::~DeviceBuffer() {
    const DeviceScope scope(device_);  // cudaFree synchronises the current device: make it the buffer's
    metered_free(data_, size_);
}

StatusOr<std::unique_ptr<Buffer>> PinnedHostBuffer::allocate(Backend* backend, size_t size) {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, std::max<size_t>(size, 1), cudaHostAllocPortable);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_status(err, ("cudaHostAlloc of " + std::to_string(size) + " bytes").c_str());
    }
    return std::unique_ptr<Buffer>(new PinnedHostBuffer(backend, p, size));
}

PinnedHostBuffer::~PinnedHostBuffer() { cudaFreeHost(data_); }

StatusOr<std::unique_ptr<Backend>> CudaBackend::create(int device) {
    MOE_ASSIGN_OR_RETURN(const BackendConfig config, parse_backend_config(""));
    return create(device, config);
}

StatusOr<std::unique_ptr<Backend>> CudaBackend::create(int device, const BackendConfig& config) {
    MOE_RETURN_IF_ERROR(check_device(device));
    std::unique_ptr<CudaBackend> b(new CudaBackend(device));
    MOE_CUDA_DEVICE_SCOPE(device);
    MOE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&b->n_sm_, cudaDevAttrMultiProcessorCount, device));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->compute_stream_, cudaStreamNonBlocking));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->copy_stream_, cudaStreamNonBlocking));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->copy_mark_, cudaEventDisableTiming));
    for (cudaEvent_t& e : b->fences_) MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->readback_done_, cudaEventDisableTiming));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->peer_stream_, cudaStreamNonBlocking));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->peer_ready_, cudaEventDisableTiming));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->peer_done_, cudaEventDisableTiming));
    const cublasStatus_t created = cublasCreate(&b->cublas_);
    if (created == CUBLAS_STATUS_ALLOC_FAILED) {
        // cuBLAS allocates device memory of its own (not through us, so the bytes asked are unknown):
        // say what is free, as for our own allocations.
        cuda_meter().note_refused();
        return resource_exhausted("cuda: out of device memory creating the cuBLAS handle (" +
                                  std::to_string(cuda_meter().free_bytes(current_device_free())) + " bytes free)");
    }
    MOE_CUBLAS_RETURN_IF_ERROR(created);
    MOE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(b->cublas_, b->compute_stream_));
    // A workspace of our own (after cublasSetStream, which resets it): cuBLAS would otherwise allocate
    // one per captured graph.
    MOE_RETURN_IF_ERROR(metered_malloc(&b->cublas_workspace_, kCublasWorkspace).with_context("allocating cuBLAS's workspace"));
    MOE_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(b->cublas_, b->cublas_workspace_, kCublasWorkspace));
    // The error word is mapped host memory, so that synchronize() reads it without a copy.
    void* flags = nullptr;
    MOE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&flags, sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable));
    b->error_flags_ = static_cast<unsigned int*>(flags);
    *b->error_flags_ = 0;
    void* flags_dev = nullptr;
    MOE_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&flags_dev, flags, 0));
    b->error_flags_dev_ = static_cast<unsigned int*>(flags_dev);
    // The attention's counters, then the router GEMV's (OpContext::router_counter).
    MOE_RETURN_IF_ERROR(metered_malloc(reinterpret_cast<void**>(&b->attn_counters_), sizeof(unsigned int) * (kAttnCounters + 1))
                            .with_context("allocating the attention's counters"));
    MOE_CUDA_RETURN_IF_ERROR(cudaMemset(b->attn_counters_, 0, sizeof(unsigned int) * (kAttnCounters + 1)));
    CudaBackend* self = b.get();
    b->graphs_ = std::make_unique<GraphRunner>(b->compute_stream_, [self](size_t i) { return self->launch_item(i); });
    b->graphs_enabled_ = config.cuda_graphs;
    b->fusion_enabled_ = config.cuda_fusion;
    b->kquant_gemv_ = config.kquant_gemv;
    b->float_gemv_ = config.float_gemv;
    // PDL needs compute capability 9.0; elsewhere launches stay plain.
    int cc_major = 0;
    MOE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
    b->pdl_supported_ = cc_major >= 9;
    b->pdl_enabled_ = b->pdl_supported_ && config.cuda_pdl.value_or(kPdlByDefault);
    b->pull_copies_ = config.cuda_pull_copies;
    b->expert_decode_ = config.expert_gemm_decode;
    return std::unique_ptr<Backend>(std::move(b));
}

CudaBackend::~CudaBackend() {
    relays_.clear();  // each waits for its copies
    const DeviceScope scope(device_);
    // Nothing queued may outlive the memory it uses.
    if (compute_stream_) cudaStreamSynchronize(compute_stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    if (peer_stream_) cudaStreamSynchronize(peer_stream_);
    graphs_.reset();
    if (cublas_) cublasDestroy(cublas_);
    metered_free(cublas_workspace_, kCublasWorkspace);
    metered_free(scratch_, scratch_size_);
    metered_free(gather_, gather_size_);
    metered_free(attn_counters_, sizeof(unsigned int) * (kAttnCounters + 1));
    if (error_flags_) cudaFreeHost(error_flags_);
    if (copy_mark_) cudaEventDestroy(copy_mark_);
    for (cudaEvent_t e : fences_) {
        if (e) cudaEventDestroy(e);
    }
    if (readback_done_) cudaEventDestroy(readback_done_);
    if (peer_ready_) cudaEventDestroy(peer_ready_);
    if (peer_done_) cudaEventDestroy(peer_done_);
    if (compute_stream_) cudaStreamDestroy(compute_stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    if (peer_stream_) cudaStreamDestroy(peer_stream_);
}

namespace {

// Head sizes ops_attention.cu has kernels for.
// 576: deepseek2's absorbed attention (kv_lora_rank 512 + 64 rope dims); 192: its prefill form (128 + 64).
bool attention_head_size_ok(int64_t d) {
    return d == 32 || d == 64 || d == 96 || d == 128 || d == 192 || d == 256 || d == 576;
}

bool get_rows_type_ok(Type t) {
    switch (t) {
        case Type::F32:
        case Type::F16:
        case Type::BF16:
        case Type::Q8_0:
        case Type::Q4_0:
        case Type::MXFP4: return true;
        default: return qd::decodes(t);  // Q4_1 .. IQ4_XS (core/quant_decode.h)
    }
}

}  // namespace

// Answers from types and the shape limits of the kernels; argument errors that the kernels detect
// (mismatched shapes, bad params) come back from compute() as a Status naming the operand.
bool CudaBackend::supports_op(const Tensor& node) const {
    const Tensor* s0 = node.src[0];
    switch (node.op) {
        case Op::NONE:
        case Op::VIEW: return true;
        case Op::MUL_MAT:
        case Op::MUL_MAT_ID:
        case Op::MOE_UP_GATE:
        case Op::MUL_MAT_HEADS: return s0 != nullptr && supports_matmul_type(s0->type);
        case Op::GET_ROWS: return s0 != nullptr && get_rows_type_ok(s0->type);
        case Op::ATTENTION: {
            const Tensor* k = node.src[1];
            const Tensor* v = node.src[2];
            return s0 != nullptr && k != nullptr && v != nullptr && k->type == v->type &&
                   (k->type == Type::F16 || k->type == Type::F32) && attention_head_size_ok(s0->ne[0]);
        }
        case Op::CPY: return node.type == Type::F32 || node.type == Type::F16;
        case Op::RMS_NORM:
        case Op::MUL:
        case Op::ADD:
        case Op::ROPE:
        case Op::SOFTMAX:
        case Op::TOPK:
        case Op::GATHER:
        case Op::WEIGHTED_SUM:
        case Op::MASK_IDS:
        case Op::SILU:
        case Op::SIGMOID:
        case Op::NORM_SCALE:
        case Op::SWIGLU:
        case Op::SWIGLU_OAI:
        case Op::CONCAT: return true;
        case Op::GROUP_MASK: return node.params.i[0] <= 64;  // groups one thread holds (ops_heads.cu)
        case Op::COUNT: break;
    }
    return false;
}

StatusOr<std::unique_ptr<Buffer>> CudaBackend::alloc_buffer(size_t size) {
    return DeviceBuffer::allocate(this, device_, size);
}

StatusOr<std::unique_ptr<Buffer>> CudaBackend::alloc_pinned_host_buffer(size_t size) {
    MOE_CUDA_DEVICE_SCOPE(device_);  // portable: every GPU of the process copies from it at the pinned rate
    return PinnedHostBuffer::allocate(this, size);
}

StatusOr<std::unique_ptr<Buffer>> CudaBackend::register_host(void* p, size_t n, bool read_only) {
    MOE_CUDA_DEVICE_SCOPE(device_);
    // Mapped: copy_to_device may pull small copies from page-locked memory with a kernel that reads it
    // through its device address (mapped_copy.cu); a registration without the flag is not mapped there,
    // and the kernel's reads fault (illegal address, seen on the H100 machine).
    unsigned int flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
    if (read_only) {
        // Without the flag the driver would pin the pages for writing, which a PROT_READ mapping refuses.
        int supported = 0;
        MOE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device_));
        if (supported == 0) return unimplemented("cuda: this device cannot register read-only host memory");
        flags |= cudaHostRegisterReadOnly;
    }
    const auto lock = [flags](void* q, size_t m) -> Status {
        const cudaError_t err = cudaHostRegister(q, m, flags);
        if (err == cudaSuccess) return Status::ok();
        (void)cudaGetLastError();
        return cuda_status(err, ("cudaHostRegister of " + std::to_string(m) + " bytes").c_str());
    };
    const auto unlock = [](void* q, size_t) {
        if (cudaHostUnregister(q) != cudaSuccess) (void)cudaGetLastError();
    };
    return HostRegistry::of("cuda").acquire(this, p, n, lock, unlock);
}

// Replaces `block` by one of `bytes`. Kernels queued earlier may still use the old block, so the compute
// stream is drained before it is freed; blocks grow only on the first large shapes, not per step.
Status CudaBackend::regrow(void*& block, size_t& size, size_t bytes, const char* what) {
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_));
    metered_free(block, size);
    block = nullptr;
    size = 0;
    MOE_RETURN_IF_ERROR(metered_malloc(&block, bytes).with_context(std::string("growing the ") + what));
    size = bytes;
    return Status::ok();
}

Status CudaBackend::ensure_scratch(size_t bytes) {
    if (bytes <= scratch_size_) return Status::ok();
    const size_t grown = std::max(bytes, scratch_size_ + scratch_size_ / 2);
    const size_t rounded = (grown + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
    return regrow(scratch_, scratch_size_, rounded, "kernel scratch");
}

size_t CudaBackend::scratch_bytes(const Tensor& node) const {
    switch (node.op) {
        case Op::MUL_MAT:
        case Op::MUL_MAT_ID:
        case Op::MOE_UP_GATE: return matmul_scratch_bytes(node, expert_decode_);
        case Op::ATTENTION: return attention_scratch_bytes(node, n_sm_);
        case Op::MUL_MAT_HEADS: return mul_mat_heads_scratch_bytes(node, expert_decode_);
        default: return 0;
    }
}

namespace {

Status dispatch(Tensor& node, const OpContext& ctx) {
    switch (node.op) {
        case Op::NONE:
        case Op::VIEW: return Status::ok();
        case Op::GET_ROWS: return get_rows(node, ctx);
        case Op::RMS_NORM: return rms_norm(node, ctx);
        case Op::MUL:
        case Op::ADD: return binary(node, ctx);
        case Op::MUL_MAT: return mul_mat(node, ctx);
        case Op::MUL_MAT_ID: return mul_mat_id(node, ctx);
        case Op::MOE_UP_GATE: return moe_up_gate(node, ctx);
        case Op::ROPE: return rope(node, ctx);
        case Op::ATTENTION: return attention(node, ctx);
        case Op::SOFTMAX: return softmax(node, ctx);
        case Op::TOPK: return topk(node, ctx);
        case Op::GATHER: return gather(node, ctx);
        case Op::WEIGHTED_SUM: return weighted_sum(node, ctx);
        case Op::MASK_IDS: return mask_ids(node, ctx);
        case Op::SILU:
        case Op::SIGMOID: return unary(node, ctx);
        case Op::NORM_SCALE: return norm_scale(node, ctx);
        case Op::SWIGLU:
        case Op::SWIGLU_OAI: return glu(node, ctx);
        case Op::CPY: return cpy(node, ctx);
        case Op::CONCAT: return concat(node, ctx);
        case Op::MUL_MAT_HEADS: return mul_mat_heads(node, ctx);
        case Op::GROUP_MASK: return group_mask(node, ctx);
        case Op::COUNT: break;
    }
    return unimplemented(std::string("cuda backend: op ") + op_name(node.op));
}

std::string node_context(const Tensor& node) {
    return std::string("cuda ") + op_name(node.op) + (node.name.empty() ? "" : " '" + node.name + "'");
}

}  // namespace

Status CudaBackend::launch_item(size_t i) {
    const LaunchItem& item = plan_.items[i];
    OpContext ctx;
    ctx.stream = compute_stream_;
    ctx.cublas = cublas_;
    ctx.scratch = scratch_;
    ctx.scratch_size = scratch_size_;
    ctx.n_sm = n_sm_;
    ctx.clusters = pdl_supported_;  // both need compute capability 9.0+
    ctx.error_flags = error_flags_dev_;
    ctx.attn_counters = attn_counters_;
    ctx.router_counter = attn_counters_ + kAttnCounters;
    ctx.moe_route_ready = item.route_from_prev;
    ctx.kquant_gemv = kquant_gemv_;
    ctx.float_gemv = float_gemv_;
    ctx.expert_decode = expert_decode_;
    const size_t slot_stride = (plan_.slot_bytes + 255) & ~size_t{255};
    if (item.q8_in >= 0) ctx.q8_act = static_cast<uint8_t*>(slots_) + static_cast<size_t>(item.q8_in) * slot_stride;
    if (item.q8_out >= 0) ctx.q8_out = static_cast<uint8_t*>(slots_) + static_cast<size_t>(item.q8_out) * slot_stride;
    const std::span<Tensor* const> parts(item.part.data(), static_cast<size_t>(item.n_part));
    const PdlScope pdl(pdl_enabled_);
    Status s;
    switch (item.kind) {
        case FusedKind::kNone: s = dispatch(*item.node, ctx); break;
        case FusedKind::kGemvGroup: s = mul_mat_group(parts, ctx); break;
        case FusedKind::kRowChain: s = row_chain(parts, ctx); break;
        case FusedKind::kRouter: s = router_select(parts, ctx); break;
        case FusedKind::kAttnPrep: s = attn_prep(parts, ctx); break;
        case FusedKind::kMoeBias: s = mul_mat_id_bias(parts, ctx); break;
        case FusedKind::kRouterGemv: s = mul_mat_router(parts, ctx); break;
        case FusedKind::kDenseGroup: s = mul_mat_dense_group(parts, ctx); break;
        case FusedKind::kSigmoidRouter: s = sigmoid_router(parts, ctx); break;
    }
    return s.is_ok() ? s : s.with_context(node_context(*item.node));
}

Status CudaBackend::compute(std::span<Tensor* const> nodes) {
    MOE_CUDA_DEVICE_SCOPE(device_);
    kernel_nodes_.clear();
    for (Tensor* n : nodes) {
        if (n->op != Op::NONE && n->op != Op::VIEW) kernel_nodes_.push_back(n);  // views only name memory
    }
    plan_fusions(kernel_nodes_, fusion_enabled_, plan_);
    // Scratch for the whole span first: growing it synchronises, which a capture must not see. The
    // Q8 slots follow the largest per-launch need.
    size_t need = 0;
    const Tensor* needs_most = nullptr;
    launch_nodes_.clear();
    extras_.clear();
    for (const LaunchItem& item : plan_.items) {
        ++fusion_stats_.fused[static_cast<int>(item.kind)];
        if (item.q8_in >= 0) ++fusion_stats_.q8_reused;
        launch_nodes_.push_back(item.node);
        extras_.push_back(NodeExtra{item.tag(), std::span<Tensor* const>(item.part.data() + 1,
                                                                          static_cast<size_t>(item.n_part - 1))});
        const size_t b = item.kind == FusedKind::kDenseGroup
                             ? mul_mat_dense_group_scratch(std::span<Tensor* const>(item.part.data(), static_cast<size_t>(item.n_part)))
                             : scratch_bytes(*item.node);
        if (b > need) {
            need = b;
            needs_most = item.node;
        }
    }
    const size_t slots_off = (need + 255) & ~size_t{255};
    const size_t slot_stride = (plan_.slot_bytes + 255) & ~size_t{255};
    const size_t total = slots_off + static_cast<size_t>(plan_.n_slots) * slot_stride;
    if (total > 0) {
        const Status s = ensure_scratch(total);
        if (!s.is_ok()) return needs_most != nullptr ? s.with_context(node_context(*needs_most)) : s;
    }
    slots_ = scratch_ != nullptr ? static_cast<uint8_t*>(scratch_) + slots_off : nullptr;
    if (!graphs_enabled_ || launch_nodes_.size() < GraphRunner::kMinGraph) {
        for (size_t i = 0; i < plan_.items.size(); ++i) MOE_RETURN_IF_ERROR(launch_item(i));
        return Status::ok();
    }
    // The kernels' arguments depend on the nodes, on what each launch fuses (extras_) and on where the
    // scratch block, the slots and the attention counters are; the graph's edges on whether launches
    // use PDL.
    const uint64_t state[] = {static_cast<uint64_t>(reinterpret_cast<uintptr_t>(scratch_)), scratch_size_,
                              static_cast<uint64_t>(reinterpret_cast<uintptr_t>(slots_)),
                              static_cast<uint64_t>(reinterpret_cast<uintptr_t>(attn_counters_)),
                              static_cast<uint64_t>(pdl_enabled_)};
    return graphs_->run(launch_nodes_, state, extras_);
}

Status CudaBackend::copy_to_device(void* dst_dev, const void* src_host, size_t n) {
    if (n == 0) return Status::ok();
    if (dst_dev == nullptr || src_host == nullptr) {
        return invalid_argument("copy_to_device: dst_dev and src_host must not be null");
    }
    // On the compute stream: activations are small, and behind queued weight uploads on the copy
    // stream they would wait for those. While uploads are in flight a kernel pulls them from
    // page-locked memory, as a DMA copy would still queue behind those uploads in the copy engine.
    MOE_CUDA_DEVICE_SCOPE(device_);
    bool pull = pull_copies_ == PullCopies::ALWAYS;
    if (pull_copies_ == PullCopies::WHILE_UPLOADING && n <= kPullCopyMaxBytes) {
        const cudaError_t q = cudaStreamQuery(copy_stream_);
        if (q != cudaSuccess && q != cudaErrorNotReady) return cuda_status(q, "cudaStreamQuery(copy stream)");
        pull = q == cudaErrorNotReady;
    }
    if (pull && n <= kPullCopyMaxBytes) {
        const void* mapped = mapped_device_pointer(src_host);
        const bool same_alignment = reinterpret_cast<uintptr_t>(mapped) % 16 == reinterpret_cast<uintptr_t>(dst_dev) % 16;
        // The last byte must be mapped too, and contiguously: the range may run out of a registered run.
        const void* mapped_last = mapped_device_pointer(static_cast<const uint8_t*>(src_host) + n - 1);
        const bool contiguous = mapped != nullptr && mapped_last == static_cast<const uint8_t*>(mapped) + n - 1;
        if (contiguous && same_alignment) {
            const PdlScope pdl(pdl_enabled_);
            return pull_from_host(dst_dev, mapped, n, compute_stream_);
        }
    }
    return copy_host_range(device_, dst_dev, src_host, n, compute_stream_);
}

Status CudaBackend::copy_to_host(void* dst_host, const void* src_dev, size_t n) {
    if (n == 0) return Status::ok();
    if (dst_host == nullptr || src_dev == nullptr) {
        return invalid_argument("copy_to_host: dst_host and src_dev must not be null");
    }
    MOE_CUDA_DEVICE_SCOPE(device_);
    MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_host, src_dev, n, cudaMemcpyDeviceToHost, compute_stream_));
    return Status::ok();
}

Status CudaBackend::gather_to_host(void* dst_host, std::span<const DeviceRegion> regions) {
    if (regions.size() < 2) return Backend::gather_to_host(dst_host, regions);
    size_t total = 0;
    for (const DeviceRegion& r : regions) {
        if (r.n > 0 && r.src == nullptr) {
            return invalid_argument("gather_to_host: a region of " + std::to_string(r.n) + " bytes has no address");
        }
        total += r.n;
    }
    if (total == 0) return Status::ok();
    if (dst_host == nullptr) return invalid_argument("gather_to_host: dst_host must not be null");
    MOE_CUDA_DEVICE_SCOPE(device_);
    if (total > gather_size_) {
        MOE_RETURN_IF_ERROR(regrow(gather_, gather_size_, (total + 4095) & ~size_t{4095}, "gather staging"));
    }
    MOE_RETURN_IF_ERROR(gather_regions(regions, static_cast<uint8_t*>(gather_), compute_stream_));
    MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_host, gather_, total, cudaMemcpyDeviceToHost, compute_stream_));
    return Status::ok();
}

size_t CudaBackend::free_memory() const {
    const DeviceScope scope(device_);
    if (!scope.status().is_ok()) return 0;
    return cuda_meter().free_bytes(current_device_free());
}

StatusOr<uint64_t> CudaBackend::mark_compute() {
    MOE_CUDA_DEVICE_SCOPE(device_);
    const uint64_t fence = next_fence_++;
    MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fences_[fence % kFences], compute_stream_));
    return fence;
}

Status CudaBackend::upload(void* dst_dev, const void* src_host, size_t n, uint64_t after) {
    if (n == 0) return Status::ok();
    if (dst_dev == nullptr || src_host == nullptr) return invalid_argument("upload: dst_dev and src_host must not be null");
    if (after >= next_fence_) return invalid_argument("upload: fence " + std::to_string(after) + " was never marked");
    MOE_CUDA_DEVICE_SCOPE(device_);
    cudaEvent_t fence = after != 0 ? fences_[after % kFences] : nullptr;
    // The links' shares: the own link's piece first, then each relay's (core/upload_share.h).
    for (const UploadPiece& p : links_.share(n)) {
        void* dst = static_cast<uint8_t*>(dst_dev) + p.offset;
        const void* src = static_cast<const uint8_t*>(src_host) + p.offset;
        if (p.link > 0) {
            MOE_RETURN_IF_ERROR(relays_[static_cast<size_t>(p.link - 1)]->send(dst, src, p.bytes, fence));
            relayed_bytes_ += p.bytes;
            continue;
        }
        if (fence != nullptr) MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, fence, 0));
        // Weights at load and expert slices can lie across the border of a page-locked run of another
        // context's placement (copy_host_range).
        MOE_RETURN_IF_ERROR(copy_host_range(device_, dst, src, p.bytes, copy_stream_));
    }
    return Status::ok();
}

Status CudaBackend::order_after_uploads() {
    MOE_CUDA_DEVICE_SCOPE(device_);
    MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_mark_, copy_stream_));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, copy_mark_, 0));
    for (const std::unique_ptr<UploadRelay>& r : relays_) MOE_RETURN_IF_ERROR(r->order(compute_stream_));
    return Status::ok();
}

StatusOr<bool> CudaBackend::add_upload_relay(Backend& partner, bool measure) {
    auto* other = dynamic_cast<CudaBackend*>(&partner);
    if (other == nullptr || other->device_ == device_) return false;
    for (const std::unique_ptr<UploadRelay>& r : relays_) {
        if (r->partner() == other->device_) return true;
    }
    // The partner reads host memory and writes here: peer access both ways.
    MOE_ASSIGN_OR_RETURN(const bool there, other->enable_peer_access(*this));
    MOE_ASSIGN_OR_RETURN(const bool here, enable_peer_access(*other));
    if (!there || !here) return false;
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<UploadRelay> relay,
                         UploadRelay::create(this, device_, other->device_, kRelaySlotBytes, kRelaySlots));
    if (measure) {
        MOE_ASSIGN_OR_RETURN(const UploadRelay::Rates rates, relay->measure());
        // Each relayed byte crosses the peer link after the partner's host link: over PCIe peer-to-peer
        // it would share this GPU's own link and gain nothing.
        if (rates.peer < 2.0 * rates.host) return false;
    }
    relays_.push_back(std::move(relay));
    links_ = LinkShares(relays_.size() + 1);
    return true;
}

StatusOr<bool> CudaBackend::enable_peer_access(Backend& peer) {
    const auto* other = dynamic_cast<const CudaBackend*>(&peer);
    if (other == nullptr) return false;
    if (other->device_ == device_) return true;
    // Peer access belongs to the process's primary contexts: enabled once per ordered pair, whichever
    // context asks first (cudaErrorPeerAccessAlreadyEnabled where code outside ours did it).
    static std::mutex mutex;
    static std::set<std::pair<int, int>> enabled;
    const std::lock_guard<std::mutex> lock(mutex);
    if (enabled.count({device_, other->device_})) return true;
    MOE_CUDA_DEVICE_SCOPE(device_);
    int can = 0;
    MOE_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device_, other->device_));
    if (can == 0) return false;
    const cudaError_t err = cudaDeviceEnablePeerAccess(other->device_, 0);
    if (err == cudaErrorTooManyPeers) {
        (void)cudaGetLastError();
        return false;
    }
    if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return cuda_status(err, ("cudaDeviceEnablePeerAccess(GPU " + std::to_string(device_) + " to GPU " +
                                 std::to_string(other->device_) + ")").c_str());
    }
    (void)cudaGetLastError();  // clears cudaErrorPeerAccessAlreadyEnabled
    enabled.insert({device_, other->device_});
    return true;
}

Status CudaBackend::copy_from_peer(void* dst_dev, Backend& peer, const void* src_dev, size_t n) {
    if (n == 0) return Status::ok();
    auto* other = dynamic_cast<CudaBackend*>(&peer);
    if (other == nullptr) {
        return invalid_argument(std::string("copy_from_peer: the peer is a ") + peer.name() + " backend, not cuda");
    }
    if (dst_dev == nullptr || src_dev == nullptr) return invalid_argument("copy_from_peer: dst_dev and src_dev must not be null");
    {
        // After what the peer's compute stream has queued (the stage that produced src).
        MOE_CUDA_DEVICE_SCOPE(other->device_);
        MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(other->peer_ready_, other->compute_stream_));
    }
    MOE_CUDA_DEVICE_SCOPE(device_);
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(peer_stream_, other->peer_ready_, 0));
    MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(dst_dev, device_, src_dev, other->device_, n, peer_stream_));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(peer_done_, peer_stream_));
    // Compute here reads dst after the copy; compute there may overwrite src only after it.
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, peer_done_, 0));
    const DeviceScope there(other->device_);
    MOE_RETURN_IF_ERROR(there.status());
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(other->compute_stream_, peer_done_, 0));
    return Status::ok();
}

Status CudaBackend::wait_fence(uint64_t fence) {
    if (fence == 0) return Status::ok();
    if (fence >= next_fence_) return invalid_argument("wait_fence: fence " + std::to_string(fence) + " was never marked");
    MOE_CUDA_DEVICE_SCOPE(device_);
    MOE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(fences_[fence % kFences]));
    return Status::ok();
}

// On the compute stream, so that it waits for the producers but not for uploads queued on the copy
// stream (the scheduler reads router choices while the next layer's experts are still in flight).
Status CudaBackend::read_now(void* dst_host, const void* src_dev, size_t n) {
    if (n == 0) return Status::ok();
    if (dst_host == nullptr || src_dev == nullptr) return invalid_argument("read_now: dst_host and src_dev must not be null");
    MOE_CUDA_DEVICE_SCOPE(device_);
    MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_host, src_dev, n, cudaMemcpyDeviceToHost, compute_stream_));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(readback_done_, compute_stream_));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(readback_done_));
    return Status::ok();
}

Status CudaBackend::synchronize() {
    MOE_CUDA_DEVICE_SCOPE(device_);
    // Every stream waited for, the first error reported: nothing is left in flight.
    Status relayed = Status::ok();
    for (const std::unique_ptr<UploadRelay>& r : relays_) {
        const Status st = r->synchronize();
        if (relayed.is_ok()) relayed = st;
    }
    const cudaError_t copies = cudaStreamSynchronize(copy_stream_);
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_));
    MOE_RETURN_IF_ERROR(relayed);
    MOE_CUDA_RETURN_IF_ERROR(copies);
    const unsigned int flags = *reinterpret_cast<volatile unsigned int*>(error_flags_);
    if (flags != 0) {
        *error_flags_ = 0;
        if (flags & kErrorBadIndex) {
            return out_of_range("cuda: a GET_ROWS / GATHER id or a CPY row index was out of range since the last "
                                "synchronize; the outputs it selected are NaN, the rows it named not written");
        }
        return internal_error("cuda: a kernel raised error flags 0x" + std::to_string(flags));
    }
    return Status::ok();
}

void register_backend() {
    BackendFactory f{
        "cuda",
        [] { return device_count(); },
        [](const BackendOptions& o) { return CudaBackend::create(o.device, o.config); },
        [](const BandwidthOptions& o) { return measure_link(o); },
        {},
    };
    // What CudaBackend::free_memory says for the GPU, without a backend's streams and handles on it.
    f.free_memory = [](const BackendOptions& o) -> StatusOr<uint64_t> {
        MOE_RETURN_IF_ERROR(check_device(o.device));
        const DeviceScope scope(o.device);
        MOE_RETURN_IF_ERROR(scope.status());
        // A GPU that cannot be opened says why rather than offering 0 bytes: the several-device default
        // leaves such a GPU out.
        StatusOr<size_t> free = query_device_free();
        if (!free.is_ok()) return free.status().with_context("GPU " + std::to_string(o.device));
        return uint64_t{cuda_meter().free_bytes(*free)};
    };
    register_backend_factory(std::move(f));
}

}  // namespace moe::cuda
