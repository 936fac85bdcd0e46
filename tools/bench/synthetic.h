// Synthetic model specs for moeinfer-bench: "ARCH[:key=value...]" -> moe_synth_params, and the cached
// GGUF file they are written to (once; later runs with the same spec reuse it).
#ifndef MOEINFER_TOOLS_BENCH_SYNTHETIC_H
#define MOEINFER_TOOLS_BENCH_SYNTHETIC_H

#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cli.h"
#include "moeinfer/moeinfer.h"

namespace bench {

// One parsed spec. Shape fields left at 0 (types at -1) keep the preset's value, as in moe_synth_params.
struct SyntheticSpec {
    std::string arch;
    std::string preset;
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_vocab = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t n_expert = 0;
    int32_t n_expert_used = 0;
    int32_t n_ff_expert = 0;
    int32_t expert_type = -1;
    int32_t dense_type = -1;
    std::string recipe;  // recipe= (or experts=<a recipe that is no type name>): moe_synth_params.recipe
    std::optional<uint64_t> seed;
    std::optional<double> skew;
};

// The keys a spec accepts, in canonical order, with the help text --help prints.
struct SyntheticKey {
    const char* name;
    const char* help;
};
inline const std::vector<SyntheticKey>& synthetic_keys() {
    static const std::vector<SyntheticKey> keys = {
        {"preset", "shape preset: qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-20b, gpt-oss-120b, glm-4.5-air,\n"
                   "                   glm-4.5, deepseek-v3, kimi-k2, deepseek-v2-lite, tiny, tiny-air (glm4moe),\n"
                   "                   tiny-lite (deepseek2); moeinfer-synth --help says what each is"},
        {"layers", "number of layers"},
        {"experts", "expert tensor type (q8_0, q4_0, q4_K, iq4_xs, mxfp4, f16, ...), or a recipe name (below)"},
        {"recipe", "types of every weight by role, as in real files: q4_k_m, q5_k_m, q3_k_xl, iq4_xs\n"
                   "                   (moeinfer-synth --help); experts=iq4_xs is the type, recipe=iq4_xs the mix"},
        {"dense", "type of the other 2-D weights"},
        {"embd", "embedding width"},
        {"n_expert", "experts per layer"},
        {"n_expert_used", "experts chosen per token (top-k)"},
        {"ff", "hidden size of one expert's FFN"},
        {"vocab", "vocabulary size"},
        {"n_head", "attention heads"},
        {"n_head_kv", "key/value heads"},
        {"head_dim", "dimension of one head"},
        {"seed", "seed of the random weights"},
        {"skew", "routing skew in [0, 1)"},
    };
    return keys;
}

namespace detail {

inline std::optional<std::string> parse_type(const std::string& key, const std::string& value, int32_t& out) {
    if (moe_type_from_name(value.c_str(), &out) != MOE_STATUS_OK) {
        return "unknown type '" + value + "' for key '" + key + "' (try q8_0, q4_0, mxfp4, f16, bf16, f32)";
    }
    return std::nullopt;
}

inline std::optional<std::string> apply_key(const std::string& key, const std::string& value, SyntheticSpec& s) {
    struct IntKey {
        const char* name;
        int32_t SyntheticSpec::*field;
    };
    static const IntKey int_keys[] = {
        {"layers", &SyntheticSpec::n_layer},     {"embd", &SyntheticSpec::n_embd},
        {"vocab", &SyntheticSpec::n_vocab},      {"n_head", &SyntheticSpec::n_head},
        {"n_head_kv", &SyntheticSpec::n_head_kv}, {"head_dim", &SyntheticSpec::head_dim},
        {"n_expert", &SyntheticSpec::n_expert},  {"n_expert_used", &SyntheticSpec::n_expert_used},
        {"ff", &SyntheticSpec::n_ff_expert},
    };
    for (const IntKey& k : int_keys) {
        if (key != k.name) continue;
        int32_t v = 0;
        if (auto err = parse_int32(value, 1, INT32_MAX, v)) return "key '" + key + "': " + *err;
        s.*k.field = v;
        return std::nullopt;
    }
    if (key == "preset") {
        if (value.empty()) return "key 'preset' needs a name";
        s.preset = value;
    } else if (key == "experts" || key == "recipe") {
        // experts=: a type name, else a recipe name; recipe=: a recipe name, also one that is a type name
        // too (iq4_xs). Recipes are lower-cased, so that every spelling shares one cached file.
        if (key == "experts" && moe_type_from_name(value.c_str(), &s.expert_type) == MOE_STATUS_OK) {
            return std::nullopt;
        }
        if (key == "experts") s.expert_type = -1;  // recipe= with experts= or dense= is the library's error
        s.recipe.clear();
        for (char c : value) s.recipe += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        for (const char* r : {"q4_k_m", "q5_k_m", "q3_k_xl", "iq4_xs"}) {
            if (s.recipe == r) return std::nullopt;
        }
        if (key == "recipe") {
            return "unknown recipe '" + value + "' for key 'recipe' (q4_k_m, q5_k_m, q3_k_xl, iq4_xs)";
        }
        return "unknown type or recipe '" + value +
               "' for key 'experts' (types: q8_0, q4_0, q4_K, iq4_xs, mxfp4, f16, ...; recipes: q4_k_m, q5_k_m, "
               "q3_k_xl, iq4_xs)";
    } else if (key == "dense") {
        return parse_type(key, value, s.dense_type);
    } else if (key == "seed") {
        long long v = 0;
        if (auto err = parse_int(value, 0, LLONG_MAX, v)) return "key 'seed': " + *err;
        s.seed = static_cast<uint64_t>(v);
    } else if (key == "skew") {
        double v = 0;
        if (auto err = parse_double(value, 0.0, 1.0, true, v)) return "key 'skew': " + *err;
        s.skew = v;
    } else {
        std::string known;
        for (const SyntheticKey& k : synthetic_keys()) known += (known.empty() ? "" : ", ") + std::string(k.name);
        return "unknown key '" + key + "' (known keys: " + known + ")";
    }
    return std::nullopt;
}

}  // namespace detail

// Parses "qwen3moe:layers=4:experts=q8_0". Keys may come in any order; a repeated key is an error.
inline std::optional<std::string> parse_synthetic_spec(const std::string& text, SyntheticSpec& out) {
    SyntheticSpec spec;
    std::vector<std::string> parts;
    size_t pos = 0;
    while (true) {
        const size_t colon = text.find(':', pos);
        parts.push_back(text.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos));
        if (colon == std::string::npos) break;
        pos = colon + 1;
    }
    spec.arch = parts[0];
    if (spec.arch != "qwen3moe" && spec.arch != "gpt-oss" && spec.arch != "glm4moe" && spec.arch != "deepseek2") {
        return "unknown architecture '" + spec.arch + "' in '" + text +
               "' (expected qwen3moe, gpt-oss, glm4moe or deepseek2)";
    }
    std::vector<std::string> seen;
    for (size_t i = 1; i < parts.size(); ++i) {
        const size_t eq = parts[i].find('=');
        if (eq == std::string::npos || eq == 0) return "expected key=value, got '" + parts[i] + "' in '" + text + "'";
        const std::string key = parts[i].substr(0, eq);
        for (const std::string& k : seen) {
            if (k == key) return "key '" + key + "' given twice in '" + text + "'";
        }
        seen.push_back(key);
        if (auto err = detail::apply_key(key, parts[i].substr(eq + 1), spec)) return *err;
    }
    out = std::move(spec);
    return std::nullopt;
}

