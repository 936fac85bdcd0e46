#include "cpu/emulated_streams.h"

#include <algorithm>
#include <chrono>

namespace moe::cpu {

AsyncStreams::AsyncStreams() : rng_(std::random_device{}()) {
    compute_.worker = std::thread([this] { run(compute_); });
    (void)add_copy_stream();
}

int AsyncStreams::add_copy_stream() {
    std::lock_guard<std::mutex> l(mu_);
    Stream& s = copies_.emplace_back();
    s.worker = std::thread([this, &s] { run(s); });
    return static_cast<int>(copies_.size()) - 1;
}

std::vector<uint64_t> AsyncStreams::uploads_queued() const {
    std::vector<uint64_t> q;
    for (const Stream& s : copies_) q.push_back(s.queued);
    return q;
}

bool AsyncStreams::uploads_done(const std::vector<uint64_t>& queued) const {
    for (size_t i = 0; i < queued.size(); ++i) {
        if (copies_[i].done < queued[i]) return false;
    }
    return true;
}

AsyncStreams::~AsyncStreams() {
    {
        std::lock_guard<std::mutex> l(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    compute_.worker.join();
    for (Stream& s : copies_) s.worker.join();
}

void AsyncStreams::run(Stream& s) {
    for (;;) {
        std::function<void()> task;
        int delay_us = 0;
        {
            std::unique_lock<std::mutex> l(mu_);
            cv_.wait(l, [&] { return stop_ || !s.tasks.empty(); });
            if (s.tasks.empty()) return;  // stopping, and drained
            task = std::move(s.tasks.front());
            s.tasks.pop_front();
            delay_us = std::uniform_int_distribution<int>(0, 200)(rng_);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        task();
        {
            std::lock_guard<std::mutex> l(mu_);
            ++s.done;
        }
        cv_.notify_all();
    }
}

void AsyncStreams::push(Stream& s, std::function<void()> task) {
    {
        std::lock_guard<std::mutex> l(mu_);
        s.tasks.push_back(std::move(task));
        ++s.queued;
    }
    cv_.notify_all();
}

void AsyncStreams::compute(std::function<Status()> task) {
    push(compute_, [this, task = std::move(task)] {
        const Status s = task();
        if (!s.is_ok()) {
            std::lock_guard<std::mutex> l(mu_);
            if (error_.is_ok()) error_ = s;
        }
    });
}

void AsyncStreams::order_after_uploads() {
    std::vector<uint64_t> uploads;
    {
        std::lock_guard<std::mutex> l(mu_);
        uploads = uploads_queued();
    }
    push(compute_, [this, uploads] {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return uploads_done(uploads); });
    });
}

uint64_t AsyncStreams::mark() {
    uint64_t f = 0;
    {
        std::lock_guard<std::mutex> l(mu_);
        f = next_fence_++;
    }
    push(compute_, [this, f] {
        std::lock_guard<std::mutex> l(mu_);
        fence_done_ = std::max(fence_done_, f);
    });
    return f;
}

uint64_t AsyncStreams::last_fence() const {
    std::lock_guard<std::mutex> l(mu_);
    return next_fence_ - 1;
}

void AsyncStreams::upload(std::function<void()> copy, uint64_t after, int stream) {
    Stream* s = nullptr;
    {
        std::lock_guard<std::mutex> l(mu_);
        s = &copies_.at(static_cast<size_t>(stream));
    }
    push(*s, [this, after, copy = std::move(copy)] {
        {
            std::unique_lock<std::mutex> l(mu_);
            cv_.wait(l, [&] { return fence_done_ >= after; });
        }
        copy();
    });
}

void AsyncStreams::wait_uploads() {
    std::unique_lock<std::mutex> l(mu_);
    const std::vector<uint64_t> queued = uploads_queued();
    cv_.wait(l, [&] { return uploads_done(queued); });
}

Status AsyncStreams::take_error() {
    Status e = error_;
    error_ = Status::ok();
    return e;
}

Status AsyncStreams::wait_fence(uint64_t f) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return fence_done_ >= f; });
    return take_error();
}

Status AsyncStreams::synchronize() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return compute_.done == compute_.queued && uploads_done(uploads_queued()); });
    return take_error();
}

}  // namespace moe::cpu
