#include "core/task_arenas.h"

#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "core/status.h"

namespace moe {
namespace {

struct Pool {
    std::mutex mu;
    std::map<int, std::vector<std::unique_ptr<tbb::task_arena>>> idle;  // guarded by mu
    std::map<int, int> created;                                        // guarded by mu
};

// Never destroyed: see task_arenas.h (Lifetime). Reachable from here, so leak checkers do not count it.
Pool& pool() {
    static Pool* p = new Pool;
    return *p;
}

}  // namespace

TaskArenaLease::TaskArenaLease(int n_threads) : n_threads_(n_threads) {
    MOE_ASSERT(n_threads >= 1);
    Pool& p = pool();
    {
        std::lock_guard<std::mutex> lock(p.mu);
        std::vector<std::unique_ptr<tbb::task_arena>>& idle = p.idle[n_threads];
        if (!idle.empty()) {
            arena_ = std::move(idle.back());
            idle.pop_back();
            return;
        }
        ++p.created[n_threads];
    }
    // oneTBB initialises the arena lazily, on its first use.
    arena_ = std::make_unique<tbb::task_arena>(n_threads);
}

TaskArenaLease::~TaskArenaLease() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    try {
        p.idle[n_threads_].push_back(std::move(arena_));
    } catch (const std::bad_alloc&) {
        // No memory to keep it: the arena is destroyed with this lease instead (push_back left it here).
        --p.created[n_threads_];
    }
}

int TaskArenaLease::pooled(int n_threads) {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.created.find(n_threads);
    return it == p.created.end() ? 0 : it->second;
}

}  // namespace moe
