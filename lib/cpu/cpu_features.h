// What the CPU we run on can do, detected once at run time (never assumed from the build machine).
#pragma once

namespace moe::cpu {

struct CpuFeatures {
    bool avx2 = false;      // AVX2 + FMA + F16C
    bool avx512 = false;    // AVX-512 F/BW/VL/DQ
    bool avx512_vnni = false;
    bool avx512_bf16 = false;
    bool amx = false;       // AMX tiles with BF16 products, and the OS lets this process use them
};

// Detected with CPUID and XGETBV (the OS must also save the wide registers). Cached.
const CpuFeatures& cpu_features();

// "avx512_vnni+bf16", "avx2", "scalar": the widest kernel family this CPU will run.
const char* cpu_isa_name();

// MOEINFER_CPU_ISA=scalar|avx2|avx512 caps the ISA (for tests of every path on one machine): avx512 means
// AVX-512 without AMX.

// Test hook: caps what cpu_features() reports from now on, on top of detection and MOEINFER_CPU_ISA,
// so one test process can run every kernel family (kernels choose at each call). kNone lifts the cap.
// REQUIRES: no kernel is running while the cap changes.
enum class IsaCap { kNone, kAvx512, kAvx2, kScalar };
void set_cpu_isa_cap_for_testing(IsaCap cap);

// Where the matrix products take the BF16 path (cpu/matmul_bf16_path.h) on a CPU with AVX-512 BF16:
// kAuto (the default) where it is measured to beat the integer path, kAlways / kNever for tests and
// benchmarks of either path. Without AVX-512 BF16 (or under an ISA cap) it is never taken.
// REQUIRES: no kernel is running while it changes.
enum class Bf16Path { kAuto, kAlways, kNever };
void set_bf16_path_for_testing(Bf16Path path);
Bf16Path bf16_path();

// The tiles that path multiplies the super-block kinds (Q2_K .. Q6_K, IQ4_XS) with: kInt8 (the default:
// weights requantised to int8 per job, VNNI products; cpu/matmul_i8.h) or kBf16 (weights decoded to
// BF16), for tests and benchmarks of either. The other kinds always take the BF16 tiles.
// REQUIRES: no kernel is running while it changes.
enum class DecodedTiles { kInt8, kBf16 };
void set_decoded_tiles_for_testing(DecodedTiles tiles);
DecodedTiles decoded_tiles();

}  // namespace moe::cpu
