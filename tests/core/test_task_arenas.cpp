// The process-wide task-arena pool: leases of a thread count reuse idle arenas (so creating and freeing
// contexts in a loop creates no new oneTBB arena), concurrent holders never share one, and the arenas
// run work with the thread count asked for. The pool is process-wide and other tests lease from it too,
// so counts are compared before and after, with thread counts no backend in the suite uses.
#include <catch2/catch.hpp>

#include <tbb/parallel_for.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/task_arenas.h"

using moe::TaskArenaLease;

TEST_CASE("task arena leases are reused, one arena per holder", "[core][task_arenas]") {
    constexpr int kThreads = 7;
    const int before = TaskArenaLease::pooled(kThreads);
    tbb::task_arena* first = nullptr;
    {
        TaskArenaLease a(kThreads);
        first = &a.arena();
        CHECK(a.n_threads() == kThreads);
        CHECK(a.arena().max_concurrency() == kThreads);
        std::atomic<int> sum{0};
        a.arena().execute([&] { tbb::parallel_for(0, 1000, [&](int i) { sum += i; }); });
        CHECK(sum == 999 * 1000 / 2);
    }
    const int after_one = TaskArenaLease::pooled(kThreads);
    CHECK(after_one <= before + 1);
    for (int i = 0; i < 100; ++i) {
        TaskArenaLease again(kThreads);
        again.arena().execute([] { tbb::parallel_for(0, 64, [](int) {}); });
    }
    CHECK(TaskArenaLease::pooled(kThreads) == after_one);  // no arena created after the first

    // Held at the same time: distinct arenas; given back, both are kept for the next holders.
    {
        TaskArenaLease a(kThreads), b(kThreads);
        CHECK(&a.arena() != &b.arena());
        CHECK((&a.arena() == first || &b.arena() == first));  // the idle one was reused
    }
    const int after_two = TaskArenaLease::pooled(kThreads);
    CHECK(after_two <= before + 2);
    { TaskArenaLease a(kThreads), b(kThreads); }
    CHECK(TaskArenaLease::pooled(kThreads) == after_two);
}

TEST_CASE("task arena leases from many threads at once", "[core][task_arenas]") {
    constexpr int kThreads = 5, kHolders = 8, kRounds = 200;
    const int before = TaskArenaLease::pooled(kThreads);
    std::vector<std::thread> holders;
    std::atomic<int> wrong{0};
    for (int h = 0; h < kHolders; ++h) {
        holders.emplace_back([&] {
            for (int r = 0; r < kRounds; ++r) {
                TaskArenaLease lease(kThreads);
                std::atomic<int> n{0};
                lease.arena().execute([&] { tbb::parallel_for(0, 100, [&](int) { ++n; }); });
                if (n != 100 || lease.arena().max_concurrency() != kThreads) ++wrong;
            }
        });
    }
    for (std::thread& t : holders) t.join();
    CHECK(wrong == 0);
    // Never more arenas than holders at once, however many leases there were.
    CHECK(TaskArenaLease::pooled(kThreads) - before <= kHolders);
}
