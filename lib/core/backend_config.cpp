#include "core/backend_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace moe {
namespace {

// One key of the options string: how its value and its environment variable are read.
struct Key {
    const char* name;
    const char* env;       // nullptr: none
    const char* values;    // what the string takes, for messages and the help text
    const char* fallback;  // the default, as the help text says it
    const char* help;
    // The value as the string gives it; false when the key does not take it.
    bool (*parse)(std::string_view value, BackendConfig& c);
    // The environment variable's value, with the rules it has always had.
    void (*from_env)(const char* value, BackendConfig& c);
};

std::optional<bool> on_off(std::string_view v) {
    if (v == "on" || v == "1") return true;
    if (v == "off" || v == "0") return false;
    return std::nullopt;
}

// The variables of the switches that are on by default: "0" turns them off, anything else keeps them on.
bool env_not_zero(const char* v) { return std::strcmp(v, "0") != 0; }

template <bool BackendConfig::*Field>
bool parse_bool(std::string_view v, BackendConfig& c) {
    const std::optional<bool> b = on_off(v);
    if (b) c.*Field = *b;
    return b.has_value();
}

std::optional<double> parse_double(std::string_view v) {
    double d = 0.0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d)) return std::nullopt;
    return d;
}

std::optional<uint64_t> parse_u64(std::string_view v) {
    uint64_t n = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) return std::nullopt;
    return n;
}

