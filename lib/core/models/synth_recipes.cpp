// Type recipes of synthetic models: the mixes of types by tensor role that llama.cpp's quantisation
// presets put in the files users download (llama-quant.cpp, llama_tensor_get_type), so benchmarks and
// tests see the same mix of kernels as a real Q4_K_M / Q5_K_M / IQ4_XS file.
//
//   q4_k_m   token_embd, attn_q/k/output, ffn_gate/up_exps: Q4_K; output: Q6_K; attn_v and ffn_down_exps:
//            Q6_K on the layers llama.cpp gives more bits (use_more_bits: the first and last eighth of
//            the layers and every third between), Q4_K on the others.
//   q5_k_m   the same with Q5_K in place of Q4_K.
//   q3_k_xl  our stand-in for the dynamic Q3_K_XL files (no fixed rule exists): ffn_gate/up_exps
//            Q3_K; ffn_down_exps, attn_q/k/output and token_embd Q4_K; attn_v Q5_K; output Q6_K.
//   iq4_xs   every weight IQ4_XS but attn_v, which is Q5_K when n_head / n_head_kv >= 4 (as llama.cpp
//            does), and output, which is Q6_K.
// Norms, biases, sinks and the routers stay F32 in every recipe, as llama.cpp leaves them.
// A weight whose rows are not whole super-blocks of 256 takes llama.cpp's fallback type (Q2_K / Q3_K /
// IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), and F16 where even that does not fit.
#include <cctype>
#include <string>
#include <string_view>

#include "core/models/synth_model.h"

namespace moe::synth {
namespace {

struct RecipeName {
    Recipe recipe;
    const char* name;
    uint32_t file_type;  // llama.cpp's llama_ftype (informational: general.file_type)
};
constexpr RecipeName kRecipes[] = {
    {Recipe::Q4_K_M, "q4_k_m", 15},  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    {Recipe::Q5_K_M, "q5_k_m", 17},  // LLAMA_FTYPE_MOSTLY_Q5_K_M
    {Recipe::Q3_K_XL, "q3_k_xl", 13},  // LLAMA_FTYPE_MOSTLY_Q3_K_L: the closest llama.cpp has
    {Recipe::IQ4_XS, "iq4_xs", 30},  // LLAMA_FTYPE_MOSTLY_IQ4_XS
};

enum class Role { TOKEN_EMBD, OUTPUT, ATTN_Q, ATTN_K, ATTN_V, ATTN_OUTPUT, FFN_GATE_UP, FFN_DOWN, OTHER };

// The role of a tensor by its llama.cpp name, and its layer (-1 for the global tensors).
Role role_of(const std::string& name, int* layer) {
    *layer = -1;
    if (name == "token_embd.weight") return Role::TOKEN_EMBD;
    if (name == "output.weight") return Role::OUTPUT;
    if (name.rfind("blk.", 0) != 0) return Role::OTHER;
    const size_t dot = name.find('.', 4);
    *layer = std::stoi(name.substr(4, dot - 4));
    const std::string_view r = std::string_view(name).substr(dot + 1);
    if (r == "attn_q.weight") return Role::ATTN_Q;
    if (r == "attn_k.weight") return Role::ATTN_K;
    if (r == "attn_v.weight") return Role::ATTN_V;
    if (r == "attn_output.weight") return Role::ATTN_OUTPUT;
    if (r == "ffn_gate_exps.weight" || r == "ffn_up_exps.weight") return Role::FFN_GATE_UP;
    if (r == "ffn_down_exps.weight") return Role::FFN_DOWN;
    return Role::OTHER;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third one between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

Type recipe_type(const Config& c, Role role, int layer) {
    const bool more = role == Role::ATTN_V || role == Role::FFN_DOWN ? use_more_bits(layer, c.n_layer) : false;
    switch (c.recipe) {
        case Recipe::Q4_K_M:
        case Recipe::Q5_K_M: {
            const Type base = c.recipe == Recipe::Q4_K_M ? Type::Q4_K : Type::Q5_K;
            if (role == Role::OUTPUT || more) return Type::Q6_K;
            return base;
        }
        case Recipe::Q3_K_XL:
            switch (role) {
                case Role::OUTPUT: return Type::Q6_K;
                case Role::ATTN_V: return Type::Q5_K;
                case Role::FFN_GATE_UP: return Type::Q3_K;
                default: return Type::Q4_K;
            }
        case Recipe::IQ4_XS:
            if (role == Role::OUTPUT) return Type::Q6_K;
            if (role == Role::ATTN_V && c.n_head / c.n_head_kv >= 4) return Type::Q5_K;
            return Type::IQ4_XS;
        case Recipe::NONE: break;
    }
    return Type::F16;  // unreachable: apply_recipe returns early without a recipe
}

// llama.cpp's fallback for rows that are not whole super-blocks (convert_incompatible_tensor).
Type fit_rows(Type t, int64_t row_len) {
    if (row_len % traits(t).block_size == 0) return t;
    switch (t) {
        case Type::Q2_K:
        case Type::Q3_K:
        case Type::IQ4_XS: t = Type::IQ4_NL; break;
        case Type::Q4_K: t = Type::Q5_0; break;
        case Type::Q5_K: t = Type::Q5_1; break;
        case Type::Q6_K: t = Type::Q8_0; break;
        default: break;
    }
    return row_len % traits(t).block_size == 0 ? t : Type::F16;
}

}  // namespace

bool find_recipe(std::string_view name, Recipe* out) {
    for (const RecipeName& r : kRecipes) {
        if (name.size() != std::string_view(r.name).size()) continue;
        bool same = true;
        for (size_t i = 0; i < name.size(); ++i) {
            same = same && std::tolower(static_cast<unsigned char>(name[i])) == r.name[i];
        }
        if (same) {
            *out = r.recipe;
            return true;
        }
    }
    return false;
}

const char* recipe_name(Recipe r) {
    for (const RecipeName& n : kRecipes) {
        if (n.recipe == r) return n.name;
    }
    return "none";
}

uint32_t recipe_file_type(Recipe r) {
    for (const RecipeName& n : kRecipes) {
        if (n.recipe == r) return n.file_type;
    }
    return 0;
}

std::string recipe_names() {
    std::string s;
    for (const RecipeName& r : kRecipes) s += std::string(s.empty() ? "" : ", ") + r.name;
    return s;
}

void apply_recipe(const Config& c, std::vector<TensorSpec>& tensors) {
    if (c.recipe == Recipe::NONE) return;
    for (TensorSpec& t : tensors) {
        int layer = -1;
        const Role role = role_of(t.name, &layer);
        if (role == Role::OTHER) continue;
        t.type = fit_rows(recipe_type(c, role, layer), t.row_len());
    }
}

}  // namespace moe::synth
