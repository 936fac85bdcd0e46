// moeinfer-synth: writes a synthetic MoE model (real Qwen3-30B-A3B / GPT-OSS shapes, random weights)
// as GGUF. Uses the public C API only.
//
//   moeinfer-synth --preset gpt-oss-20b -o g20.gguf
//   moeinfer-synth --arch qwen3moe --layers 2 --experts q4_0 --skew 0.5 -o q30-2l.gguf
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "moeinfer/moeinfer.h"

namespace {

const char* kUsage =
    "usage: moeinfer-synth [options] -o PATH\n"
    "\n"
    "Writes a synthetic Mixture-of-Experts model as GGUF: the real tensor shapes and metadata of\n"
    "Qwen3-30B-A3B (qwen3moe) or GPT-OSS-20B/120B (gpt-oss), deterministic random weights whose\n"
    "router spreads tokens over the experts like a trained model. llama.cpp loads the files too.\n"
    "\n"
    "options:\n"
    "  -o, --output PATH     file to write (required); written as PATH.tmp, renamed when complete\n"
    "  --arch ARCH           qwen3moe | gpt-oss | glm4moe | deepseek2 (default: qwen3moe, or the preset's\n"
    "                        architecture)\n"
    "  --preset NAME         qwen3-30b-a3b | qwen3-235b-a22b | gpt-oss-20b | gpt-oss-120b | glm-4.5-air |\n"
    "                        glm-4.5 | deepseek-v3 | kimi-k2 | deepseek-v2-lite | tiny\n"
    "                        (glm4moe also tiny-air: no q/k norms, scale 1, as GLM-4.5-Air; deepseek2 also\n"
    "                        tiny-lite: V2-like, plain q and softmax routing; deepseek2's tiny is V3-like)\n"
    "                        (default: qwen3-30b-a3b for qwen3moe, gpt-oss-20b for gpt-oss,\n"
    "                        glm-4.5-air for glm4moe, deepseek-v3 for deepseek2; tiny = 2 or 3 layers,\n"
    "                        n_embd 64: a few hundred KB,\n"
    "                        for tests; glm4moe files also hold the NextN layer real files have)\n"
    "  --layers N            number of layers (default: the preset's: 48, 24 or 36); deepseek2 keeps the\n"
    "                        preset's share of leading dense layers, at least one dense and one MoE layer\n"
    "                        (deepseek-v3 --layers 4: 1 dense + 3 MoE)\n"
    "  --experts TYPE|RECIPE expert tensor type: f16 | bf16 | f32 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 |\n"
    "                        iq4_nl | mxfp4 | q2_K | q3_K | q4_K | q5_K | q6_K | iq4_xs\n"
    "                        (default: q8_0 for qwen3moe, mxfp4 for gpt-oss); the K-quants and iq4_xs\n"
    "                        need --embd and --ff multiples of 256. Or a recipe, which sets the type of\n"
    "                        every weight by its role like llama.cpp's presets (then no --dense):\n"
    "                          q4_k_m   Q4_K; output Q6_K; attn_v and ffn_down_exps Q6_K on the first and\n"
    "                                   last eighth of the layers and every third between, else Q4_K\n"
    "                          q5_k_m   the same with Q5_K for Q4_K\n"
    "                          q3_k_xl  ffn_gate/up_exps Q3_K; ffn_down_exps, attention, token_embd Q4_K;\n"
    "                                   attn_v Q5_K; output Q6_K (a stand-in for the dynamic UD files)\n"
    "                          iq4_xs   IQ4_XS; attn_v Q5_K when heads / kv heads >= 4; output Q6_K\n"
    "                        (--experts iq4_xs is the type, for the experts alone: give that recipe\n"
    "                        with --recipe iq4_xs)\n"
    "                        norms, biases and routers stay f32; rows that are not whole blocks of 256\n"
    "                        take llama.cpp's fallbacks (Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0,\n"
    "                        Q3_K/IQ4_XS->IQ4_NL)\n"
    "  --recipe RECIPE       a recipe above by name, also one spelt like a type (iq4_xs)\n"
    "  --dense TYPE          type of the other 2-D weights (attention, embeddings, output) (default: f16)\n"
    "  --embd N              embedding size (default: the preset's)\n"
    "  --n-expert N          experts per layer (default: the preset's)\n"
    "  --n-expert-used N     experts chosen per token (default: the preset's)\n"
    "  --ff N                hidden size of one expert's FFN (default: the preset's)\n"
    "  --vocab N             vocabulary size, at least 259 (default: the preset's)\n"
    "  --heads N             attention heads (default: the preset's)\n"
    "  --heads-kv N          key/value heads (default: the preset's)\n"
    "  --head-dim N          size of one head (default: the preset's)\n"
    "  --seed N              seed of the random weights (default: 42)\n"
    "  --skew S              routing skew in [0, 1): 0 spreads tokens evenly over the experts; larger\n"
    "                        values make a growing set of experts rarely chosen (default: 0)\n"
    "  -q, --quiet           no progress line\n"
    "  -h, --help            this text\n";

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "moeinfer-synth: %s\n(run moeinfer-synth --help for the options)\n", msg.c_str());
    std::exit(2);
}

