// moeinfer.Sampler: the sampler chain (moe_sampler_*) over numpy logits.
#include <pybind11/numpy.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"

namespace moeinfer_py {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Calls keep the GIL: a draw takes microseconds to a few milliseconds, and holding the GIL is what keeps
// two Python threads off one sampler at a time, as the C API requires.
struct PySampler {
    moeinfer::Sampler sampler;
    moe_sampler_params params;  // as created; logit_bias cleared (the library copied it)
    std::vector<moe_logit_bias> bias;
};

// `logits` as one row of float32: 1-D, or 2-D with one row (what Context.decode returns).
FloatArray logits_row(const py::object& logits) {
    auto a = FloatArray::ensure(logits);
    if (!a) throw py::error_already_set();
    if (a.ndim() != 1 && !(a.ndim() == 2 && a.shape(0) == 1)) {
        throw py::value_error("logits must be 1-D or of shape (1, n_vocab), got " + std::to_string(a.ndim()) +
                              " dimensions" + (a.ndim() == 2 ? " with " + std::to_string(a.shape(0)) + " rows" : ""));
    }
    if (a.size() > std::numeric_limits<int32_t>::max()) throw py::value_error("logits has more than 2^31-1 values");
    return a;
}

// A float32 as Python would print its value: the shortest digits that read back as the same float
// (0.95, not 0.949999988079071).
std::string float_repr(float v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    std::string s(buf, end);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

std::vector<moe_logit_bias> bias_entries(const py::object& logit_bias) {
    std::vector<moe_logit_bias> out;
    if (logit_bias.is_none()) return out;
    if (!py::isinstance<py::dict>(logit_bias)) throw py::type_error("Sampler: logit_bias must be a dict {token: bias}");
    for (const auto& [key, value] : logit_bias.cast<py::dict>()) {
        const auto token = key.cast<int64_t>();
        if (token < std::numeric_limits<int32_t>::min() || token > std::numeric_limits<int32_t>::max()) {
            throw py::value_error("Sampler: logit_bias token " + std::to_string(token) + " does not fit in int32");
        }
        out.push_back({static_cast<int32_t>(token), value.cast<float>()});
    }
    return out;
}

std::unique_ptr<PySampler> create(int32_t n_vocab, std::optional<float> temperature, std::optional<int32_t> top_k,
                                  std::optional<float> top_p, std::optional<float> min_p,
                                  std::optional<int32_t> min_keep, std::optional<int32_t> repeat_last_n,
                                  std::optional<float> repeat_penalty, std::optional<float> frequency_penalty,
                                  std::optional<float> presence_penalty, const py::object& logit_bias,
                                  std::optional<uint64_t> seed) {
    // Defaults come from the library (moe_sampler_params_init), not from this file.
    moe_sampler_params p = moeinfer::sampler_params();
    p.temperature = temperature.value_or(p.temperature);
    p.top_k = top_k.value_or(p.top_k);
    p.top_p = top_p.value_or(p.top_p);
    p.min_p = min_p.value_or(p.min_p);
    p.min_keep = min_keep.value_or(p.min_keep);
    p.repeat_last_n = repeat_last_n.value_or(p.repeat_last_n);
    p.repeat_penalty = repeat_penalty.value_or(p.repeat_penalty);
    p.frequency_penalty = frequency_penalty.value_or(p.frequency_penalty);
    p.presence_penalty = presence_penalty.value_or(p.presence_penalty);
    p.seed = seed.value_or(p.seed);
    std::vector<moe_logit_bias> bias = bias_entries(logit_bias);
    p.n_logit_bias = static_cast<int32_t>(bias.size());
    p.logit_bias = bias.empty() ? nullptr : bias.data();
    auto s = moeinfer::Sampler::create(n_vocab, p);
    p.logit_bias = nullptr;
    return std::unique_ptr<PySampler>(new PySampler{std::move(s), p, std::move(bias)});
}

py::tuple apply(PySampler& self, const py::object& logits, std::optional<int32_t> max_n) {
    const FloatArray row = logits_row(logits);
    const auto c = self.sampler.apply(row.data(), static_cast<int32_t>(row.size()), max_n.value_or(-1));
    py::array_t<int32_t> ids(static_cast<py::ssize_t>(c.ids.size()));
    py::array_t<float> probs(static_cast<py::ssize_t>(c.probs.size()));
    std::copy(c.ids.begin(), c.ids.end(), ids.mutable_data());
    std::copy(c.probs.begin(), c.probs.end(), probs.mutable_data());
    return py::make_tuple(ids, probs);
}

std::string repr(const PySampler& self) {
    const moe_sampler_params& p = self.params;
    std::string bias = "{";
    for (size_t i = 0; i < self.bias.size(); ++i) {
        bias += (i ? ", " : "") + std::to_string(self.bias[i].token) + ": " + float_repr(self.bias[i].bias);
    }
    bias += "}";
    const auto f = float_repr;
    return "moeinfer.Sampler(n_vocab=" + std::to_string(self.sampler.n_vocab()) + ", temperature=" + f(p.temperature) +
           ", top_k=" + std::to_string(p.top_k) + ", top_p=" + f(p.top_p) + ", min_p=" + f(p.min_p) +
           ", min_keep=" + std::to_string(p.min_keep) + ", repeat_last_n=" + std::to_string(p.repeat_last_n) +
           ", repeat_penalty=" + f(p.repeat_penalty) + ", frequency_penalty=" + f(p.frequency_penalty) +
           ", presence_penalty=" + f(p.presence_penalty) + ", logit_bias=" + bias +
           ", seed=" + std::to_string(self.sampler.seed()) + ")";
}

}  // namespace

void bind_sampler(py::module_& m) {
    using namespace pybind11::literals;
    const moe_sampler_params d = moeinfer::sampler_params();
    const auto f = float_repr;
    const std::string doc =
        "The sampler chain: logits -> next token (moeinfer.h, \"Sampling\", has the exact semantics).\n\n"
        "Stages in order: penalties over the last repeat_last_n accepted tokens (repeat_penalty divides\n"
        "positive logits and multiplies negative ones; frequency_penalty per occurrence and\n"
        "presence_penalty once are subtracted), logit_bias ({token: bias}; -inf bans), top_k (0: off),\n"
        "top_p (1: off), min_p (0: off), temperature (<= 0: greedy), then a draw from mt19937_64 seeded\n"
        "with `seed` (None: random; Sampler.seed tells which). Arguments left None take the library's\n"
        "defaults: temperature=" + f(d.temperature) + ", top_k=" + std::to_string(d.top_k) + ", top_p=" +
        f(d.top_p) + ", min_p=" + f(d.min_p) + ", min_keep=" + std::to_string(d.min_keep) +
        ", repeat_last_n=" + std::to_string(d.repeat_last_n) + ",\nrepeat_penalty=" + f(d.repeat_penalty) +
        ", frequency_penalty=" + f(d.frequency_penalty) + ", presence_penalty=" + f(d.presence_penalty) +
        ".\n\nValueError names a bad argument (NaN temperature, top_p outside (0, 1], a logit_bias token\n"
        "outside [0, n_vocab), ...). Calls hold the GIL (they are short).";
    py::class_<PySampler>(m, "Sampler", doc.c_str())
        .def(py::init(&create), "n_vocab"_a, py::kw_only(), "temperature"_a = py::none(), "top_k"_a = py::none(),
             "top_p"_a = py::none(), "min_p"_a = py::none(), "min_keep"_a = py::none(),
             "repeat_last_n"_a = py::none(), "repeat_penalty"_a = py::none(), "frequency_penalty"_a = py::none(),
             "presence_penalty"_a = py::none(), "logit_bias"_a = py::none(), "seed"_a = py::none())
        .def(
            "sample",
            [](PySampler& self, const py::object& logits) {
                const FloatArray row = logits_row(logits);
                return self.sampler.sample(row.data(), static_cast<int32_t>(row.size()));
            },
            "logits"_a,
            "The next token (int) from n_vocab logits (1-D, or one row as Context.decode returns). The\n"
            "token is not accepted: call accept() with the tokens kept.")
        .def("apply", &apply, "logits"_a, "max_n"_a = py::none(),
             "The chain without a draw (the PRNG does not move): (ids int32, probs float32) of the candidates\n"
             "left, most probable first, at most max_n of them (None: all).")
        .def("accept", [](PySampler& self, int32_t token) { self.sampler.accept(token); }, "token"_a)
        .def(
            "accept", [](PySampler& self, const std::vector<int32_t>& tokens) { self.sampler.accept(tokens); },
            "tokens"_a,
            "Appends a token or a sequence of tokens (the prompt, then each token kept) to the penalties'\n"
            "history. ValueError (nothing appended) for an id outside [0, n_vocab).")
        .def("reset", [](PySampler& self) { self.sampler.reset(); },
             "Empties the history and re-seeds the PRNG: draws repeat from the start.")
        .def_property_readonly("seed", [](const PySampler& self) { return self.sampler.seed(); },
                               "The seed in use (the drawn one when seed was None).")
        .def_property_readonly("n_vocab", [](const PySampler& self) { return self.sampler.n_vocab(); })
        .def("__repr__", &repr);
}

moeinfer::Sampler* sampler_of(const py::handle& obj) {
    if (obj.is_none()) return nullptr;
    if (!py::isinstance<PySampler>(obj)) {
        throw py::type_error("sampler must be a moeinfer.Sampler or None, got " +
                             py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
    }
    return &obj.cast<PySampler&>().sampler;
}

}  // namespace moeinfer_py
