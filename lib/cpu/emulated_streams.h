// In-order task queues with worker threads: the emulated device's "compute stream" and its "copy
// streams", the first its own link, more for upload relays (see emulated_device.h). Tasks run after a
// random delay of up to 200 us so that work the host does not wait for finishes late.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/status.h"

namespace moe::cpu {

class AsyncStreams {
public:
    AsyncStreams();
    ~AsyncStreams();  // finishes every queued task
    AsyncStreams(const AsyncStreams&) = delete;
    AsyncStreams& operator=(const AsyncStreams&) = delete;

    // Queues work on the compute stream, after every compute task queued before it.
    void compute(std::function<Status()> task);
    // Work queued on the compute stream from now on waits for every upload queued so far (every copy
    // stream's).
    void order_after_uploads();
    // Marks the compute queued so far; the fence completes when the compute stream reaches it.
    uint64_t mark();
    // Adds a copy stream (an upload relay's link); returns its index (the first, 0, is there from the start).
    int add_copy_stream();
    // Queues an upload on copy stream `stream` that starts once fence `after` has completed.
    void upload(std::function<void()> copy, uint64_t after, int stream = 0);
    // Waits until every upload queued so far has been copied (not for compute queued after them).
    void wait_uploads();
    // Waits for fence f (0: returns at once); the first error of any task since the last report.
    Status wait_fence(uint64_t f);
    // Waits until both streams are idle; the first error of any task since the last report.
    Status synchronize();
    uint64_t last_fence() const;

private:
    struct Stream {
        std::deque<std::function<void()>> tasks;
        std::thread worker;
        uint64_t queued = 0, done = 0;
    };
    void run(Stream& s);
    bool uploads_done(const std::vector<uint64_t>& queued) const;  // REQUIRES: mu_ held
    std::vector<uint64_t> uploads_queued() const;                  // REQUIRES: mu_ held
    void push(Stream& s, std::function<void()> task);
    Status take_error();

    mutable std::mutex mu_;
    std::condition_variable cv_;
    Stream compute_;
    std::deque<Stream> copies_;  // deque: a stream's address stays while more are added
    uint64_t next_fence_ = 1, fence_done_ = 0;
    bool stop_ = false;
    Status error_ = Status::ok();
    std::mt19937 rng_;
};

}  // namespace moe::cpu
