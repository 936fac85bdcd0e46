#include "cpu/emulated_device.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/backend_registry.h"
#include "core/device_memory.h"
#include "core/host_registry.h"
#include "cpu/emulated_streams.h"

namespace moe::cpu {
namespace {

// The meter of emulated card `ordinal`: "emulated" for card 0 (the one-device contexts'), "emulatedN"
// for card N.
DeviceMemoryMeter& emulated_meter(int ordinal) {
    return ordinal == 0 ? DeviceMemoryMeter::of("emulated") : DeviceMemoryMeter::of("emulated" + std::to_string(ordinal));
}

// The card's size (BackendConfig::emulated_vram, to test budgets) less what the emulated devices of that
// card hold (the test limit of the meter aside). Every emulated device of one ordinal in the process
// allocates from it, as contexts on one GPU share its memory; each ordinal is a card of its own (a meter
// of its own).
size_t emulated_free(int ordinal, size_t total) {
    const size_t live = emulated_meter(ordinal).live_bytes();
    return total > live ? total - live : 0;
}

// Host memory that claims to be device memory, counted against the emulated card's size.
class EmulatedDeviceBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, int ordinal, size_t vram, size_t size) {
        DeviceMemoryMeter& meter = emulated_meter(ordinal);
        const size_t free = emulated_free(ordinal, vram);
        if (size > free) {
            meter.note_refused();
            return device_exhausted("emulated device", size, meter.free_bytes(free));
        }
        MOE_RETURN_IF_ERROR(meter.acquire(size, free, "emulated device"));
        const size_t rounded = (std::max<size_t>(size, 1) + 63) & ~size_t{63};
        void* p = std::aligned_alloc(64, rounded);
        if (p == nullptr) {
            meter.release(size);
            meter.note_refused();
            return device_exhausted("emulated device", size, meter.free_bytes(emulated_free(ordinal, vram)));
        }
        return std::unique_ptr<Buffer>(new EmulatedDeviceBuffer(backend, meter, p, size));
    }
    ~EmulatedDeviceBuffer() override {
        std::free(data_);
        meter_.release(size_);
    }
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return false; }

private:
    EmulatedDeviceBuffer(Backend* b, DeviceMemoryMeter& meter, void* data, size_t size)
        : Buffer(b), meter_(meter), data_(data), size_(size) {}
    DeviceMemoryMeter& meter_;
    void* data_;
    size_t size_;
};

// Copies n bytes, taking at least the time the emulated link would (rate 0: no floor).
void timed_copy(void* dst, const void* src, size_t n, double bytes_per_second) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, n);
    if (bytes_per_second > 0.0) {
        std::this_thread::sleep_until(t0 + std::chrono::duration<double>(static_cast<double>(n) / bytes_per_second));
    }
}

// A node as the CPU kernels see it (host memory, no views), copied so that it can be computed later
// whatever happens to the graph's tensors meanwhile.
struct NodeCopy {
    Tensor node;
    Tensor srcs[kMaxSrc];
};

NodeCopy host_view_of(const Tensor& n) {
    NodeCopy c;
    c.node = n;
    for (int i = 0; i < kMaxSrc; ++i) {
        if (n.src[i] == nullptr) continue;
        c.srcs[i] = *n.src[i];
        c.srcs[i].buffer = nullptr;
        c.srcs[i].view_src = nullptr;
        c.node.src[i] = nullptr;  // pointed at c.srcs[i] where it is computed (c moves until then)
    }
    c.node.buffer = nullptr;
    c.node.view_src = nullptr;
    return c;
}

}  // namespace

EmulatedDeviceBackend::EmulatedDeviceBackend(int n_threads, const BackendConfig& config, int ordinal)
    : kernels_(n_threads),
      ordinal_(ordinal),
      vram_(static_cast<size_t>(config.emulated_vram)),
      upload_bytes_per_second_(config.emulated_pcie_gbps * 1e9) {
    if (config.emulated_async) streams_ = std::make_unique<AsyncStreams>();
}

EmulatedDeviceBackend::~EmulatedDeviceBackend() = default;  // the streams finish their tasks first

