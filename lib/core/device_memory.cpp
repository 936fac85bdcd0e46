#include "core/device_memory.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace moe {

DeviceMemoryMeter& DeviceMemoryMeter::of(std::string_view backend) {
    static std::mutex registry_mu;
    static std::map<std::string, std::unique_ptr<DeviceMemoryMeter>, std::less<>> meters;
    const std::lock_guard<std::mutex> lock(registry_mu);
    auto it = meters.find(backend);
    if (it == meters.end()) it = meters.emplace(std::string(backend), std::make_unique<DeviceMemoryMeter>()).first;
    return *it->second;
}

Status DeviceMemoryMeter::acquire(size_t n, size_t device_free, std::string_view backend) {
    const std::lock_guard<std::mutex> lock(mu_);
    const size_t left = limit_ == kNoLimit ? device_free : std::min(device_free, limit_ > live_ ? limit_ - live_ : 0);
    if (recording_) recorded_.push_back(n);
    const bool injected = fail_countdown_ != 0 && --fail_countdown_ == 0;
    if (injected || (limit_ != kNoLimit && n > left)) {
        ++n_refused_;
        return device_exhausted(backend, n, left);
    }
    live_ += n;
    return Status::ok();
}

void DeviceMemoryMeter::release(size_t n) {
    const std::lock_guard<std::mutex> lock(mu_);
    MOE_ASSERT(n <= live_);
    live_ -= n;
}

size_t DeviceMemoryMeter::live_bytes() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return live_;
}

size_t DeviceMemoryMeter::free_bytes(size_t device_free) const {
    const std::lock_guard<std::mutex> lock(mu_);
    if (limit_ == kNoLimit) return device_free;
    return std::min(device_free, limit_ > live_ ? limit_ - live_ : 0);
}

void DeviceMemoryMeter::set_limit(size_t total) {
    const std::lock_guard<std::mutex> lock(mu_);
    limit_ = total;
}

void DeviceMemoryMeter::fail_nth(uint64_t k) {
    const std::lock_guard<std::mutex> lock(mu_);
    fail_countdown_ = k;
}

void DeviceMemoryMeter::clear_hooks() {
    const std::lock_guard<std::mutex> lock(mu_);
    limit_ = kNoLimit;
    fail_countdown_ = 0;
}

void DeviceMemoryMeter::start_recording() {
    const std::lock_guard<std::mutex> lock(mu_);
    recording_ = true;
    recorded_.clear();
}

std::vector<size_t> DeviceMemoryMeter::stop_recording() {
    const std::lock_guard<std::mutex> lock(mu_);
    recording_ = false;
    return std::exchange(recorded_, {});
}

uint64_t DeviceMemoryMeter::n_refused() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return n_refused_;
}

void DeviceMemoryMeter::note_refused() {
    const std::lock_guard<std::mutex> lock(mu_);
    ++n_refused_;
}

Status device_exhausted(std::string_view backend, size_t n, size_t free) {
    return resource_exhausted(std::string(backend) + ": cannot allocate " + std::to_string(n) +
                              " bytes of device memory (" + std::to_string(free) + " bytes free)");
}

}  // namespace moe