int32_t parse_int(const char* flag, const char* s) {
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v <= 0 || v > INT32_MAX) {
        usage_error(std::string(flag) + ": '" + s + "' is not a positive integer");
    }
    return static_cast<int32_t>(v);
}

uint64_t parse_u64(const char* flag, const char* s) {
    errno = 0;
    char* end = nullptr;
    if (*s == '-') usage_error(std::string(flag) + ": '" + s + "' is negative");
    const unsigned long long v = std::strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0') usage_error(std::string(flag) + ": '" + s + "' is not an integer");
    return static_cast<uint64_t>(v);
}

float parse_skew(const char* flag, const char* s) {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !std::isfinite(v) || v < 0.0 || v >= 1.0) {
        usage_error(std::string(flag) + ": '" + s + "' is not a number in [0, 1)");
    }
    return static_cast<float>(v);
}

// A type name. Where `recipe` is given, any other name is taken as a recipe name (*recipe; -1 is
// returned), which the library validates.
int32_t parse_type(const char* flag, const char* s, const char** recipe = nullptr) {
    int32_t t = 0;
    if (moe_type_from_name(s, &t) == MOE_STATUS_OK) return t;
    if (recipe == nullptr) usage_error(std::string(flag) + ": unknown type '" + s + "' (see --help for the types)");
    *recipe = s;
    return -1;
}

// The progress line: "writing 3.2/17.5 GB (18%)  412 MB/s". The library reports a fraction; the
// bytes come from the size of the file being written (PATH.tmp) and the total from both.
struct ProgressLine {
    std::string tmp_path;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last{};
    bool printed = false;

    static int callback(float fraction, void* user) {
        auto* self = static_cast<ProgressLine*>(user);
        const auto now = std::chrono::steady_clock::now();
        if (fraction < 1.0f && now - self->last < std::chrono::milliseconds(200)) return 1;
        self->last = now;
        const double secs = std::chrono::duration<double>(now - self->start).count();
        struct stat st;
        // The file lags the fraction by what is buffered (tens of MB): too little to judge small files by.
        if (stat(self->tmp_path.c_str(), &st) == 0 && fraction > 0.0f && st.st_size > (64 << 20)) {
            const double done = static_cast<double>(st.st_size);
            const double total = done / fraction;
            const bool gb = total >= 1e9;
            const double unit = gb ? 1e9 : 1e6;
            std::fprintf(stderr, "\rwriting %.1f/%.1f %s (%d%%)  %.0f MB/s   ", done / unit, total / unit,
                         gb ? "GB" : "MB", static_cast<int>(fraction * 100.0f), secs > 0 ? done / 1e6 / secs : 0.0);
        } else {
            std::fprintf(stderr, "\rwriting %d%%   ", static_cast<int>(fraction * 100.0f));
        }
        self->printed = true;
        return 1;
    }
};

}  // namespace

