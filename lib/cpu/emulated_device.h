// A host-memory backend that plays a device, so the hybrid scheduler is tested without a GPU: its
// buffers are not host-addressable as far as anyone else knows (is_host() is false), data moves in
// and out only through its copies, and compute refuses operands outside its own buffers. It computes
// with the CPU kernels, so its results equal the CPU backend's bit for bit.
//
// With emulated_async=on (backend options, core/backend_config.h; or MOEINFER_EMULATED_ASYNC=1) it also
// behaves like a GPU in time: compute and activation copies run in order on a "compute stream" thread
// and weight uploads on a "copy stream" thread, each task after a random delay, with fences and the
// CUDA backend's ordering rules (an upload waits for its fence, compute queued after an upload waits
// for it). A scheduler that reads or reuses memory before the copy or compute it depends on has
// finished then gets wrong logits.
//
// Host memory registered with it (register_host) is page-locked as far as the uploads know; uploads from
// other host memory are pageable and behave like CUDA's: they return only once the bytes are copied.
//
// It plays up to kEmulatedDevices devices (BackendOptions::device, the ordinal): each ordinal is a card of
// its own, with its own memory (emulated_vram bytes each, read at creation) and meter ("emulated" for card 0,
// "emulatedN" for card N), and each backend its own streams, so contexts over several devices are
// tested without GPUs.
//
// With emulated_pcie_gbps=<GB/s> (or MOEINFER_EMULATED_PCIE_GBPS) weight uploads take as long as they would
// over a link of that bandwidth (the copy sleeps for the rest), so that the expert split's cost model,
// which times an upload, sees a device worth splitting for.
//
// Upload relays (upload_relay=on in a context over several emulated devices): part of each large upload
// goes over another copy stream, the partner's link, as CUDA's relay through another GPU does.
#pragma once

#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/backend_config.h"
#include "core/upload_share.h"
#include "cpu/cpu_backend.h"

namespace moe::cpu {

class AsyncStreams;  // emulated_streams.h

// The devices the emulated backend plays (ordinals 0 .. kEmulatedDevices - 1).
constexpr int kEmulatedDevices = 8;

class EmulatedDeviceBackend final : public Backend {
public:
    // config: emulated_async, emulated_pcie_gbps and emulated_vram (core/backend_config.h).
    EmulatedDeviceBackend(int n_threads, const BackendConfig& config, int ordinal = 0);
    ~EmulatedDeviceBackend() override;

    const char* name() const override { return "emulated"; }
    bool is_host() const override { return false; }
    bool supports_op(const Tensor& node) const override { return kernels_.supports_op(node); }
    StatusOr<std::unique_ptr<Buffer>> alloc_buffer(size_t size) override;
    StatusOr<std::unique_ptr<Buffer>> alloc_host_buffer(size_t size) override;
    // Like cudaHostRegister: faults the pages in, and counts the range in the process's "emulated"
    // HostRegistry (whose test hook refuses registrations). Uploads from memory outside registered
    // ranges are pageable: with the asynchronous streams they block until copied, as CUDA's staged
    // copies do.
    StatusOr<std::unique_ptr<Buffer>> register_host(void* p, size_t n, bool read_only) override;
    size_t free_memory() const override;
    Status compute(std::span<Tensor* const> nodes) override;
    Status copy_to_device(void* dst, const void* src_host, size_t n) override;
    Status copy_to_host(void* dst_host, const void* src, size_t n) override;
    Status synchronize() override;
    StatusOr<uint64_t> mark_compute() override;
    Status upload(void* dst, const void* src_host, size_t n, uint64_t after) override;
    Status read_now(void* dst_host, const void* src, size_t n) override;
    Status wait_fence(uint64_t fence) override;
    Status order_after_uploads() override;
    // Emulated devices have no peer access (enable_peer_access keeps the default, false: contexts stage
    // what crosses between them through host memory), but the copy itself works between two of them, so
    // that tests drive a context's peer path without GPUs. Waits for the peer's queued compute, and
    // returns once the bytes are in place.
    Status copy_from_peer(void* dst, Backend& peer, const void* src, size_t n) override;
    // An emulated relay, for tests of the relay's share and ordering without GPUs: another emulated device
    // (upload_relay=on; `measure`, upload_relay=auto, finds no peer link to measure and sets none up).
    // Its share of each upload (core/upload_share.h) is copied by a copy stream of its own, at
    // emulated_pcie_gbps too, so two links carry at once; with the synchronous streams, at once.
    StatusOr<bool> add_upload_relay(Backend& partner, bool measure) override;
    uint64_t relayed_bytes() const override { return relayed_bytes_; }

private:
    Status check_own_memory(const Tensor& node) const;

    CpuBackend kernels_;
    int ordinal_;
    size_t vram_;  // the card's size
    std::unique_ptr<AsyncStreams> streams_;  // null: synchronous
    double upload_bytes_per_second_ = 0.0;    // 0: as fast as memcpy
    // Upload relays: the partners' ordinals; the bytes each link carried lately ([0] its own, [1 + r]
    // relay r, whose copy stream is r + 1).
    std::vector<int> relays_;
    LinkShares links_;
    uint64_t relayed_bytes_ = 0;
};

// Registers "emulated" in the backend registry (called by the generated backends_init.cpp).
void register_emulated_backend();

}  // namespace moe::cpu
