// llama.cpp's CPU forward pass on given token ids, for the expected logits of
// tests/python/test_forward_llama_cpp.py.
//
// Usage: llama_logits_ref MODEL.gguf IDS OUT.npy [--kv-type f32|f16] [--flash-attn on|off] [--threads N]
//   IDS:     the token ids, comma-separated ("17,4,311"); they are evaluated as one sequence from position 0
//            in a single llama_decode (one ubatch), with logits requested for every position.
//   OUT.npy: float32 [n_tokens, n_vocab], numpy's .npy format (version 1.0, little-endian, C order).
//   --kv-type    type of the K and V cache (default f32: then every product of an F32 model stays F32 and
//                the result is llama.cpp's arithmetic without the cache's rounding; f16 is llama.cpp's default)
//   --flash-attn whether llama.cpp's fused attention runs (default off: the KQ and KQV products of the plain
//                graph keep the cache's type; on is what llama.cpp picks on the CPU by default)
//   --threads    CPU threads (default 1; ggml's row split does not change the arithmetic)
// Prints one line of JSON to stdout: {"arch": ..., "n_vocab": ..., "n_tokens": ...}.
// Only llama.h's public API is used; nothing is offloaded (no GPU backend is built).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama.h"

namespace {

struct Options {
    std::string model, ids, out;
    ggml_type kv_type = GGML_TYPE_F32;
    bool flash_attn = false;
    int32_t threads = 1;
};

[[noreturn]] void usage(const char* argv0, const std::string& why) {
    std::fprintf(stderr,
                 "%s: %s\nusage: %s MODEL.gguf IDS OUT.npy [--kv-type f32|f16] [--flash-attn on|off] "
                 "[--threads N]\n",
                 argv0, why.c_str(), argv0);
    std::exit(2);
}

Options parse_options(int argc, char** argv) {
    Options o;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a.rfind("--", 0) != 0) {
            positional.push_back(a);
            continue;
        }
        if (i + 1 >= argc) usage(argv[0], a + ": missing value");
        const std::string v = argv[++i];
        if (a == "--kv-type") {
            if (v == "f32") o.kv_type = GGML_TYPE_F32;
            else if (v == "f16") o.kv_type = GGML_TYPE_F16;
            else usage(argv[0], "--kv-type: '" + v + "' is not f32 or f16");
        } else if (a == "--flash-attn") {
            if (v != "on" && v != "off") usage(argv[0], "--flash-attn: '" + v + "' is not on or off");
            o.flash_attn = v == "on";
        } else if (a == "--threads") {
            char* end = nullptr;
            const long n = std::strtol(v.c_str(), &end, 10);
            if (end == v.c_str() || *end != '\0' || n < 1 || n > 1024) {
                usage(argv[0], "--threads: '" + v + "' is not in [1, 1024]");
            }
            o.threads = static_cast<int32_t>(n);
        } else {
            usage(argv[0], "unknown option '" + a + "'");
        }
    }
    if (positional.size() != 3) usage(argv[0], "expected MODEL.gguf IDS OUT.npy");
    o.model = positional[0];
    o.ids = positional[1];
    o.out = positional[2];
    return o;
}

std::vector<llama_token> parse_ids(const std::string& s, int32_t n_vocab) {
    std::vector<llama_token> ids;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t comma = std::min(s.find(',', start), s.size());
        const std::string item = s.substr(start, comma - start);
        char* end = nullptr;
        const long id = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || id < 0 || id >= n_vocab) {
            throw std::runtime_error("IDS: '" + item + "' is not a token id in [0, " + std::to_string(n_vocab) + ")");
        }
        ids.push_back(static_cast<llama_token>(id));
        start = comma + 1;
    }
    return ids;
}

// numpy's .npy v1.0: magic, header length, a dict literal padded with spaces to a multiple of 64 bytes.
void write_npy(const std::string& path, const std::vector<float>& data, size_t rows, size_t cols) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                         std::to_string(cols) + "), }";
    const size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error(path + ": cannot open for writing");
    const uint16_t header_len = static_cast<uint16_t>(header.size());
    const unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                        static_cast<unsigned char>(header_len & 0xff),
                                        static_cast<unsigned char>(header_len >> 8)};
    // The data is written as the host's floats: the .npy says little-endian, as every host llama.cpp runs on.
    const bool ok = std::fwrite(preamble, 1, sizeof(preamble), f) == sizeof(preamble) &&
                    std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
                    std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
    if (std::fclose(f) != 0 || !ok) throw std::runtime_error(path + ": write failed");
}

void quiet_log(ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse_options(argc, argv);
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model* model = llama_model_load_from_file(o.model.c_str(), mp);
    if (model == nullptr) {
        std::fprintf(stderr, "%s: llama.cpp could not load the model\n", o.model.c_str());
        return 1;
    }
    llama_context* ctx = nullptr;
    llama_batch batch{};
    int rc = 0;
    try {
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        const std::vector<llama_token> ids = parse_ids(o.ids, n_vocab);
        const auto n = static_cast<int32_t>(ids.size());

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = static_cast<uint32_t>(n);
        cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(n);
        cp.n_seq_max = 1;
        cp.n_threads = cp.n_threads_batch = o.threads;
        cp.type_k = cp.type_v = o.kv_type;
        cp.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.offload_kqv = false;
        cp.op_offload = false;
        cp.no_perf = true;
        ctx = llama_init_from_model(model, cp);
        if (ctx == nullptr) throw std::runtime_error("llama.cpp could not create the context");

        batch = llama_batch_init(n, 0, 1);
        for (int32_t i = 0; i < n; ++i) {
            batch.token[i] = ids[static_cast<size_t>(i)];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        if (const int32_t status = llama_decode(ctx, batch); status != 0) {
            throw std::runtime_error("llama_decode returned " + std::to_string(status));
        }
        std::vector<float> logits(static_cast<size_t>(n) * static_cast<size_t>(n_vocab));
        for (int32_t i = 0; i < n; ++i) {
            const float* row = llama_get_logits_ith(ctx, i);
            if (row == nullptr) throw std::runtime_error("no logits for position " + std::to_string(i));
            std::memcpy(&logits[static_cast<size_t>(i) * static_cast<size_t>(n_vocab)], row,
                        sizeof(float) * static_cast<size_t>(n_vocab));
        }
        write_npy(o.out, logits, static_cast<size_t>(n), static_cast<size_t>(n_vocab));
        char arch[128] = "";
        llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
        std::printf("{\"arch\": \"%s\", \"n_vocab\": %d, \"n_tokens\": %d}\n", arch, n_vocab, n);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", o.model.c_str(), e.what());
        rc = 1;
    }
    if (batch.token != nullptr) llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
