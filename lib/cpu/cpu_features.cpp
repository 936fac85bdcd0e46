#include "cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace moe::cpu {
namespace {

uint64_t read_xcr0() {
    uint32_t eax = 0, edx = 0;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux hands out the 8 KiB of tile data state only to processes that ask (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a tile instruction without it is killed with SIGILL.
// The permission holds for every thread of the process, later ones included.
bool amx_permitted() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}

CpuFeatures detect() {
    CpuFeatures f;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool osxsave = (c >> 27) & 1;
    const bool fma = (c >> 12) & 1;
    const bool f16c = (c >> 29) & 1;
    const bool avx = (c >> 28) & 1;
    if (!osxsave || !avx) return f;
    const uint64_t xcr0 = read_xcr0();
    const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM + YMM state
    const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;        // + opmask, ZMM_Hi256, Hi16_ZMM
    const bool os_amx = (xcr0 & 0x60000) == 0x60000;     // XTILECFG + XTILEDATA
    if (!os_avx) return f;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    const bool avx2 = (b >> 5) & 1;
    f.avx2 = avx2 && fma && f16c;
    const bool avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    f.avx512 = f.avx2 && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl;
    f.avx512_vnni = f.avx512 && ((c >> 11) & 1);
    f.amx = f.avx512 && os_amx && ((d >> 24) & 1) && ((d >> 22) & 1) && amx_permitted();  // AMX-TILE, AMX-BF16
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) f.avx512_bf16 = f.avx512 && ((a1 >> 5) & 1);

    // Optional cap, so every kernel family can be tested on one machine.
    if (const char* cap = std::getenv("MOEINFER_CPU_ISA")) {
        if (std::strcmp(cap, "scalar") == 0) f = CpuFeatures{};
        if (std::strcmp(cap, "avx2") == 0) {
            f.avx512 = f.avx512_vnni = f.avx512_bf16 = f.amx = false;
        }
        if (std::strcmp(cap, "avx512") == 0) f.amx = false;
    }
    return f;
}

// The detected features and their capped variants, indexed by IsaCap.
struct FeatureSets {
    CpuFeatures by_cap[4];
};

const FeatureSets& feature_sets() {
    static const FeatureSets sets = [] {
        FeatureSets s;
        const CpuFeatures f = detect();
        s.by_cap[static_cast<int>(IsaCap::kNone)] = f;
        CpuFeatures avx512 = f;
        avx512.amx = false;
        s.by_cap[static_cast<int>(IsaCap::kAvx512)] = avx512;
        CpuFeatures avx2 = f;
        avx2.avx512 = avx2.avx512_vnni = avx2.avx512_bf16 = avx2.amx = false;
        s.by_cap[static_cast<int>(IsaCap::kAvx2)] = avx2;
        s.by_cap[static_cast<int>(IsaCap::kScalar)] = CpuFeatures{};
        return s;
    }();
    return sets;
}

std::atomic<int> g_isa_cap{static_cast<int>(IsaCap::kNone)};
std::atomic<int> g_bf16_path{static_cast<int>(Bf16Path::kAuto)};
std::atomic<int> g_decoded_tiles{static_cast<int>(DecodedTiles::kInt8)};

}  // namespace

void set_cpu_isa_cap_for_testing(IsaCap cap) { g_isa_cap.store(static_cast<int>(cap), std::memory_order_relaxed); }

void set_bf16_path_for_testing(Bf16Path path) { g_bf16_path.store(static_cast<int>(path), std::memory_order_relaxed); }

Bf16Path bf16_path() { return static_cast<Bf16Path>(g_bf16_path.load(std::memory_order_relaxed)); }

void set_decoded_tiles_for_testing(DecodedTiles tiles) {
    g_decoded_tiles.store(static_cast<int>(tiles), std::memory_order_relaxed);
}

DecodedTiles decoded_tiles() { return static_cast<DecodedTiles>(g_decoded_tiles.load(std::memory_order_relaxed)); }

const CpuFeatures& cpu_features() { return feature_sets().by_cap[g_isa_cap.load(std::memory_order_relaxed)]; }

const char* cpu_isa_name() {
    const CpuFeatures& f = cpu_features();
    if (f.avx512 && f.avx512_vnni && f.avx512_bf16 && f.amx) return "avx512_vnni+bf16+amx";
    if (f.avx512 && f.avx512_vnni && f.avx512_bf16) return "avx512_vnni+bf16";
    if (f.avx512 && f.avx512_vnni) return "avx512_vnni";
    if (f.avx512) return "avx512";
    if (f.avx2) return "avx2";
    return "scalar";
}

}  // namespace moe::cpu
