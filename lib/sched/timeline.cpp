#include "sched/timeline.h"

namespace moe::sched {

namespace {

UbatchTiming counters(const Stats& s) {
    UbatchTiming t;
    t.seconds_host_compute = s.seconds_host_compute;
    t.seconds_device_submit = s.seconds_device_submit;
    t.seconds_wait = s.seconds_wait;
    t.bytes_weights = s.bytes_weights_full + s.bytes_weights_experts;
    t.bytes_activations = s.bytes_activations;
    return t;
}

}  // namespace

void Timeline::enable(size_t capacity) {
    capacity_ = capacity;
    origin_ = Clock::now();
    ring_.clear();
    ring_.shrink_to_fit();
    ring_.reserve(capacity);  // no allocation while running
    next_ = 0;
    n_recorded_ = 0;
}

void Timeline::begin(const Stats& s, Clock::time_point t_start) {
    open_ = counters(s);
    open_.t_start = std::chrono::duration<double>(t_start - origin_).count();
}

void Timeline::end(const Stats& s, int n_tokens, bool ok) {
    const UbatchTiming now = counters(s);
    UbatchTiming r = open_;
    r.n_tokens = n_tokens;
    r.ok = ok;
    r.t_end = seconds_since(origin_);
    r.seconds_host_compute = now.seconds_host_compute - open_.seconds_host_compute;
    r.seconds_device_submit = now.seconds_device_submit - open_.seconds_device_submit;
    r.seconds_wait = now.seconds_wait - open_.seconds_wait;
    // reset_stats between begin and end cannot happen (both run inside one Scheduler::run).
    r.bytes_weights = now.bytes_weights - open_.bytes_weights;
    r.bytes_activations = now.bytes_activations - open_.bytes_activations;
    if (ring_.size() < capacity_) {
        ring_.push_back(r);
    } else {
        ring_[next_] = r;
        next_ = (next_ + 1) % capacity_;
    }
    ++n_recorded_;
}

std::vector<UbatchTiming> Timeline::records() const {
    std::vector<UbatchTiming> out;
    out.reserve(ring_.size());
    for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
    return out;
}

}  // namespace moe::sched