const std::vector<Key>& keys() {
    static const std::vector<Key> table = {
        {"cuda_graphs", "MOEINFER_CUDA_GRAPHS", "on|off", "on",
         "CUDA graphs: kernels captured once and replayed (results bitwise the same either way)",
         parse_bool<&BackendConfig::cuda_graphs>,
         [](const char* v, BackendConfig& c) { c.cuda_graphs = env_not_zero(v); }},
        {"cuda_fusion", "MOEINFER_CUDA_FUSION", "on|off", "on",
         "common runs of small nodes launched as one kernel (results bitwise the same either way)",
         parse_bool<&BackendConfig::cuda_fusion>,
         [](const char* v, BackendConfig& c) { c.cuda_fusion = env_not_zero(v); }},
        {"cuda_pdl", "MOEINFER_CUDA_PDL", "on|off", "on where the GPU has compute capability 9.0+",
         "programmatic dependent launch (always off below compute capability 9.0)",
         [](std::string_view v, BackendConfig& c) {
             const std::optional<bool> b = on_off(v);
             if (b) c.cuda_pdl = *b;
             return b.has_value();
         },
         [](const char* v, BackendConfig& c) { c.cuda_pdl = env_not_zero(v); }},
        {"cuda_pull_copies", "MOEINFER_CUDA_PULL_COPIES", "auto|never|always", "auto",
         "activation uploads read by a kernel over PCIe instead of a DMA copy; auto: while weight uploads "
         "are in flight (the variable takes 0 for never, 1 for always)",
         [](std::string_view v, BackendConfig& c) {
             if (v == "auto") c.cuda_pull_copies = PullCopies::WHILE_UPLOADING;
             else if (v == "never") c.cuda_pull_copies = PullCopies::NEVER;
             else if (v == "always") c.cuda_pull_copies = PullCopies::ALWAYS;
             else return false;
             return true;
         },
         [](const char* v, BackendConfig& c) {
             if (std::strcmp(v, "0") == 0) c.cuda_pull_copies = PullCopies::NEVER;
             if (std::strcmp(v, "1") == 0) c.cuda_pull_copies = PullCopies::ALWAYS;
         }},
        {"emulated_async", "MOEINFER_EMULATED_ASYNC", "on|off", "off",
         "the emulated device computes and uploads on worker threads after random delays (the variable "
         "takes 1 for on)",
         parse_bool<&BackendConfig::emulated_async>,
         [](const char* v, BackendConfig& c) { c.emulated_async = std::strcmp(v, "1") == 0; }},
        {"emulated_pcie_gbps", "MOEINFER_EMULATED_PCIE_GBPS", "GB/s, >= 0", "0 (uploads are plain copies)",
         "the emulated device's uploads take at least as long as over a link of this bandwidth",
         [](std::string_view v, BackendConfig& c) {
             const std::optional<double> d = parse_double(v);
             if (!d || *d < 0.0) return false;
             c.emulated_pcie_gbps = *d;
             return true;
         },
         [](const char* v, BackendConfig& c) {
             const std::optional<double> d = parse_double(v);
             if (d && *d > 0.0) c.emulated_pcie_gbps = *d;
         }},
        {"emulated_vram", "MOEINFER_EMULATED_VRAM", "bytes", "68719476736 (64 GiB)",
         "the size of the emulated card, whose memory every emulated device of the process shares",
         [](std::string_view v, BackendConfig& c) {
             const std::optional<uint64_t> n = parse_u64(v);
             if (n) c.emulated_vram = *n;
             return n.has_value();
         },
         [](const char* v, BackendConfig& c) {
             if (const std::optional<uint64_t> n = parse_u64(v)) c.emulated_vram = *n;
         }},
        {"emulated_devices", nullptr, "1..8", "1",
         "the emulated devices a context without a device list sees, as a host's visible GPUs: with more "
         "than one it takes the every-device default (docs/MULTI_GPU.md); a device list may name any of 8",
         [](std::string_view v, BackendConfig& c) {
             const std::optional<uint64_t> n = parse_u64(v);
             if (!n || *n < 1 || *n > 8) return false;
             c.emulated_devices = static_cast<int>(*n);
             return true;
         },
         nullptr},
        {"emulated_busy", nullptr, "0..7|none", "none",
         "an emulated device that refuses to be opened or asked for its free memory, as a GPU another "
         "process holds in exclusive-process mode: the every-device default leaves it out",
         [](std::string_view v, BackendConfig& c) {
             if (v == "none") {
                 c.emulated_busy = -1;
                 return true;
             }
             const std::optional<uint64_t> n = parse_u64(v);
             if (!n || *n > 7) return false;
             c.emulated_busy = static_cast<int>(*n);
             return true;
         },
         nullptr},
        {"offload_calibration", nullptr, "auto|on|off", "auto",
         "offload thresholds computed at context creation from the measured PCIe bandwidth and host and "
         "device throughput (docs/POLICY.md); auto: on CUDA contexts (the emulated device keeps the fixed "
         "ones, for deterministic tests); off: the fixed thresholds",
         [](std::string_view v, BackendConfig& c) {
             if (v == "auto") {
                 c.offload_calibration.reset();
                 return true;
             }
             const std::optional<bool> b = on_off(v);
             if (b) c.offload_calibration = *b;
             return b.has_value();
         },
         nullptr},
        {"expert_gemm_decode", "MOEINFER_EXPERT_GEMM_DECODE", "fused|scratch", "fused",
         "CUDA expert prefill of K-quant / IQ4 / Q4_1 / Q5_* weights: fused, the tensor-core GEMM decodes "
         "the quantised weight tiles itself; scratch, the routed experts are dequantised to BF16 rows first",
         [](std::string_view v, BackendConfig& c) {
             if (v == "fused") c.expert_gemm_decode = ExpertGemmDecode::FUSED;
             else if (v == "scratch") c.expert_gemm_decode = ExpertGemmDecode::SCRATCH;
             else return false;
             return true;
         },
         [](const char* v, BackendConfig& c) {
             if (std::strcmp(v, "fused") == 0) c.expert_gemm_decode = ExpertGemmDecode::FUSED;
             if (std::strcmp(v, "scratch") == 0) c.expert_gemm_decode = ExpertGemmDecode::SCRATCH;
         }},
        {"kquant_gemv", "MOEINFER_KQUANT_GEMV", "v3|v2|v1", "v3",
         "CUDA decode GEMV (1 .. 8 columns) of K-quant / IQ4 / Q4_1 / Q5_* weights: v3, v2 with routed rows of "
         "at most 32 groups (K <= 1024) at 4 rows per warp; v2, 16-byte weight loads staged in shared memory; "
         "v1, the first kernel (2-byte loads per lane); the same results",
         [](std::string_view v, BackendConfig& c) {
             if (v == "v2") c.kquant_gemv = KquantGemv::V2;
             else if (v == "v1") c.kquant_gemv = KquantGemv::V1;
             else if (v == "v3") c.kquant_gemv = KquantGemv::V3;
             else return false;
             return true;
         },
         [](const char* v, BackendConfig& c) {
             if (std::strcmp(v, "v2") == 0) c.kquant_gemv = KquantGemv::V2;
             if (std::strcmp(v, "v1") == 0) c.kquant_gemv = KquantGemv::V1;
             if (std::strcmp(v, "v3") == 0) c.kquant_gemv = KquantGemv::V3;
         }},
        {"float_gemv", "MOEINFER_FLOAT_GEMV", "v2|v1", "v2",
         "CUDA decode GEMV (1 .. 8 columns) of dense F16 / BF16 / F32 weights: v2, coalesced loads of 4 "
         "weights and their activations per lane, 4 rows per block sharing the activation loads; v1, the first "
         "kernel (blocks of 32 staged in shared memory); the same products summed in another order",
         [](std::string_view v, BackendConfig& c) {
             if (v == "v2") c.float_gemv = FloatGemv::V2;
             else if (v == "v1") c.float_gemv = FloatGemv::V1;
             else return false;
             return true;
         },
         [](const char* v, BackendConfig& c) {
             if (std::strcmp(v, "v2") == 0) c.float_gemv = FloatGemv::V2;
             if (std::strcmp(v, "v1") == 0) c.float_gemv = FloatGemv::V1;
         }},
        {"peer_copies", nullptr, "auto|staged", "auto",
         "contexts over several GPUs: auto, a stage's result goes to the next GPU by a peer copy where the "
         "two GPUs have peer access (NVLink or PCIe), else through page-locked host memory; staged, always "
         "through host memory, peer access never enabled",
         [](std::string_view v, BackendConfig& c) {
             if (v == "auto") c.peer_copies = PeerCopies::AUTO;
             else if (v == "staged") c.peer_copies = PeerCopies::STAGED;
             else return false;
             return true;
         },
         nullptr},
        {"upload_relay", nullptr, "auto|on|off", "auto",
         "contexts over several GPUs with weights in host RAM: each GPU uploads part of every large weight "
         "copy through the other GPUs' host links and the peer link (NVLink), so one upload runs over "
         "several PCIe links; auto, where the peer link measures at least twice a host link; on, wherever "
         "the GPUs have peer access; off, each GPU over its own link only",
         [](std::string_view v, BackendConfig& c) {
             if (v == "auto") c.upload_relay = UploadRelayMode::AUTO;
             else if (v == "on") c.upload_relay = UploadRelayMode::ON;
             else if (v == "off") c.upload_relay = UploadRelayMode::OFF;
             else return false;
             return true;
         },
         nullptr},
        {"cpu_moe_fusion", "MOEINFER_CPU_MOE_FUSION", "on|off", "on",
         "the CPU computes an expert FFN's up/gate and down products in one parallel pass where both are "
         "small (decoding): each expert's down product starts as soon as its up/gate product is done "
         "(results bitwise the same either way)",
         parse_bool<&BackendConfig::cpu_moe_fusion>,
         [](const char* v, BackendConfig& c) { c.cpu_moe_fusion = env_not_zero(v); }},
        {"stable_kv", nullptr, "on|off", "off",
         "the graphs write the KV cache at the rows the token positions name and attend over a cache length "
         "rounded up to a multiple of 256, so that a decode step's nodes stay the same for 256 tokens and "
         "the GPU replays them from CUDA graphs without capturing (off until measured on a GPU)",
         parse_bool<&BackendConfig::stable_kv>, nullptr},
    };
    return table;
}

