#include "core/upload_share.h"

#include <algorithm>

namespace moe {

namespace {

// The level L with sum over links of max(0, L - sent[l]) = n (the links below it filled up to it).
double fill_level(double n, std::span<const uint64_t> sent) {
    std::vector<double> s(sent.begin(), sent.end());
    std::sort(s.begin(), s.end());
    double below = 0.0;  // sum of the k lowest
    for (size_t k = 1; k <= s.size(); ++k) {
        below += s[k - 1];
        // With the k lowest links filled: level = (n + their sum) / k, valid if it stays below the next.
        const double level = (n + below) / static_cast<double>(k);
        if (k == s.size() || level <= s[k]) return level;
    }
    return 0.0;  // unreachable: the loop returns at k == size
}

}  // namespace

std::vector<UploadPiece> share_upload(size_t n, std::span<const uint64_t> sent, const UploadShareLimits& limits) {
    std::vector<size_t> share(sent.size(), 0);
    size_t relayed = 0;
    if (sent.size() > 1 && n >= limits.min_share) {
        const double level = fill_level(static_cast<double>(n), sent);
        for (size_t l = 1; l < sent.size(); ++l) {
            const double want = std::max(0.0, level - static_cast<double>(sent[l]));
            size_t s = static_cast<size_t>(want) / limits.grain * limits.grain;
            s = std::min(s, n - relayed);
            if (s < limits.min_share) continue;
            share[l] = s;
            relayed += s;
        }
    }
    std::vector<UploadPiece> pieces;
    size_t at = 0;
    if (n - relayed > 0) {
        pieces.push_back({0, n - relayed, 0});
        at = n - relayed;
    }
    for (size_t l = 1; l < share.size(); ++l) {
        for (size_t done = 0; done < share[l];) {
            const size_t b = std::min(limits.chunk, share[l] - done);
            pieces.push_back({at, b, static_cast<int>(l)});
            at += b;
            done += b;
        }
    }
    return pieces;
}

std::vector<UploadPiece> LinkShares::share(size_t n) {
    std::vector<UploadPiece> pieces = share_upload(n, sent_, limits_);
    for (const UploadPiece& p : pieces) sent_[static_cast<size_t>(p.link)] += p.bytes;
    const uint64_t top = *std::max_element(sent_.begin(), sent_.end());
    for (uint64_t& s : sent_) s = std::max(s, top > window_ ? top - window_ : uint64_t{0});
    return pieces;
}

}  // namespace moe
