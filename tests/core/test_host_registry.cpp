// HostRegistry (the process's page-locked ranges of one backend kind) against a log of the lock and
// unlock calls it makes: a range is locked once however many holders share it, unlocked when the last
// one lets go, and a range overlapping a held one differently is refused without locking anything.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "core/host_registry.h"

namespace {

struct Log {
    std::vector<std::pair<void*, size_t>> locked, unlocked;
};

moe::StatusOr<std::unique_ptr<moe::Buffer>> acquire(moe::HostRegistry& r, Log& log, void* p, size_t n) {
    return r.acquire(
        nullptr, p, n,
        [&log](void* q, size_t m) {
            log.locked.emplace_back(q, m);
            return moe::Status::ok();
        },
        [&log](void* q, size_t m) { log.unlocked.emplace_back(q, m); });
}

}  // namespace

TEST_CASE("HostRegistry shares a range, refuses overlaps and unlocks at the last holder", "[core]") {
    moe::HostRegistry r;
    Log log;
    std::vector<uint8_t> mem(1 << 16);
    uint8_t* base = mem.data();

    auto a = acquire(r, log, base, 4096);
    REQUIRE(a.is_ok());
    CHECK(a.value()->is_host());
    CHECK(a.value()->data() == base);
    CHECK(a.value()->size() == 4096);
    auto b = acquire(r, log, base, 4096);  // a second context: shared, not locked again
    REQUIRE(b.is_ok());
    CHECK(log.locked.size() == 1);
    CHECK(r.n_ranges() == 1);
    CHECK(r.contains(base + 100, 3996));
    CHECK_FALSE(r.contains(base + 100, 3997));
    CHECK_FALSE(r.contains(base + 4096, 1));

    // Overlapping differently (a context with another placement): refused, nothing locked.
    for (auto [off, n] : {std::pair<size_t, size_t>{0, 8192}, {2048, 4096}, {0, 2048}}) {
        auto c = acquire(r, log, base + off, n);
        CHECK(c.status().code() == MOE_STATUS_FAILED_PRECONDITION);
    }
    CHECK(log.locked.size() == 1);
    auto d = acquire(r, log, base + 4096, 4096);  // adjacent: its own range
    REQUIRE(d.is_ok());
    CHECK(log.locked.size() == 2);

    a.value().reset();
    CHECK(log.unlocked.empty());  // b still holds it
    b.value().reset();
    REQUIRE(log.unlocked.size() == 1);
    CHECK(log.unlocked[0] == std::make_pair(static_cast<void*>(base), size_t{4096}));
    CHECK(r.n_ranges() == 1);
    d.value().reset();
    CHECK(r.n_ranges() == 0);
    CHECK(log.unlocked.size() == 2);
}

TEST_CASE("HostRegistry's test hook refuses new ranges and a lock error is passed on", "[core]") {
    moe::HostRegistry r;
    Log log;
    std::vector<uint8_t> mem(1 << 14);
    auto held = acquire(r, log, mem.data(), 4096);
    REQUIRE(held.is_ok());
    r.set_refuse(true);
    CHECK(acquire(r, log, mem.data() + 8192, 4096).status().code() == MOE_STATUS_RESOURCE_EXHAUSTED);
    CHECK(acquire(r, log, mem.data(), 4096).is_ok());  // a held range is still shared
    r.set_refuse(false);
    CHECK(log.locked.size() == 1);

    const auto failing = r.acquire(
        nullptr, mem.data() + 8192, 4096, [](void*, size_t) { return moe::io_error("cannot lock"); },
        [](void*, size_t) { FAIL("unlock of a range never locked"); });
    CHECK(failing.status().code() == MOE_STATUS_IO_ERROR);
    CHECK(r.n_ranges() == 1);
}

TEST_CASE("page_align widens a range to the pages it touches", "[core]") {
    const size_t page = moe::host_page_size();
    REQUIRE(page >= 4096);
    REQUIRE((page & (page - 1)) == 0);
    uintptr_t b = 0, e = 0;
    const auto at = [](uintptr_t x) { return reinterpret_cast<const void*>(x); };
    moe::page_align(at(10 * page + 1), page, &b, &e);
    CHECK(b == 10 * page);
    CHECK(e == 12 * page);
    moe::page_align(at(10 * page), page, &b, &e);
    CHECK(b == 10 * page);
    CHECK(e == 11 * page);
    moe::page_align(at(10 * page + 5), 1, &b, &e);
    CHECK(b == 10 * page);
    CHECK(e == 11 * page);
}