StatusOr<std::unique_ptr<Buffer>> EmulatedDeviceBackend::alloc_buffer(size_t size) {
    return EmulatedDeviceBuffer::allocate(this, ordinal_, vram_, size);
}

StatusOr<std::unique_ptr<Buffer>> EmulatedDeviceBackend::alloc_host_buffer(size_t size) {
    return HostBuffer::allocate(this, size);
}

StatusOr<std::unique_ptr<Buffer>> EmulatedDeviceBackend::register_host(void* p, size_t n, bool read_only) {
    (void)read_only;  // the pages are only read either way
    const size_t page = host_page_size();
    if (p == nullptr || n == 0 || reinterpret_cast<uintptr_t>(p) % page != 0 || n % page != 0) {
        return invalid_argument("emulated device: register_host of " + std::to_string(n) +
                                " bytes: the range must be non-empty and page-aligned");
    }
    // Locking faults every page in (and so counts it in the process's resident set), as pinning does.
    const auto lock = [page](void* q, size_t m) {
        const volatile uint8_t* bytes = static_cast<const uint8_t*>(q);
        uint8_t sink = 0;
        for (size_t off = 0; off < m; off += page) sink ^= bytes[off];
        (void)sink;
        return Status::ok();
    };
    return HostRegistry::of("emulated").acquire(this, p, n, lock, [](void*, size_t) {});
}

size_t EmulatedDeviceBackend::free_memory() const {
    return emulated_meter(ordinal_).free_bytes(emulated_free(ordinal_, vram_));
}

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
    auto copies = std::make_shared<std::vector<NodeCopy>>();
    copies->reserve(nodes.size());  // the copies point into themselves: no reallocation
    for (const Tensor* node : nodes) {
        copies->push_back(host_view_of(*node));
        for (int i = 0; i < kMaxSrc; ++i) {
            if (node->src[i] != nullptr) copies->back().node.src[i] = &copies->back().srcs[i];
        }
    }
    auto run = [this, copies]() -> Status {
        for (NodeCopy& c : *copies) {
            Tensor* one = &c.node;
            MOE_RETURN_IF_ERROR(kernels_.compute(std::span<Tensor* const>(&one, 1)));
        }
        return Status::ok();
    };
    if (!streams_) return run();
    streams_->compute(std::move(run));
    return Status::ok();
}

Status EmulatedDeviceBackend::copy_to_device(void* dst, const void* src_host, size_t n) {
    if (n == 0) return Status::ok();
    if (dst == nullptr || src_host == nullptr) return invalid_argument("copy_to_device: null pointer");
    if (!streams_) {
        std::memcpy(dst, src_host, n);
        return Status::ok();
    }
    streams_->compute([dst, src_host, n] {
        std::memcpy(dst, src_host, n);
        return Status::ok();
    });
    return Status::ok();
}

Status EmulatedDeviceBackend::copy_to_host(void* dst_host, const void* src, size_t n) {
    return copy_to_device(dst_host, src, n);  // the same in-order memcpy (on the compute stream)
}

Status EmulatedDeviceBackend::copy_from_peer(void* dst, Backend& peer, const void* src, size_t n) {
    if (dynamic_cast<EmulatedDeviceBackend*>(&peer) == nullptr) {
        return invalid_argument(std::string("copy_from_peer: the peer is a ") + peer.name() + " backend, not emulated");
    }
    MOE_RETURN_IF_ERROR(peer.synchronize());           // after the compute that produced src
    MOE_RETURN_IF_ERROR(copy_to_device(dst, src, n));  // before the compute queued here after it
    return synchronize();                              // before the peer's next compute overwrites src
}

Status EmulatedDeviceBackend::synchronize() { return streams_ ? streams_->synchronize() : Status::ok(); }

StatusOr<uint64_t> EmulatedDeviceBackend::mark_compute() {
    if (!streams_) return uint64_t{0};
    return streams_->mark();
}

