// moeinfer.synth_write: synthetic models with real MoE shapes and random weights.
#include <optional>

#include "bindings.h"

namespace moeinfer_py {
namespace {

struct Shape {
    int32_t n_layer, n_embd, n_vocab, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff_expert;
};

void synth_write(const py::object& path, const std::string& arch, const std::optional<std::string>& preset,
                 const Shape& s, const std::optional<std::string>& expert_type,
                 const std::optional<std::string>& dense_type, const std::optional<std::string>& recipe,
                 uint64_t seed, float routing_skew, const py::object& progress) {
    const std::string p = fspath(path);
    moe_synth_params params = moeinfer::synth_params(arch);
    // Borrowed by the C call: `preset` outlives it.
    if (preset) params.preset = preset->c_str();
    // 0 keeps the preset's value (the C default); other values are the library's to validate.
    params.n_layer = s.n_layer;
    params.n_embd = s.n_embd;
    params.n_vocab = s.n_vocab;
    params.n_head = s.n_head;
    params.n_head_kv = s.n_head_kv;
    params.head_dim = s.head_dim;
    params.n_expert = s.n_expert;
    params.n_expert_used = s.n_expert_used;
    params.n_ff_expert = s.n_ff_expert;
    if (expert_type) params.expert_type = type_from_name(*expert_type, "synth_write: expert_type");
    if (dense_type) params.dense_type = type_from_name(*dense_type, "synth_write: dense_type");
    if (recipe) params.recipe = recipe->c_str();  // borrowed, like preset
    params.seed = seed;
    params.routing_skew = routing_skew;
    const moeinfer::ProgressFn fn = progress_fn(progress);
    py::gil_scoped_release release;
    moeinfer::synth_write(p, params, fn);
}

}  // namespace

void bind_synth(py::module_& m) {
    using namespace pybind11::literals;
    m.def(
        "synth_write",
        [](const py::object& path, const std::string& arch, const std::optional<std::string>& preset,
           int32_t n_layer, int32_t n_embd, int32_t n_vocab, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
           int32_t n_expert, int32_t n_expert_used, int32_t n_ff_expert, const std::optional<std::string>& expert_type,
           const std::optional<std::string>& dense_type, const std::optional<std::string>& recipe, uint64_t seed,
           float routing_skew, const py::object& progress) {
            const Shape shape{n_layer, n_embd, n_vocab, n_head, n_head_kv, head_dim, n_expert, n_expert_used,
                              n_ff_expert};
            synth_write(path, arch, preset, shape, expert_type, dense_type, recipe, seed, routing_skew, progress);
        },
        "path"_a, "arch"_a = "qwen3moe", py::kw_only(), "preset"_a = py::none(), "n_layer"_a = 0, "n_embd"_a = 0,
        "n_vocab"_a = 0, "n_head"_a = 0, "n_head_kv"_a = 0, "head_dim"_a = 0, "n_expert"_a = 0,
        "n_expert_used"_a = 0, "n_ff_expert"_a = 0, "expert_type"_a = py::none(), "dense_type"_a = py::none(),
        "recipe"_a = py::none(), "seed"_a = 42, "routing_skew"_a = 0.0f, "progress"_a = py::none(),
        R"(Writes a synthetic model (valid GGUF; llama.cpp loads it too) to `path`.

arch: "qwen3moe", "gpt-oss", "glm4moe" or "deepseek2". preset: "qwen3-30b-a3b", "gpt-oss-20b",
"gpt-oss-120b", "glm-4.5-air", "glm-4.5", "deepseek-v3", "kimi-k2", "deepseek-v2-lite" or "tiny" (a few-KB
model for tests; glm4moe also "tiny-air", deepseek2 also "tiny-lite"); None takes
the architecture's full-size preset. Shape arguments > 0 override the preset. expert_type /
dense_type: type names ("q8_0", "mxfp4", "f16", "q4_K", "iq4_xs", ...); None takes the preset's. recipe: "q4_k_m", "q5_k_m", "q3_k_xl" or "iq4_xs",
the type of every weight by its role as llama.cpp's presets choose (then leave expert_type and
dense_type None; moeinfer-synth --help lists what goes where). routing_skew in [0, 1): larger values make a growing set of
experts rarely selected. Streams the file (constant memory); the GIL is released meanwhile.
progress, when given, is called with the fraction done; returning False cancels (CancelledError).)");
}

}  // namespace moeinfer_py
