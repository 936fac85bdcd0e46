// moe_measure_bandwidth through the public C API: argument errors (status, message naming the field,
// result untouched), the CPU host read (finite, positive, fields of an older result struct left alone),
// the CUDA path's errors without a device, and, tagged [gpu], the CUDA copies themselves.
#include <catch2/catch.hpp>

#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "moeinfer/moeinfer.h"
#if MOEINFER_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

bool has_gpu() {
#if MOEINFER_HAS_CUDA
    return moe::cuda::device_count() > 0;
#else
    return false;
#endif
}

// Small, fast CPU params.
moe_bandwidth_params small_params() {
    moe_bandwidth_params p;
    moe_bandwidth_params_init(&p);
    p.bytes = 8 * kMiB;
    p.host_bytes = 8 * kMiB;
    p.n_threads = 2;
    p.repetitions = 3;
    return p;
}

void expect_invalid(const moe_bandwidth_params* p, moe_bandwidth_result* r, const char* field) {
    moe_bandwidth_result before;
    if (r != nullptr) std::memcpy(&before, r, sizeof before);
    INFO("field " << field);
    CHECK(moe_measure_bandwidth(p, r) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find(field) != std::string::npos);
    if (r != nullptr) CHECK(std::memcmp(&before, r, sizeof before) == 0);
}

// Threads a request for 2 gets: the cores this process may use, at most 2.
int32_t two_threads_or_fewer() {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return n >= 2 ? 2 : 1;
}

bool finite_positive(double x) { return std::isfinite(x) && x > 0.0; }

}  // namespace

TEST_CASE("moe_bandwidth_params_init fills the documented defaults", "[runtime][bandwidth]") {
    moe_bandwidth_params p;
    std::memset(&p, 0xff, sizeof p);
    moe_bandwidth_params_init(&p);
    CHECK(p.struct_size == sizeof p);
    CHECK(p.device == MOE_DEVICE_CPU);
    CHECK(p.bytes == 1024 * kMiB);
    CHECK(p.host_bytes == 0);
    CHECK(p.n_threads == 0);
    CHECK(p.repetitions == 5);
    moe_bandwidth_params_init(nullptr);
    moe_bandwidth_result_init(nullptr);
}

TEST_CASE("moe_measure_bandwidth rejects bad arguments", "[runtime][bandwidth]") {
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    moe_bandwidth_params p = small_params();
    expect_invalid(&p, nullptr, "out_result");
    moe_bandwidth_result zero_size;
    moe_bandwidth_result_init(&zero_size);
    zero_size.struct_size = 0;
    expect_invalid(&p, &zero_size, "out_result->struct_size");

    const moe_bandwidth_params good = small_params();
    p = good;
    p.struct_size = 2;
    expect_invalid(&p, &r, "params->struct_size");
    p = good;
    p.device = 7;
    expect_invalid(&p, &r, "params->device");
    p = good;
    p.device = -1;
    expect_invalid(&p, &r, "params->device");
    for (uint64_t bytes : {uint64_t{0}, uint64_t{4095}, (uint64_t{1} << 40) + 1}) {
        p = good;
        p.bytes = bytes;
        expect_invalid(&p, &r, "params->bytes");
    }
    for (uint64_t bytes : {uint64_t{1}, uint64_t{4095}, (uint64_t{1} << 40) + 1}) {
        p = good;
        p.host_bytes = bytes;
        expect_invalid(&p, &r, "params->host_bytes");
    }
    for (int32_t n : {-1, 4097}) {
        p = good;
        p.n_threads = n;
        expect_invalid(&p, &r, "params->n_threads");
    }
    for (int32_t reps : {0, -3, 1001}) {
        p = good;
        p.repetitions = reps;
        expect_invalid(&p, &r, "params->repetitions");
    }
}

TEST_CASE("moe_measure_bandwidth measures the host read on the CPU", "[runtime][bandwidth]") {
    const moe_bandwidth_params p = small_params();
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    REQUIRE(moe_measure_bandwidth(&p, &r) == MOE_STATUS_OK);
    CHECK(r.struct_size == sizeof r);
    CHECK(finite_positive(r.host_read));
    CHECK(r.host_read < 1e5);
    CHECK(r.host_bytes == 8 * kMiB);
    CHECK(r.n_threads == two_threads_or_fewer());
    CHECK(r.repetitions == 3);
    // Device fields stay 0 for MOE_DEVICE_CPU.
    CHECK(r.bytes == 0);
    CHECK(r.h2d_pinned == 0.0);
    CHECK(r.h2d_pageable == 0.0);
    CHECK(r.d2h_pinned == 0.0);
    CHECK(r.d2h_pageable == 0.0);

    // n_threads = 0 uses all available cores (at least one).
    moe_bandwidth_params all = p;
    all.n_threads = 0;
    REQUIRE(moe_measure_bandwidth(&all, &r) == MOE_STATUS_OK);
    CHECK(r.n_threads >= 1);
    CHECK(finite_positive(r.host_read));
}