Status EmulatedDeviceBackend::upload(void* dst, const void* src_host, size_t n, uint64_t after) {
    if (n == 0) return Status::ok();
    if (dst == nullptr || src_host == nullptr) return invalid_argument("upload: null pointer");
    if (streams_ && after > streams_->last_fence()) {
        return invalid_argument("upload: fence " + std::to_string(after) + " was never marked");
    }
    const double rate = upload_bytes_per_second_;
    // The links' shares, as the CUDA backend's (core/upload_share.h): the own link's piece on copy stream
    // 0, relay r's on copy stream r + 1.
    for (const UploadPiece& p : links_.share(n)) {
        if (p.link > 0) relayed_bytes_ += p.bytes;
        void* d = static_cast<uint8_t*>(dst) + p.offset;
        const void* src = static_cast<const uint8_t*>(src_host) + p.offset;
        if (!streams_) {
            timed_copy(d, src, p.bytes, rate);
            continue;
        }
        streams_->upload([d, src, b = p.bytes, rate] { timed_copy(d, src, b, rate); }, after, p.link);
    }
    // Pageable memory: the copy is staged while the caller waits, as CUDA's driver stages it.
    if (streams_ && !HostRegistry::of("emulated").contains(src_host, n)) streams_->wait_uploads();
    return Status::ok();
}

StatusOr<bool> EmulatedDeviceBackend::add_upload_relay(Backend& partner, bool measure) {
    const auto* other = dynamic_cast<const EmulatedDeviceBackend*>(&partner);
    if (other == nullptr || other->ordinal_ == ordinal_ || measure) return false;
    if (std::find(relays_.begin(), relays_.end(), other->ordinal_) != relays_.end()) return true;
    if (streams_) {
        const int stream = streams_->add_copy_stream();
        MOE_ASSERT(stream == static_cast<int>(relays_.size()) + 1);
    }
    relays_.push_back(other->ordinal_);
    links_ = LinkShares(relays_.size() + 1);
    return true;
}

Status EmulatedDeviceBackend::order_after_uploads() {
    if (streams_) streams_->order_after_uploads();
    return Status::ok();
}

Status EmulatedDeviceBackend::read_now(void* dst_host, const void* src, size_t n) {
    MOE_RETURN_IF_ERROR(copy_to_host(dst_host, src, n));
    if (!streams_) return Status::ok();
    return streams_->wait_fence(streams_->mark());
}

Status EmulatedDeviceBackend::wait_fence(uint64_t fence) {
    if (!streams_ || fence == 0) return Status::ok();
    if (fence > streams_->last_fence()) return invalid_argument("wait_fence: fence " + std::to_string(fence) + " was never marked");
    return streams_->wait_fence(fence);
}

// The refusal of the device that backend option emulated_busy names, as CUDA's of a GPU another process
// holds in exclusive-process mode (cudaErrorDevicesUnavailable); ok for the others.
Status busy_check(const BackendOptions& o) {
    if (o.device != o.config.emulated_busy) return Status::ok();
    return failed_precondition("emulated device " + std::to_string(o.device) +
                               " is busy or unavailable (backend option emulated_busy)");
}

void register_emulated_backend() {
    BackendFactory f{
        "emulated",
        [] { return kEmulatedDevices; },
        [](const BackendOptions& o) -> StatusOr<std::unique_ptr<Backend>> {
            if (o.device < 0 || o.device >= kEmulatedDevices) {
                return failed_precondition("emulated device " + std::to_string(o.device) + " is not available (" +
                                           std::to_string(kEmulatedDevices) + " device(s) found)");
            }
            MOE_RETURN_IF_ERROR(busy_check(o));
            return std::unique_ptr<Backend>(
                std::make_unique<EmulatedDeviceBackend>(o.n_threads, o.config, o.device));
        },
    };
    // What EmulatedDeviceBackend::free_memory says for the card, without making one.
    f.free_memory = [](const BackendOptions& o) -> StatusOr<uint64_t> {
        if (o.device < 0 || o.device >= kEmulatedDevices) {
            return failed_precondition("emulated device " + std::to_string(o.device) + " is not available");
        }
        MOE_RETURN_IF_ERROR(busy_check(o));
        const size_t vram = static_cast<size_t>(o.config.emulated_vram);
        return uint64_t{emulated_meter(o.device).free_bytes(emulated_free(o.device, vram))};
    };
    register_backend_factory(std::move(f));
}

}  // namespace moe::cpu