int main(int argc, char** argv) {
    const char* arch = nullptr;
    const char* preset = nullptr;
    const char* out = nullptr;
    bool quiet = false;
    // Overrides, applied after moe_synth_params_init (which needs the architecture first).
    int32_t layers = 0, embd = 0, n_expert = 0, n_expert_used = 0, ff = 0, vocab = 0;
    int32_t heads = 0, heads_kv = 0, head_dim = 0;
    int32_t expert_type = -1, dense_type = -1;
    const char* recipe = nullptr;
    uint64_t seed = 42;
    float skew = 0.0f;

    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (a == "-q" || a == "--quiet") {
            quiet = true;
            continue;
        }
        static const char* const kValueFlags[] = {
            "-o",         "--output", "--arch",  "--preset", "--layers", "--experts", "--recipe",
            "--dense",    "--embd",   "--n-expert", "--n-expert-used", "--ff", "--vocab", "--heads",
            "--heads-kv", "--head-dim", "--seed", "--skew"};
        bool known = false;
        for (const char* k : kValueFlags) known = known || a == k;
        if (!known) usage_error("unknown option '" + a + "'");
        if (i + 1 >= argc) usage_error(a + ": missing value");
        const char* f = argv[i];
        const char* v = argv[++i];
        if (a == "-o" || a == "--output") out = v;
        else if (a == "--arch") arch = v;
        else if (a == "--preset") preset = v;
        else if (a == "--layers") layers = parse_int(f, v);
        else if (a == "--experts") expert_type = parse_type(f, v, &recipe);
        else if (a == "--recipe") recipe = v;  // the library validates the name
        else if (a == "--dense") dense_type = parse_type(f, v);
        else if (a == "--embd") embd = parse_int(f, v);
        else if (a == "--n-expert") n_expert = parse_int(f, v);
        else if (a == "--n-expert-used") n_expert_used = parse_int(f, v);
        else if (a == "--ff") ff = parse_int(f, v);
        else if (a == "--vocab") vocab = parse_int(f, v);
        else if (a == "--heads") heads = parse_int(f, v);
        else if (a == "--heads-kv") heads_kv = parse_int(f, v);
        else if (a == "--head-dim") head_dim = parse_int(f, v);
        else if (a == "--seed") seed = parse_u64(f, v);
        else if (a == "--skew") skew = parse_skew(f, v);
        else usage_error("unknown option '" + a + "'");
    }
    if (out == nullptr) usage_error("no output file: give -o PATH");
    if (arch == nullptr && preset != nullptr && std::strncmp(preset, "gpt-oss", 7) == 0) arch = "gpt-oss";
    if (arch == nullptr && preset != nullptr && std::strncmp(preset, "glm-4", 5) == 0) arch = "glm4moe";
    if (arch == nullptr && preset != nullptr &&
        (std::strncmp(preset, "deepseek-", 9) == 0 || std::strcmp(preset, "kimi-k2") == 0)) {
        arch = "deepseek2";
    }

    moe_synth_params p;
    if (moe_synth_params_init(&p, arch) != MOE_STATUS_OK) usage_error(std::string("--arch: ") + moe_last_error());
    if (preset != nullptr) p.preset = preset;
    p.n_layer = layers;
    p.n_embd = embd;
    p.n_vocab = vocab;
    p.n_head = heads;
    p.n_head_kv = heads_kv;
    p.head_dim = head_dim;
    p.n_expert = n_expert;
    p.n_expert_used = n_expert_used;
    p.n_ff_expert = ff;
    p.expert_type = expert_type;
    p.dense_type = dense_type;
    p.recipe = recipe;
    p.seed = seed;
    p.routing_skew = skew;
    ProgressLine line;
    line.tmp_path = std::string(out) + ".tmp";
    if (!quiet) {
        p.progress = &ProgressLine::callback;
        p.progress_user_data = &line;
    }

    const moe_status s = moe_synth_write(out, &p);
    if (line.printed) std::fputc('\n', stderr);
    if (s != MOE_STATUS_OK) {
        std::fprintf(stderr, "moeinfer-synth: %s: %s\n", moe_status_string(s), moe_last_error());
        return s == MOE_STATUS_INVALID_ARGUMENT ? 2 : 1;
    }
    if (!quiet) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - line.start).count();
        struct stat st;
        const double bytes = stat(out, &st) == 0 ? static_cast<double>(st.st_size) : 0.0;
        std::fprintf(stderr, "wrote %s: %.3f GB in %.2f s (%.0f MB/s)\n", out, bytes / 1e9, secs,
                     secs > 0 ? bytes / 1e6 / secs : 0.0);
    }
    return 0;
}