std::string known_keys() {
    std::string s;
    for (const Key& k : keys()) s += std::string(s.empty() ? "" : ", ") + k.name;
    return s;
}

}  // namespace

const char* process_env(const char* name) { return std::getenv(name); }

StatusOr<BackendConfig> parse_backend_config(std::string_view spec, const EnvLookup& env) {
    const std::vector<Key>& table = keys();
    std::vector<bool> given(table.size(), false);
    BackendConfig c;
    size_t start = 0;
    while (!spec.empty() && start <= spec.size()) {
        const size_t comma = spec.find(',', start);
        const std::string_view entry = spec.substr(start, comma == std::string_view::npos ? spec.npos : comma - start);
        const std::string quoted = "backend_options entry '" + std::string(entry) + "'";
        const size_t eq = entry.find('=');
        if (eq == std::string_view::npos) {
            return invalid_argument(entry.empty() ? "backend_options '" + std::string(spec) + "': empty entry"
                                                  : quoted + ": expected key=value");
        }
        const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
        size_t i = 0;
        while (i < table.size() && name != table[i].name) ++i;
        if (i == table.size()) {
            return invalid_argument(quoted + ": unknown key '" + std::string(name) + "' (known: " + known_keys() + ")");
        }
        if (given[i]) return invalid_argument(quoted + ": " + table[i].name + " is given twice");
        if (!table[i].parse(value, c)) {
            return invalid_argument(quoted + ": " + table[i].name + " takes " + table[i].values + ", got '" +
                                    std::string(value) + "'");
        }
        given[i] = true;
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    for (size_t i = 0; i < table.size(); ++i) {
        if (given[i] || table[i].env == nullptr) continue;
        if (const char* v = env(table[i].env)) table[i].from_env(v, c);
    }
    return c;
}

const std::string& backend_options_help() {
    static const std::string text = [] {
        std::string s;
        for (const Key& k : keys()) {
            s += "  " + std::string(k.name) + "=" + k.values + "  (default " + k.fallback;
            if (k.env != nullptr) s += std::string("; env ") + k.env;
            s += std::string(")\n      ") + k.help + "\n";
        }
        return s;
    }();
    return text;
}

}  // namespace moe
