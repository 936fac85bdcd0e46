// How one upload is shared between a device's own host link and the host links of other devices that
// relay for it (Backend::add_upload_relay: host memory to the other device over its PCIe link, then to
// this device over the peer link, NVLink). Each link's share evens out the bytes the links have carried,
// so that, over an ubatch's uploads, they all stay busy and finish together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace moe {

struct UploadPiece {
    size_t offset = 0;  // into the upload
    size_t bytes = 0;
    int link = 0;  // 0: the device's own link; r > 0: relay r - 1
};

// Where a relay stops cutting: shares below min_share go to the own link (a relayed copy costs a peer
// copy and two waits more than a direct one), and each relayed piece fits one staging slot.
struct UploadShareLimits {
    size_t grain = 64 << 10;     // relay shares are whole multiples of this
    size_t min_share = 1 << 20;  // smaller relay shares are left to the own link
    size_t chunk = 8 << 20;      // a relayed piece at most this (the relay's staging slot)
};

// The pieces of an upload of n bytes over sent.size() links, sent[l] the bytes link l carried so far:
// the links' shares fill them up to one level (water-filling: a link already above the level gets
// nothing), each relay's share rounded down to limits.grain and dropped below limits.min_share, the
// own link taking the rest. Pieces cover [0, n) once, in order: the own link's (one piece, none for
// 0 bytes), then each relay's, cut into pieces of at most limits.chunk. REQUIRES: sent is not empty.
std::vector<UploadPiece> share_upload(size_t n, std::span<const uint64_t> sent, const UploadShareLimits& limits = {});

// The bytes a device's links carried, as share_upload reads them, with a short memory: no link is counted
// more than `window` bytes behind the busiest, so uploads that went over one link alone (those under
// min_share) do not leave the others owing for long (the links even out over the last few uploads, not
// since the device's creation).
class LinkShares {
public:
    explicit LinkShares(size_t links = 1, const UploadShareLimits& limits = {})
        : sent_(links, 0), limits_(limits), window_(4 * uint64_t{limits.chunk}) {}
    // The pieces of an upload of n bytes (share_upload over the counts), counted.
    std::vector<UploadPiece> share(size_t n);
    size_t links() const { return sent_.size(); }
    std::span<const uint64_t> sent() const { return sent_; }

private:
    std::vector<uint64_t> sent_;
    UploadShareLimits limits_;
    uint64_t window_;
};

}  // namespace moe