// The spec in one normal form (fixed key order, normalised values), so that equivalent spellings
// share one cached file.
inline std::string canonical_spec(const SyntheticSpec& s) {
    std::string out = s.arch;
    auto add = [&out](const char* key, const std::string& value) { out += std::string(":") + key + "=" + value; };
    auto add_int = [&add](const char* key, int32_t v) {
        if (v > 0) add(key, std::to_string(v));
    };
    auto add_type = [&add](const char* key, int32_t t) {
        const char* name = t >= 0 ? moe_type_name(t) : nullptr;
        if (name != nullptr) add(key, name);
    };
    if (!s.preset.empty()) add("preset", s.preset);
    add_int("layers", s.n_layer);
    add_type("experts", s.expert_type);
    if (!s.recipe.empty()) add("recipe", s.recipe);
    add_type("dense", s.dense_type);
    add_int("embd", s.n_embd);
    add_int("n_expert", s.n_expert);
    add_int("n_expert_used", s.n_expert_used);
    add_int("ff", s.n_ff_expert);
    add_int("vocab", s.n_vocab);
    add_int("n_head", s.n_head);
    add_int("n_head_kv", s.n_head_kv);
    add_int("head_dim", s.head_dim);
    if (s.seed) add("seed", std::to_string(*s.seed));
    if (s.skew) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", *s.skew);
        add("skew", buf);
    }
    return out;
}

