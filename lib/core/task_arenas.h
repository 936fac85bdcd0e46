// Process-wide reuse of oneTBB task arenas. Creating and destroying a tbb::task_arena costs memory
// that oneTBB does not give back (about 7 KB per arena of 2 threads, 18 KB of 8, measured with
// oneTBB 2021.8), so a program that creates and frees contexts in a loop grew without bound while
// each context owned its own arena. Instead a context's backends lease arenas from one pool, keyed
// by thread count, and give them back when freed: the pool holds at most as many arenas of a count
// as were ever leased at once, and the next lease reuses one.
//
// Lifetime: the pool is created on first use and never destroyed, so that a lease may be returned
// at any time, even from a static destructor at exit; idle arenas live until the process ends.
// Thread safety: leasing and returning are safe from any thread. A leased arena belongs to its
// holder alone, as an owned one would (two holders never share an arena's threads).
#pragma once

#include <tbb/task_arena.h>

#include <memory>

namespace moe {

class TaskArenaLease {
public:
    // An arena of exactly n_threads threads (the caller's included), idle or new.
    // REQUIRES: n_threads >= 1 (the C API caps it at MOE_MAX_THREADS).
    explicit TaskArenaLease(int n_threads);
    ~TaskArenaLease();  // gives the arena back to the pool
    TaskArenaLease(const TaskArenaLease&) = delete;
    TaskArenaLease& operator=(const TaskArenaLease&) = delete;

    tbb::task_arena& arena() { return *arena_; }
    int n_threads() const { return n_threads_; }

    // Arenas of n_threads threads the pool holds, leased or idle (for tests).
    static int pooled(int n_threads);

private:
    int n_threads_;
    std::unique_ptr<tbb::task_arena> arena_;
};

}  // namespace moe
