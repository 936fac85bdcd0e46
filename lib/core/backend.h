// The backend interface: device -> buffer -> compute/copy. The scheduler (lib/sched) and the runtime
// drive backends only through this; backends answer questions and compute, they never decide placement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace moe {

class Backend;

// A block of backend memory. Host buffers are plain (or pinned) host memory; device buffers hold
// device pointers that only their backend may dereference.
class Buffer {
public:
    virtual ~Buffer() = default;
    virtual void* data() = 0;
    virtual size_t size() const = 0;
    virtual bool is_host() const = 0;  // data() is host-addressable
    Backend* backend() const { return backend_; }

protected:
    explicit Buffer(Backend* backend) : backend_(backend) {}

private:
    Backend* backend_;
};

// n bytes of a backend's memory at src.
struct DeviceRegion {
    const void* src = nullptr;
    size_t n = 0;
};

class Backend {
public:
    virtual ~Backend() = default;

    virtual const char* name() const = 0;
    // Host backends compute on host-addressable memory (the CPU backend, and the host-memory backend
    // that plays the device in scheduler tests).
    virtual bool is_host() const = 0;
    // Whether this backend can compute `node` with its srcs' types and shapes.
    virtual bool supports_op(const Tensor& node) const = 0;

    // Memory of this backend (device memory for devices). RESOURCE_EXHAUSTED when it cannot.
    virtual StatusOr<std::unique_ptr<Buffer>> alloc_buffer(size_t size) = 0;

    // Computes `nodes` in order. REQUIRES: every node's data and its srcs' data are allocated in
    // memory this backend can address, and supports_op() holds for each node.
    virtual Status compute(std::span<Tensor* const> nodes) = 0;

    // Queues a copy of n bytes from host memory into this backend's memory, ordered after the
    // compute queued before it and before the compute queued after it (in the compute order, not
    // behind queued uploads). src must stay valid until synchronize() or a later fence. Host backends
    // copy at once.
    virtual Status copy_to_device(void* dst, const void* src_host, size_t n) = 0;
    // Queues a copy of n bytes of this backend's memory to host memory, in the compute order; in place
    // after synchronize() or after waiting for a fence marked after it.
    virtual Status copy_to_host(void* dst_host, const void* src, size_t n) = 0;
    // copy_to_host of `regions` back to back into dst_host, in the compute order. Devices gather them
    // first, so that many small regions (a decode step's expert ids, one per layer) cost one transfer.
    virtual Status gather_to_host(void* dst_host, std::span<const DeviceRegion> regions) {
        size_t offset = 0;
        for (const DeviceRegion& r : regions) {
            MOE_RETURN_IF_ERROR(copy_to_host(static_cast<uint8_t*>(dst_host) + offset, r.src, r.n));
            offset += r.n;
        }
        return Status::ok();
    }

    // Waits until all work queued on this backend has finished.
    virtual Status synchronize() = 0;
    // Whether a caller computing a long run of nodes should hand it over in two compute() calls, the
    // first ending at `node`, so that the device starts while the rest is prepared: true only where the
    // backend loses nothing by the cut (no fused launch crosses it).
    virtual bool cut_after(const Tensor& node) const {
        (void)node;
        return false;
    }

    // --- What the hybrid scheduler needs beyond the above (defaults fit host backends) ---

    // Host memory this backend copies from and to fastest (pinned for CUDA); is_host() buffers.
    virtual StatusOr<std::unique_ptr<Buffer>> alloc_host_buffer(size_t size) = 0;
    // Page-locks host memory the caller owns, in place, so that uploads from it are as fast as from
    // alloc_host_buffer memory (a model's weights used from the file mapping instead of a copy):
    // a host buffer over [p, p + n) that unlocks the range when destroyed (the memory stays the
    // caller's). read_only: the range is mapped read-only (and is only ever read). Registrations are
    // shared per process: the same range registered by two contexts is locked once. An error leaves the
    // range as it was, usable as pageable memory (upload() stages such copies). REQUIRES: p and n are
    // page-aligned (host_registry.h: page_align); the buffer is destroyed before this backend and
    // before the memory is unmapped. Default: UNIMPLEMENTED (backends that copy as fast from any memory).
    virtual StatusOr<std::unique_ptr<Buffer>> register_host(void* p, size_t n, bool read_only) {
        (void)p;
        (void)n;
        (void)read_only;
        return unimplemented(std::string(name()) + " backend: register_host");
    }
    // Device memory free now, in bytes; 0 for host backends (no device memory to budget).
    virtual size_t free_memory() const { return 0; }