// File name for a spec: readable, plus a hash of the spec and the library version (a newer writer
// may produce different weights, so its files must not be mistaken for an older one's).
inline std::string synthetic_file_name(const SyntheticSpec& s) {
    const std::string canon = canonical_spec(s);
    const std::string keyed = canon + "@" + moe_version();
    uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and platforms
    for (unsigned char c : keyed) h = (h ^ c) * 1099511628211ull;
    std::string readable;
    for (char c : canon) {
        const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                          c == '.' || c == '_';
        readable += keep ? c : (c == ':' ? '_' : '-');
    }
    if (readable.size() > 120) readable.resize(120);
    char hash[24];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(h));
    return "moeinfer-synth-" + readable + "-" + std::string(hash, 8) + ".gguf";
}

inline moe_status fill_synth_params(const SyntheticSpec& s, moe_synth_params& p) {
    const moe_status st = moe_synth_params_init(&p, s.arch.c_str());
    if (st != MOE_STATUS_OK) return st;
    if (!s.preset.empty()) p.preset = s.preset.c_str();  // borrowed: `s` outlives the write
    p.n_layer = s.n_layer;
    p.n_embd = s.n_embd;
    p.n_vocab = s.n_vocab;
    p.n_head = s.n_head;
    p.n_head_kv = s.n_head_kv;
    p.head_dim = s.head_dim;
    p.n_expert = s.n_expert;
    p.n_expert_used = s.n_expert_used;
    p.n_ff_expert = s.n_ff_expert;
    if (s.expert_type >= 0) p.expert_type = s.expert_type;
    if (s.dense_type >= 0) p.dense_type = s.dense_type;
    if (!s.recipe.empty()) p.recipe = s.recipe.c_str();  // borrowed, like preset
    if (s.seed) p.seed = *s.seed;
    if (s.skew) p.routing_skew = static_cast<float>(*s.skew);
    return MOE_STATUS_OK;
}

namespace detail {

struct WriteProgress {
    bool live;      // redraw a percentage line on stderr
    int last_pct;
};

inline int on_write_progress(float fraction, void* user) {
    auto* p = static_cast<WriteProgress*>(user);
    const int pct = static_cast<int>(fraction * 100.0f);
    if (p->live && pct != p->last_pct) {
        std::fprintf(stderr, "\rmoeinfer-bench: writing synthetic model: %3d%%", pct);
        std::fflush(stderr);
        p->last_pct = pct;
    }
    return 1;
}

}  // namespace detail

// Returns the cached file for `spec` under `dir`, writing it first when absent. The file is written
// under a temporary name and renamed, so an interrupted write never leaves a file that looks cached.
inline std::optional<Failure> ensure_synthetic_file(const SyntheticSpec& spec, const std::string& dir,
                                                    bool live_progress, bool verbose, std::string& out_path) {
    namespace fs = std::filesystem;
    const fs::path path = fs::path(dir) / synthetic_file_name(spec);
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) {
        if (verbose) std::fprintf(stderr, "moeinfer-bench: reusing synthetic model %s\n", path.c_str());
        out_path = path.string();
        return std::nullopt;
    }
    fs::create_directories(dir, ec);
    if (ec) return Failure{1, "cannot create --synthetic-dir '" + dir + "': " + ec.message()};

    moe_synth_params params;
    if (fill_synth_params(spec, params) != MOE_STATUS_OK) return library_error("--synthetic " + canonical_spec(spec));
    detail::WriteProgress progress{live_progress, -1};
    params.progress = &detail::on_write_progress;
    params.progress_user_data = &progress;

    const fs::path tmp = path.string() + ".tmp-" + std::to_string(static_cast<long>(getpid()));
    std::fprintf(stderr, "moeinfer-bench: writing synthetic model %s to %s\n", canonical_spec(spec).c_str(),
                 path.c_str());
    const moe_status st = moe_synth_write(tmp.c_str(), &params);
    if (live_progress) std::fprintf(stderr, "\r\033[K");
    if (st != MOE_STATUS_OK) {
        Failure f = library_error("writing synthetic model " + canonical_spec(spec));
        fs::remove(tmp, ec);
        return f;
    }
    fs::rename(tmp, path, ec);
    if (ec) {
        fs::remove(tmp, ec);
        return Failure{1, "cannot rename synthetic model to '" + path.string() + "': " + ec.message()};
    }
    out_path = path.string();
    return std::nullopt;
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_SYNTHETIC_H
