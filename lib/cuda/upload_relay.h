// An upload relay: bytes bound for one GPU's memory sent over another GPU's host link. The partner GPU
// copies them from host memory into a staging slot of its own (its PCIe link), then pushes them to the
// destination by peer copy (NVLink), so that an upload runs over two host links at once
// (CudaBackend::add_upload_relay; core/upload_share.h decides each link's share).
//
// Streams and slots are on the partner GPU: an H2D stream filling the slots and a push stream emptying
// them, each slot reused once its push is done (events: from page-locked memory the host never waits).
// The relay belongs to the receiving backend, which orders its compute after the pushes (order) and never
// frees what a queued push reads or writes before synchronize.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/status.h"

namespace moe::cuda {

class UploadRelay {
public:
    // Staging on `partner` for uploads into `device`: `slots` slots of `slot_bytes`. owner: the backend of
    // `device`, which holds the relay. REQUIRES: the two GPUs have peer access both ways
    // (CudaBackend::enable_peer_access).
    static StatusOr<std::unique_ptr<UploadRelay>> create(Backend* owner, int device, int partner, size_t slot_bytes,
                                                         int slots);
    ~UploadRelay();
    UploadRelay(const UploadRelay&) = delete;
    UploadRelay& operator=(const UploadRelay&) = delete;

    // Queues n bytes from host memory at src to device memory at dst (on `device`), in pieces of at most
    // slot_bytes; the pushes into dst wait for `after` (an event of the receiving GPU, or nullptr), the
    // copies from the host for nothing but a free slot. src stays valid until synchronize().
    Status send(void* dst, const void* src, size_t n, cudaEvent_t after);
    // Makes `stream` (of the receiving GPU) wait for every push queued so far.
    Status order(cudaStream_t stream);
    // Waits for every copy queued so far.
    Status synchronize();
    // The rates of the two legs in bytes per second, each the best of three copies of one slot's bytes:
    // host (page-locked) to the partner, and the partner to the device. For deciding whether a relay
    // pays. REQUIRES: nothing queued.
    struct Rates {
        double host = 0.0;
        double peer = 0.0;
    };
    StatusOr<Rates> measure();

    int partner() const { return partner_; }
    size_t slot_bytes() const { return slot_bytes_; }

private:
    UploadRelay(Backend* owner, int device, int partner) : owner_(owner), device_(device), partner_(partner) {}

    Backend* owner_;  // the receiving backend: its buffers' owner
    int device_;
    int partner_;
    size_t slot_bytes_ = 0;
    std::unique_ptr<Buffer> staging_;  // slots, on the partner
    cudaStream_t h2d_ = nullptr;       // host to slots (the partner's link)
    cudaStream_t push_ = nullptr;      // slots to the device (the peer link)
    std::vector<cudaEvent_t> loaded_;  // per slot: its bytes arrived from the host
    std::vector<cudaEvent_t> freed_;   // per slot: pushed on, reusable
    cudaEvent_t pushed_ = nullptr;     // after the last push queued
    size_t next_slot_ = 0;
    bool pending_ = false;  // pushes queued since the last order()
};

}  // namespace moe::cuda
