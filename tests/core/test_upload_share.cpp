// share_upload (core/upload_share.h): how an upload is cut between a device's own host link and the links
// of the devices relaying for it. Checked against a water-filling level found by bisection in long double
// (an independent computation of the same rule), on random sizes and link histories; and over a run of
// uploads, that the links' totals stay within the stated bound of each other.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/upload_share.h"

using moe::LinkShares;
using moe::share_upload;
using moe::UploadPiece;
using moe::UploadShareLimits;

namespace {

// The level L with sum max(0, L - sent[l]) = n, by bisection.
long double level_by_bisection(uint64_t n, const std::vector<uint64_t>& sent) {
    long double lo = 0, hi = static_cast<long double>(*std::max_element(sent.begin(), sent.end())) + n;
    for (int i = 0; i < 200; ++i) {
        const long double mid = (lo + hi) / 2;
        long double filled = 0;
        for (uint64_t s : sent) filled += std::max<long double>(0, mid - s);
        (filled < n ? lo : hi) = mid;
    }
    return (lo + hi) / 2;
}

// Checks the pieces' layout and returns the bytes per link.
std::vector<size_t> check_layout(const std::vector<UploadPiece>& pieces, size_t n, size_t links,
                                 const UploadShareLimits& lim) {
    std::vector<size_t> per_link(links, 0);
    size_t at = 0;
    int last_link = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const UploadPiece& p = pieces[i];
        REQUIRE(p.offset == at);
        REQUIRE(p.bytes > 0);
        REQUIRE(p.link >= 0);
        REQUIRE(static_cast<size_t>(p.link) < links);
        if (p.link == 0) CHECK(i == 0);  // the own link's one piece comes first
        else CHECK(p.bytes <= lim.chunk);
        CHECK(p.link >= last_link);  // each relay's pieces together, in relay order
        last_link = p.link;
        per_link[static_cast<size_t>(p.link)] += p.bytes;
        at += p.bytes;
    }
    REQUIRE(at == n);
    return per_link;
}

}  // namespace

TEST_CASE("share_upload fills the links to one level", "[core][upload_share]") {
    std::mt19937_64 rng(std::random_device{}());
    const UploadShareLimits lim;
    for (int trial = 0; trial < 2000; ++trial) {
        const size_t links = 1 + rng() % 4;
        std::vector<uint64_t> sent(links);
        for (uint64_t& s : sent) s = rng() % 3 == 0 ? 0 : rng() % (uint64_t{2} << 30);
        const size_t n = rng() % 4 == 0 ? rng() % (2 << 20) : rng() % (size_t{512} << 20);
        const std::vector<UploadPiece> pieces = share_upload(n, sent, lim);
        const std::vector<size_t> got = check_layout(pieces, n, links, lim);
        if (links == 1 || n < lim.min_share) {
            CHECK(got[0] == n);
            continue;
        }
        const long double level = level_by_bisection(n, sent);
        for (size_t l = 1; l < links; ++l) {
            INFO("trial " << trial << " link " << l << " sent " << sent[l] << " n " << n);
            const long double want = std::max<long double>(0, level - sent[l]);
            CHECK(got[l] % lim.grain == 0);
            CHECK((got[l] == 0 || got[l] >= lim.min_share));
            CHECK(static_cast<long double>(got[l]) <= want + 1);
            // Rounded down by less than a grain (one more at an exact grain boundary of the level),
            // unless what was left is below min_share.
            if (want >= lim.min_share + 2 * lim.grain) CHECK(static_cast<long double>(got[l]) > want - 2 * lim.grain);
            else if (want < lim.min_share) CHECK(got[l] == 0);
        }
    }
}

TEST_CASE("share_upload keeps the links' totals together over a run of uploads", "[core][upload_share]") {
    std::mt19937_64 rng(std::random_device{}());
    UploadShareLimits lim;
    lim.chunk = 4 << 20;
    for (size_t links : {2u, 3u}) {
        std::vector<uint64_t> sent(links, 0);
        for (int i = 0; i < 300; ++i) {
            const size_t n = (4 << 20) + rng() % (size_t{256} << 20);
            const std::vector<size_t> got = check_layout(share_upload(n, sent, lim), n, links, lim);
            for (size_t l = 0; l < links; ++l) sent[l] += got[l];
            const auto [lo, hi] = std::minmax_element(sent.begin(), sent.end());
            INFO("links " << links << " upload " << i);
            // Relays stop short of the level by under min_share + a grain; the own link passes it by
            // under a grain per relay.
            CHECK(*hi - *lo < lim.min_share + lim.grain * links);
        }
    }
}

TEST_CASE("share_upload leaves small uploads and lone devices to the own link", "[core][upload_share]") {
    const std::vector<uint64_t> two = {0, 0};
    const std::vector<UploadPiece> small = share_upload(size_t{1} << 19, two);
    REQUIRE(small.size() == 1);
    CHECK(small[0].link == 0);
    CHECK(small[0].bytes == size_t{1} << 19);
    CHECK(share_upload(0, two).empty());
    const std::vector<uint64_t> one = {0};
    const std::vector<UploadPiece> alone = share_upload(size_t{1} << 30, one);
    REQUIRE(alone.size() == 1);
    CHECK(alone[0].bytes == size_t{1} << 30);
    // A relay far behind takes the whole upload, in chunks.
    const std::vector<uint64_t> behind = {uint64_t{1} << 32, 0};
    const std::vector<UploadPiece> all_relayed = share_upload(size_t{64} << 20, behind);
    REQUIRE(all_relayed.size() == 8);
    for (const UploadPiece& p : all_relayed) CHECK(p.link == 1);
}

TEST_CASE("LinkShares forgets what one link carried alone beyond a few slots", "[core][upload_share]") {
    // Uploads under min_share go over the own link only; after many of them a large upload is still shared
    // (the relay owes at most the window, 4 chunks), not sent whole through the relay.
    const UploadShareLimits lim;
    const uint64_t window = 4 * uint64_t{lim.chunk};
    std::mt19937_64 rng(std::random_device{}());
    for (size_t links : {2u, 3u}) {
        LinkShares shares(links);
        for (int i = 0; i < 2000; ++i) {
            const size_t small = (size_t{9} << 20) / 10;  // 0.9 MiB
            const std::vector<UploadPiece> p = shares.share(small);
            REQUIRE(p.size() == 1);
            CHECK(p[0].link == 0);
        }
        const size_t n = size_t{64} << 20;
        const std::vector<size_t> got = check_layout(shares.share(n), n, links, lim);
        // The level over counts at most `window` apart: each relay takes at most (n + window) / links.
        for (size_t l = 1; l < links; ++l) {
            INFO("links " << links << " relay " << l);
            CHECK(got[l] <= (n + window) / links + lim.grain);
            CHECK(got[l] > 0);
        }
        if (links == 2) CHECK(got[0] >= n / 4);  // 64 MiB against a 32 MiB lead: at least 16 MiB stays
        // And at any time the counts stay within the window of each other.
        for (int i = 0; i < 500; ++i) {
            const size_t m = rng() % 3 == 0 ? rng() % (1 << 20) : rng() % (size_t{128} << 20);
            (void)check_layout(shares.share(m), m, links, lim);
            const auto [lo, hi] = std::minmax_element(shares.sent().begin(), shares.sent().end());
            CHECK(*hi - *lo <= window);
        }
    }
}
