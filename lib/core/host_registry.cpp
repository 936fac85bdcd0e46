#include "core/host_registry.h"

#include <unistd.h>

#include <iterator>
#include <map>
#include <string>

namespace moe {

// The registry's share of a range: a host buffer that lets go of it when destroyed.
class HostRegistry::Held final : public Buffer {
public:
    Held(Backend* backend, HostRegistry* registry, void* p, size_t n)
        : Buffer(backend), registry_(registry), p_(p), n_(n) {}
    ~Held() override { registry_->release(p_); }
    void* data() override { return p_; }
    size_t size() const override { return n_; }
    bool is_host() const override { return true; }

private:
    HostRegistry* registry_;
    void* p_;
    size_t n_;
};

HostRegistry& HostRegistry::of(std::string_view backend) {
    static std::mutex mu;
    static auto* registries = new std::map<std::string, std::unique_ptr<HostRegistry>, std::less<>>();  // never freed
    std::lock_guard<std::mutex> guard(mu);
    auto it = registries->find(backend);
    if (it == registries->end()) it = registries->emplace(std::string(backend), std::make_unique<HostRegistry>()).first;
    return *it->second;
}

StatusOr<std::unique_ptr<Buffer>> HostRegistry::acquire(Backend* backend, void* p, size_t n, const Lock& lock,
                                                        const Unlock& unlock) {
    if (p == nullptr || n == 0) return invalid_argument("register_host: an empty range");
    const auto begin = reinterpret_cast<uintptr_t>(p);
    // Under the lock throughout: a second context must not lock the range while the first still does.
    std::lock_guard<std::mutex> guard(mu_);
    auto next = ranges_.lower_bound(begin);
    if (next != ranges_.end() && next->first == begin && next->second.n == n) {
        ++next->second.holders;
        return std::unique_ptr<Buffer>(new Held(backend, this, p, n));
    }
    const bool overlaps_next = next != ranges_.end() && next->first < begin + n;
    const bool overlaps_prev = next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second.n > begin;
    if (overlaps_next || overlaps_prev) {
        return failed_precondition("register_host: " + std::to_string(n) +
                                   " bytes overlap a range another context registered differently");
    }
    if (refuse_) return resource_exhausted("register_host: refused by the test hook");
    MOE_RETURN_IF_ERROR(lock(p, n));
    ranges_[begin] = Range{n, 1, unlock};
    return std::unique_ptr<Buffer>(new Held(backend, this, p, n));
}

void HostRegistry::release(void* p) {
    std::lock_guard<std::mutex> guard(mu_);
    auto it = ranges_.find(reinterpret_cast<uintptr_t>(p));
    if (it == ranges_.end() || --it->second.holders > 0) return;
    it->second.unlock(p, it->second.n);
    ranges_.erase(it);
}

bool HostRegistry::contains(const void* p, size_t n) const {
    const auto begin = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> guard(mu_);
    auto it = ranges_.upper_bound(begin);
    if (it == ranges_.begin()) return false;
    --it;
    return begin + n <= it->first + it->second.n;
}

size_t HostRegistry::n_ranges() const {
    std::lock_guard<std::mutex> guard(mu_);
    return ranges_.size();
}

void HostRegistry::set_refuse(bool on) {
    std::lock_guard<std::mutex> guard(mu_);
    refuse_ = on;
}

size_t host_page_size() {
    static const size_t page = [] {
        const long v = ::sysconf(_SC_PAGESIZE);
        return v > 0 ? static_cast<size_t>(v) : size_t{4096};
    }();
    return page;
}

void page_align(const void* p, size_t n, uintptr_t* begin, uintptr_t* end) {
    const uintptr_t page = host_page_size();
    const auto a = reinterpret_cast<uintptr_t>(p);
    *begin = a & ~(page - 1);
    *end = (a + n + page - 1) & ~(page - 1);
}

}  // namespace moe
