// The backend switches of a context: moe_context_params.backend_options, "key=value[,key=value...]",
// parsed here and only here. A key the string leaves out takes its environment variable where it has
// one (read with the variable's own rules, which predate the string, so that scripts setting them keep
// working), else its default. The backends and the runtime read the parsed BackendConfig, never the
// environment.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moe {

// When the CUDA backend copies activations to the device with a kernel that reads page-locked host
// memory instead of a DMA copy (lib/cuda/mapped_copy.cuh).
enum class PullCopies : int32_t { WHILE_UPLOADING = 0, NEVER = 1, ALWAYS = 2 };

// How the CUDA backend's batched expert products read weights of the types it decodes with
// core/quant_decode.h (Q4_1 .. IQ4_XS): FUSED, its tensor-core GEMM decodes the quantised bytes of each
// weight tile itself; SCRATCH, the routed experts are first dequantised to BF16 rows in scratch (a chunk
// of at most 32 experts / 256 MiB at a time) and the GEMM reads those (an extra write and read of 2
// bytes per weight).
enum class ExpertGemmDecode : int32_t { FUSED = 0, SCRATCH = 1 };

// Which GEMV kernel the CUDA backend's small-batch products (1 .. 8 columns, dense and routed experts)
// run on weights of those same types: V2 stages 16-byte coalesced weight loads per warp in shared
// memory as the Q8_0 / Q4_0 / MXFP4 kernel does; V1, the first kernel, reads each lane's group of 32
// from global memory in 2-byte loads; V3 is V2 except for routed single products (MUL_MAT_ID) of rows of at
// most 32 groups of 32 (the expert down product of K = 768), which run several rows per warp, 8 lanes per
// row (the default: 3-10% less time in those kernels on an H100, 2026-11-27). The same bits every way; V1
// and V2 are kept for A/B timing.
enum class KquantGemv : int32_t { V2 = 0, V1 = 1, V3 = 2 };

// Which GEMV kernel the CUDA backend's dense small-batch products (1 .. 8 columns) of float weights (F16,
// BF16, F32) of more than 1,024 rows run: V2 reads each lane's 4 consecutive weights and their float4 of
// activations with coalesced loads, 4 rows per block sharing each activation load, the block's warps
// splitting K; V1, the first kernel, stages 32-element blocks in shared memory as the Q8_0 kernel does.
// Sums in another order (last bits differ); V1 is kept for A/B timing.
enum class FloatGemv : int32_t { V2 = 0, V1 = 1 };

// How a context over several devices hands a stage's result (the residual stream) to the next device's
// stage (docs/MULTI_GPU.md): AUTO, by a peer copy from device to device where the two can reach each
// other (CUDA peer access over NVLink or PCIe), else through page-locked host memory; STAGED, always
// through host memory (for A/B timing, and for machines whose peer-to-peer is broken: peer access is
// then never enabled).
enum class PeerCopies : int32_t { AUTO = 0, STAGED = 1 };

// Whether a device of a context over several devices uploads part of each host-resident weight through
// the others' host links (Backend::add_upload_relay; docs/MULTI_GPU.md): AUTO, where the peer link
// measures at least twice a host link (NVLink); ON, wherever the devices have peer access; OFF, never.
enum class UploadRelayMode : int32_t { AUTO = 0, ON = 1, OFF = 2 };

struct BackendConfig {
    bool cuda_graphs = true;            // cuda_graphs / MOEINFER_CUDA_GRAPHS
    bool cuda_fusion = true;            // cuda_fusion / MOEINFER_CUDA_FUSION
    std::optional<bool> cuda_pdl;       // cuda_pdl / MOEINFER_CUDA_PDL; nullopt: the backend's default
    PullCopies cuda_pull_copies = PullCopies::WHILE_UPLOADING;  // cuda_pull_copies / MOEINFER_CUDA_PULL_COPIES
    bool emulated_async = false;        // emulated_async / MOEINFER_EMULATED_ASYNC
    double emulated_pcie_gbps = 0.0;    // emulated_pcie_gbps / MOEINFER_EMULATED_PCIE_GBPS; 0: no floor
    uint64_t emulated_vram = uint64_t{64} << 30;  // emulated_vram / MOEINFER_EMULATED_VRAM, bytes
    int emulated_devices = 1;           // emulated_devices (no variable): those a context without a list sees
    int emulated_busy = -1;             // emulated_busy (no variable): the ordinal of a device that refuses to open
    std::optional<bool> offload_calibration;  // offload_calibration (no variable); nullopt: auto
    ExpertGemmDecode expert_gemm_decode = ExpertGemmDecode::FUSED;  // expert_gemm_decode / MOEINFER_EXPERT_GEMM_DECODE
    KquantGemv kquant_gemv = KquantGemv::V3;  // kquant_gemv / MOEINFER_KQUANT_GEMV
    FloatGemv float_gemv = FloatGemv::V2;     // float_gemv / MOEINFER_FLOAT_GEMV
    PeerCopies peer_copies = PeerCopies::AUTO;  // peer_copies (no variable)
    UploadRelayMode upload_relay = UploadRelayMode::AUTO;  // upload_relay (no variable)
    bool cpu_moe_fusion = true;         // cpu_moe_fusion / MOEINFER_CPU_MOE_FUSION (cpu_ops.h moe_ffn)
    bool stable_kv = false;             // stable_kv (no variable): KvAddressing::STABLE (core/models/model_graph.h)
};

// Looks an environment variable up: nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// The process environment (std::getenv).
const char* process_env(const char* name);

// Parses `spec` ("" or "key=value[,key=value...]"); keys left out come from `env`, then the defaults.
// INVALID_ARGUMENT naming the entry for an unknown key (listing the known ones), a key given twice, an
// entry without '=' or a value the key does not take (saying which it takes). Malformed environment
// values are ignored, as they always were (the default stays).
StatusOr<BackendConfig> parse_backend_config(std::string_view spec, const EnvLookup& env = process_env);

// One line per key: "  key=VALUES  (env VAR; default D) what it does". For --help texts and the
// C API's moe_backend_options_help.
const std::string& backend_options_help();

}  // namespace moe