    // A fence marks the compute queued so far; 0 is "no fence" (host backends compute at once).
    virtual StatusOr<uint64_t> mark_compute() { return uint64_t{0}; }
    // Queues a copy of n bytes from host memory into this backend's memory that waits only for the
    // compute before fence `after` (0: for nothing), not for all compute queued so far, so uploads can
    // run ahead of compute. Compute waits for it only once order_after_uploads() is called (so an
    // upload for later work does not hold up the compute and copies queued before that work). The
    // caller guarantees that nothing queued after fence `after` reads or writes dst. src_host must
    // stay valid and unchanged until synchronize(). Host backends copy at once. src_host may be
    // pageable (not from alloc_host_buffer or register_host): a device then stages the copy, which is
    // slower and may block until the copy stream reaches it (CUDA's driver does so for cudaMemcpyAsync).
    virtual Status upload(void* dst, const void* src_host, size_t n, uint64_t after) {
        (void)after;
        return copy_to_device(dst, src_host, n);
    }
    // Compute (and activation copies) queued from now on wait for every upload queued so far.
    virtual Status order_after_uploads() { return Status::ok(); }
    // Waits until the compute and copies queued before fence `fence` have finished (not what was queued
    // after it, nor uploads); 0 returns at once.
    virtual Status wait_fence(uint64_t fence) {
        if (fence == 0) return Status::ok();
        return synchronize();
    }
    // Copies n bytes of this backend's memory to host memory and returns once they are in place,
    // waiting only for the compute queued so far (not for queued uploads).
    virtual Status read_now(void* dst_host, const void* src, size_t n) {
        MOE_RETURN_IF_ERROR(copy_to_host(dst_host, src, n));
        return synchronize();
    }

    // --- Several devices of one kind in one host (a context's layer split) ---

    // Lets copy_from_peer read `peer`'s memory directly (CUDA: peer access over NVLink or PCIe), where
    // the two devices can: true once enabled (idempotent, shared per process), false where they cannot
    // (the caller then stages the bytes through host memory). Default: false.
    virtual StatusOr<bool> enable_peer_access(Backend& peer) {
        (void)peer;
        return false;
    }
    // Queues a copy of n bytes of `peer`'s memory at src into this backend's memory at dst, after the
    // compute queued on `peer` so far and before the compute queued here after the call; compute queued
    // on `peer` after the call (which may overwrite src) waits for it too. REQUIRES: enable_peer_access
    // (peer) returned true. Default: UNIMPLEMENTED.
    virtual Status copy_from_peer(void* dst, Backend& peer, const void* src, size_t n) {
        (void)dst;
        (void)src;
        (void)n;
        return unimplemented(std::string(name()) + " backend: copy_from_peer (from " + peer.name() + ")");
    }
    // Lets upload() send part of each large copy through `partner`'s host link: host memory to a staging
    // slot on the partner, then to this device by peer copy, so that one upload runs over both links at
    // once (core/upload_share.h decides the shares). Worth it where the peer link is much faster than a
    // host link (NVLink); `measure`: only where it measures at least twice the host link (false: wherever
    // the two have peer access). true once set up, false where it is not (the default: no relays).
    // The ordering rules of upload() hold for the relayed bytes too.
    virtual StatusOr<bool> add_upload_relay(Backend& partner, bool measure) {
        (void)partner;
        (void)measure;
        return false;
    }
    // Bytes of upload()s sent through relays since creation.
    virtual uint64_t relayed_bytes() const { return 0; }
};

}  // namespace moe
