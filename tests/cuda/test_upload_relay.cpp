// Upload relays (CudaBackend::add_upload_relay, cuda/upload_relay.h): a GPU's uploads sent partly through a
// second GPU's host link and the peer link. [gpu][multi] (skipped visibly with fewer than 2 GPUs, or without
// peer access between them): the bytes that arrive equal the host's, for page-locked and pageable sources,
// sizes that are not whole slots, uploads that wait for a compute fence over the region they overwrite, and
// many uploads queued back to back (the relay's slots reused); the relayed share is what share_upload gives.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/upload_share.h"
#if MOEINFER_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#endif

TEST_CASE("an upload relay delivers the host's bytes through the other GPU", "[gpu][multi]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: needs 2 CUDA devices (this build has no CUDA backend)");
#else
    using moe::test::require_ok;
    const int gpus = moe::cuda::device_count();
    if (gpus < 2) {
        WARN((gpus == 0 ? std::string("skipped: no CUDA device") : "skipped: needs 2 CUDA devices (1 found)"));
        return;
    }
    int can = 0;
    REQUIRE(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess);
    if (!can) {
        WARN("skipped: GPUs 0 and 1 have no peer access");
        return;
    }
    auto b0 = moe::cuda::CudaBackend::create(0);
    auto b1 = moe::cuda::CudaBackend::create(1);
    require_ok(b0.status());
    require_ok(b1.status());
    moe::Backend& dev = **b0;
    // Measured: whether it pays here (NVLink) is the machine's; said, not required.
    moe::StatusOr<bool> measured = dev.add_upload_relay(**b1, true);
    require_ok(measured.status());
    WARN("upload relay GPU 0 <- GPU 1 " << (*measured ? "pays" : "does not pay") << " here (measured)");
    moe::StatusOr<bool> on = dev.add_upload_relay(**b1, false);
    require_ok(on.status());
    REQUIRE(*on);

    std::mt19937_64 rng = moe::test::fresh_rng(41);
    constexpr size_t kMax = size_t{48} << 20;
    auto pinned = dev.alloc_host_buffer(kMax);
    require_ok(pinned.status());
    auto* host = static_cast<uint8_t*>((*pinned)->data());
    std::vector<uint8_t> pageable(kMax);
    for (size_t i = 0; i < kMax; i += 8) {
        const uint64_t r = rng();
        std::memcpy(host + i, &r, 8);
        const uint64_t q = rng();
        std::memcpy(pageable.data() + i, &q, 8);
    }
    auto target = dev.alloc_buffer(kMax);
    require_ok(target.status());
    auto* d = static_cast<uint8_t*>((*target)->data());
    std::vector<uint8_t> back(kMax);
    // The links' shares as the backend counts them (LinkShares), replayed here to predict the relay's bytes.
    moe::LinkShares shares(2);
    uint64_t predicted = 0;
    const auto upload = [&](size_t offset, const uint8_t* src, size_t n, uint64_t after) {
        for (const moe::UploadPiece& p : shares.share(n)) {
            if (p.link > 0) predicted += p.bytes;
        }
        require_ok(dev.upload(d + offset, src, n, after));
    };
    const auto check = [&](size_t offset, const uint8_t* want, size_t n) {
        require_ok(dev.order_after_uploads());
        require_ok(dev.copy_to_host(back.data(), d + offset, n));
        require_ok(dev.synchronize());
        REQUIRE(std::memcmp(back.data(), want, n) == 0);
    };
    // Sizes around the share's limits and the slots, from page-locked and pageable memory.
    for (const size_t n : {size_t{1} << 19, (size_t{3} << 20) + 5, (size_t{17} << 20) + 123, kMax}) {
        for (const bool locked : {true, false}) {
            INFO(n << " bytes, " << (locked ? "page-locked" : "pageable"));
            const size_t offset = n == kMax ? 0 : (rng() % (kMax - n)) & ~size_t{255};
            const uint8_t* src = (locked ? host : pageable.data()) + offset;
            upload(offset, src, n, 0);
            check(offset, src, n);
        }
    }
    // Back to back without waiting: 24 uploads of 6 MiB + 1 into consecutive regions (the relay's 4 slots
    // reused many times over), one check at the end.
    {
        constexpr size_t kPiece = (size_t{6} << 20) + 1;
        for (size_t k = 0; k < 7; ++k) upload(k * kPiece, host + k * kPiece, kPiece, 0);
        check(0, host, 7 * kPiece);
    }
    // After a compute fence: the region is zeroed on the compute stream (a copy queued there), a fence
    // marked, and the upload told to wait for it; the upload's bytes must be what stays.
    for (int rep = 0; rep < 4; ++rep) {
        const size_t n = size_t{24} << 20;
        std::vector<uint8_t> zeros(n, 0);
        require_ok(dev.copy_to_device(d, zeros.data(), n));
        auto fence = dev.mark_compute();
        require_ok(fence.status());
        upload(0, pageable.data() + rep, n, *fence);
        check(0, pageable.data() + rep, n);
    }
    CHECK(dev.relayed_bytes() == predicted);
    CHECK(predicted > 0);
    // Torn down in either order: the relay's slots are on GPU 1, its copies waited for by GPU 0's backend.
    b1->reset();
    b0->reset();
#endif
}