TEST_CASE("moe_measure_bandwidth writes only the fields inside an older result's struct_size",
          "[runtime][bandwidth]") {
    const moe_bandwidth_params p = small_params();
    moe_bandwidth_result r;
    std::memset(&r, 0x7b, sizeof r);
    r.struct_size = static_cast<uint32_t>(offsetof(moe_bandwidth_result, host_read) + sizeof(double));
    REQUIRE(moe_measure_bandwidth(&p, &r) == MOE_STATUS_OK);
    CHECK(r.struct_size == offsetof(moe_bandwidth_result, host_read) + sizeof(double));
    CHECK(finite_positive(r.host_read));
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(&r) + r.struct_size;
    size_t changed = 0;
    for (size_t i = 0; i < sizeof r - r.struct_size; ++i) changed += tail[i] != 0x7b;
    CHECK(changed == 0);
}

// [alloc_fails]: its own ctest entry, where AddressSanitizer lets the allocation fail (tests/CMakeLists.txt).
TEST_CASE("moe_measure_bandwidth reports a host buffer it cannot allocate", "[runtime][bandwidth][alloc_fails]") {
    // 1 TiB: refused outright by the kernel's overcommit check on machines with much less memory.
    // With overcommit_memory = 1 the allocation could succeed and the fill would exhaust memory.
    FILE* f = std::fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = -1;
    if (f != nullptr) {
        if (std::fscanf(f, "%d", &mode) != 1) mode = -1;
        std::fclose(f);
    }
    const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (mode == 1 || mode == -1 || ram > 256.0 * 1024 * kMiB) {
        WARN("skipped: this machine might grant a 1 TiB allocation (overcommit_memory " << mode << ")");
        return;
    }
    moe_bandwidth_params p = small_params();
    p.host_bytes = uint64_t{1} << 40;
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    CHECK(moe_measure_bandwidth(&p, &r) == MOE_STATUS_RESOURCE_EXHAUSTED);
    CHECK(std::string(moe_last_error()).find("host read buffer") != std::string::npos);
}

TEST_CASE("moe_measure_bandwidth for CUDA fails cleanly without a GPU", "[runtime][bandwidth]") {
    if (has_gpu()) return;  // the [gpu] case below measures it
    moe_bandwidth_params p = small_params();
    p.device = MOE_DEVICE_CUDA;
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
#if MOEINFER_HAS_CUDA
    CHECK(moe_measure_bandwidth(&p, &r) == MOE_STATUS_FAILED_PRECONDITION);
    CHECK(std::string(moe_last_error()) == "no cuda device found");
#else
    CHECK(moe_measure_bandwidth(&p, &r) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(std::string(moe_last_error()).find("no cuda backend") != std::string::npos);
#endif
    CHECK(r.host_read == 0.0);  // nothing was written
}

TEST_CASE("moe_measure_bandwidth with MOE_DEVICE_AUTO measures the copies exactly when a GPU is there",
          "[runtime][bandwidth]") {
    moe_bandwidth_params p = small_params();
    p.device = MOE_DEVICE_AUTO;
    p.bytes = 4 * kMiB;
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    INFO(moe_last_error());
    REQUIRE(moe_measure_bandwidth(&p, &r) == MOE_STATUS_OK);
    CHECK(finite_positive(r.host_read));
    if (has_gpu()) {
        CHECK(r.bytes == 4 * kMiB);
        CHECK(finite_positive(r.h2d_pinned));
    } else {
        CHECK(r.bytes == 0);  // a CPU measurement: no copies
        CHECK(r.h2d_pinned == 0.0);
    }
}

TEST_CASE("moe_measure_bandwidth times host<->device copies", "[gpu]") {
    if (!has_gpu()) {
        WARN("skipped: no CUDA device");
        return;
    }
    moe_bandwidth_params p = small_params();
    p.device = MOE_DEVICE_CUDA;
    p.bytes = 32 * kMiB;
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    INFO(moe_last_error());
    REQUIRE(moe_measure_bandwidth(&p, &r) == MOE_STATUS_OK);
    CHECK(r.bytes == 32 * kMiB);
    CHECK(r.host_bytes == 8 * kMiB);
    // Positive, finite, and copies below 1 TB/s (no host link is that fast; more means a timing bug).
    CHECK(finite_positive(r.host_read));
    for (double gbps : {r.h2d_pinned, r.h2d_pageable, r.d2h_pinned, r.d2h_pageable}) {
        CHECK(finite_positive(gbps));
        CHECK(gbps < 1e3);
    }
    std::printf("bandwidth (32 MiB copies, GB/s): h2d pinned %.1f pageable %.1f, d2h pinned %.1f pageable %.1f\n",
                r.h2d_pinned, r.h2d_pageable, r.d2h_pinned, r.d2h_pageable);

    // A device buffer that cannot exist: RESOURCE_EXHAUSTED, and the next measurement still works.
    p.bytes = uint64_t{1} << 40;
    CHECK(moe_measure_bandwidth(&p, &r) == MOE_STATUS_RESOURCE_EXHAUSTED);
    CHECK(std::string(moe_last_error()).find("device memory") != std::string::npos);
    p.bytes = 32 * kMiB;
    CHECK(moe_measure_bandwidth(&p, &r) == MOE_STATUS_OK);
}
