#include "cuda/graph_runner.h"

#include <algorithm>

namespace moe::cuda {

GraphRunner::~GraphRunner() {
    // An executable still in flight is freed by CUDA once it completes.
    for (auto& [key, e] : entries_) {
        if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
    }
}

GraphRunner::Plan& GraphRunner::plan_for(uint64_t identity, size_t n) {
    auto it = plans_.find(identity);
    if (it == plans_.end() && plans_.size() >= kMaxPlans) {
        auto oldest = std::min_element(plans_.begin(), plans_.end(),
                                       [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
        plans_.erase(oldest);
    }
    if (it == plans_.end()) it = plans_.emplace(identity, Plan{}).first;
    Plan& p = it->second;
    if (p.last.size() != n) {  // new (or an identity collision): nothing learned yet
        p.last.clear();
        p.quiet.assign(n, kQuietRuns);
    }
    p.used = tick_;
    return p;
}

GraphRunner::Entry& GraphRunner::insert(uint64_t key) {
    if (entries_.size() >= kMaxEntries) {
        auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                       [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
        if (oldest->second.exec != nullptr) cudaGraphExecDestroy(oldest->second.exec);
        entries_.erase(oldest);
    }
    return entries_[key];
}

Status GraphRunner::eager(size_t a, size_t b) {
    stats_.eager_nodes += b - a;
    for (size_t i = a; i < b; ++i) MOE_RETURN_IF_ERROR(launch_(i));
    return Status::ok();
}

cudaGraph_t GraphRunner::capture(size_t a, size_t b) {
    // Relaxed: the launch paths make non-stream calls (cudaFuncSetAttribute before large-shared-memory
    // kernels) that stricter modes may refuse; nothing in them allocates or synchronises.
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    bool ok = true;
    for (size_t i = a; i < b; ++i) {
        if (!launch_(i).is_ok()) {  // the eager rerun reports it
            ok = false;
            break;
        }
    }
    cudaGraph_t g = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &g);  // always: the stream must leave capture mode
    if (!ok || end != cudaSuccess || g == nullptr) {
        if (g != nullptr) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return nullptr;
    }
    return g;
}

bool GraphRunner::run_chunk(uint64_t key, size_t a, size_t b, std::span<const uint64_t> state,
                            std::span<const uint64_t> words) {
    auto same_words = [&](const Entry& e) {
        return e.words.size() == state.size() + words.size() &&
               std::equal(state.begin(), state.end(), e.words.begin()) &&
               std::equal(words.begin(), words.end(), e.words.begin() + static_cast<std::ptrdiff_t>(state.size()));
    };
    auto it = entries_.find(key);
    Entry* e = it == entries_.end() ? nullptr : &it->second;
    if (e != nullptr && same_words(*e)) {
        e->used = tick_;
        if (e->uncapturable) return false;
        if (cudaGraphLaunch(e->exec, stream_) == cudaSuccess) {
            ++stats_.replays;
            return true;
        }
        (void)cudaGetLastError();
        ++stats_.failures;
        cudaGraphExecDestroy(e->exec);
        entries_.erase(key);
        return false;
    }

    auto remember = [&](Entry& entry, bool uncapturable) {
        entry.words.assign(state.begin(), state.end());
        entry.words.insert(entry.words.end(), words.begin(), words.end());
        entry.uncapturable = uncapturable;
        entry.used = tick_;
    };
    cudaGraph_t g = capture(a, b);
    if (g == nullptr) {
        ++stats_.failures;
        Entry& f = e != nullptr ? *e : insert(key);
        if (f.exec != nullptr) cudaGraphExecDestroy(f.exec);
        f.exec = nullptr;
        remember(f, true);
        return false;
    }
    bool updated = false;
    if (e != nullptr && e->exec != nullptr) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(e->exec, g, &info) == cudaSuccess) {
            updated = true;
            ++stats_.updates;
        } else {  // another topology: instantiate anew
            (void)cudaGetLastError();
            cudaGraphExecDestroy(e->exec);
            e->exec = nullptr;
        }
    }
    if (e == nullptr) e = &insert(key);
    if (!updated) {
        if (cudaGraphInstantiate(&e->exec, g, 0) != cudaSuccess) {
            (void)cudaGetLastError();
            ++stats_.failures;
            e->exec = nullptr;
            remember(*e, true);
            cudaGraphDestroy(g);
            return false;
        }
        ++stats_.instantiations;
    }
    cudaGraphDestroy(g);  // the executable does not need it
    remember(*e, false);
    if (cudaGraphLaunch(e->exec, stream_) != cudaSuccess) {
        (void)cudaGetLastError();
        ++stats_.failures;
        cudaGraphExecDestroy(e->exec);
        entries_.erase(key);
        return false;
    }
    return true;
}

Status GraphRunner::run(std::span<Tensor* const> nodes, std::span<const uint64_t> state,
                        std::span<const NodeExtra> extra) {
    ++tick_;
    sig_.build(nodes, extra);
    const size_t n = nodes.size();
    const uint64_t identity = sig_.identity();
    Plan& plan = plan_for(identity, n);
    if (!plan.last.empty()) {
        for (size_t i = 0; i < n; ++i) {
            uint8_t& q = plan.quiet[i];
            q = plan.last[i] != sig_.node_hash(i) ? 0 : static_cast<uint8_t>(std::min<int>(q + 1, kQuietRuns));
        }
    }
    plan.last.resize(n);
    for (size_t i = 0; i < n; ++i) plan.last[i] = sig_.node_hash(i);

    bool merge = merge_ == Merge::kAlways;
    if (merge_ == Merge::kWhenDeviceBusy) {
        const cudaError_t q = cudaStreamQuery(stream_);
        merge = q == cudaErrorNotReady;
        if (q != cudaSuccess && q != cudaErrorNotReady) (void)cudaGetLastError();  // reported at synchronize
    }
    stats_.merged_spans += merge;
    // Merged: chunks of equal lengths (no short one at the end), each at most kMaxChunk.
    const size_t n_chunks = (n + kMaxChunk - 1) / kMaxChunk;
    const size_t longest = merge && n_chunks > 0 ? (n + n_chunks - 1) / n_chunks : kMaxChunk;
    for (size_t a = 0; a < n;) {
        const bool vol = !merge && plan.is_volatile(a);
        size_t b = a + 1;
        while (b < n && (merge || plan.is_volatile(b) == vol) && b - a < longest) ++b;
        const bool use_graph = b - a >= (vol ? kMinVolatileGraph : kMinGraph);
        const uint64_t key = hash_combine(hash_combine(identity, a), b);
        if (!use_graph || !run_chunk(key, a, b, state, sig_.words(a, b))) MOE_RETURN_IF_ERROR(eager(a, b));
        a = b;
    }
    return Status::ok();
}

}  // namespace moe::cuda
