#include "cpu/emulated_device.h"

#include <cstdlib>
#include <cstring>

#include "core/allocator.h"
#include "core/backend_registry.h"

namespace moe::cpu {
namespace {

// Host memory that claims to be device memory.
class EmulatedDeviceBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, size_t size) {
        const size_t rounded = (std::max<size_t>(size, 1) + 63) & ~size_t{63};
        void* p = std::aligned_alloc(64, rounded);
        if (p == nullptr) {
            return resource_exhausted("emulated device: cannot allocate " + std::to_string(size) + " bytes");
        }
        return std::unique_ptr<Buffer>(new EmulatedDeviceBuffer(backend, p, size));
    }
    ~EmulatedDeviceBuffer() override { std::free(data_); }
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return false; }

private:
    EmulatedDeviceBuffer(Backend* b, void* data, size_t size) : Buffer(b), data_(data), size_(size) {}
    void* data_;
    size_t size_;
};

// Free "device memory": MOEINFER_EMULATED_VRAM bytes if set (to test budgets), else 64 GiB.
size_t emulated_vram() {
    if (const char* v = std::getenv("MOEINFER_EMULATED_VRAM")) {
        char* end = nullptr;
        const unsigned long long n = std::strtoull(v, &end, 10);
        if (end != v && *end == '\0') return static_cast<size_t>(n);
    }
    return size_t{64} << 30;
}

}  // namespace

EmulatedDeviceBackend::EmulatedDeviceBackend(int n_threads) : kernels_(n_threads) {}

StatusOr<std::unique_ptr<Buffer>> EmulatedDeviceBackend::alloc_buffer(size_t size) {
    return EmulatedDeviceBuffer::allocate(this, size);
}

StatusOr<std::unique_ptr<Buffer>> EmulatedDeviceBackend::alloc_host_buffer(size_t size) {
    return HostBuffer::allocate(this, size);
}

size_t EmulatedDeviceBackend::free_memory() const { return emulated_vram(); }

Status EmulatedDeviceBackend::check_own_memory(const Tensor& node) const {
    auto own = [this](const Tensor* t) {
        const Buffer* b = storage_of(t)->buffer;
        return b != nullptr && !b->is_host() && b->backend() == this;
    };
    if (!own(&node)) return internal_error("emulated device: output '" + node.name + "' is not in device memory");
    for (const Tensor* s : node.src) {
        if (s != nullptr && !own(s)) {
            return internal_error(std::string("emulated device: operand '") + s->name + "' of " + op_name(node.op) +
                                  " is not in device memory");
        }
    }
    return Status::ok();
}

Status EmulatedDeviceBackend::compute(std::span<Tensor* const> nodes) {
    for (const Tensor* node : nodes) MOE_RETURN_IF_ERROR(check_own_memory(*node));
    // The CPU kernels refuse device memory; they are this backend's own, so compute through a copy of
    // each node whose operands look like host memory to them.
    for (Tensor* node : nodes) {
        Tensor local = *node;
        Tensor srcs[kMaxSrc];
        for (int i = 0; i < kMaxSrc; ++i) {
            if (node->src[i] == nullptr) continue;
            srcs[i] = *node->src[i];
            srcs[i].buffer = nullptr;
            srcs[i].view_src = nullptr;
            local.src[i] = &srcs[i];
        }
        local.buffer = nullptr;
        local.view_src = nullptr;
        Tensor* one = &local;
        MOE_RETURN_IF_ERROR(kernels_.compute(std::span<Tensor* const>(&one, 1)));
    }
    return Status::ok();
}

Status EmulatedDeviceBackend::copy_to_device(void* dst, const void* src_host, size_t n) {
    if (n == 0) return Status::ok();
    if (dst == nullptr || src_host == nullptr) return invalid_argument("copy_to_device: null pointer");
    std::memcpy(dst, src_host, n);
    return Status::ok();
}

Status EmulatedDeviceBackend::copy_to_host(void* dst_host, const void* src, size_t n) {
    if (n == 0) return Status::ok();
    if (dst_host == nullptr || src == nullptr) return invalid_argument("copy_to_host: null pointer");
    std::memcpy(dst_host, src, n);
    return Status::ok();
}

void register_emulated_backend() {
    register_backend_factory(BackendFactory{
        "emulated",
        [] { return 1; },
        [](const BackendOptions& o) -> StatusOr<std::unique_ptr<Backend>> {
            return std::unique_ptr<Backend>(std::make_unique<EmulatedDeviceBackend>(o.n_threads));
        },
    });
}

}  // namespace moe::cpu
