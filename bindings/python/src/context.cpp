// moeinfer.Context: one sequence over a Model (KV cache, ubatch loop), decoding to numpy logits.
#include <pybind11/numpy.h>

#include <cstring>
#include <limits>
#include <mutex>

#include "bindings.h"

namespace moeinfer_py {
namespace {

// forcecast: values are range-checked before any conversion (as_int32_vector).
using Int32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// The Python object: the C++ Context plus a reference to the Python Model, which the C API requires
// to outlive the context. Members are destroyed in reverse order, so the context goes first.
struct PyContext {
    py::object model_ref;
    moeinfer::Context ctx;
    moe_context_params params;
    int32_t n_vocab;
    // The C API allows one thread at a time per context, and decode runs without the GIL. Lock it
    // only with the GIL released: a thread holding it may be waiting for the GIL.
    std::mutex mutex;
};

// `obj` (a numpy array or a sequence of ints) as a 1-D C-contiguous int32 array. Wider integer
// types are accepted when every value fits; anything else is a TypeError / ValueError naming `what`.
Int32Array as_int32_vector(const py::object& obj, const char* what) {
    py::array a = py::array::ensure(obj);
    if (!a) throw py::error_already_set();
    if (a.ndim() != 1) {
        throw py::value_error(std::string(what) + " must be 1-D, got " + std::to_string(a.ndim()) + " dimensions");
    }
    // An empty list becomes a float64 array; with no values there is nothing to convert.
    if (a.size() == 0) return Int32Array(0);
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u') {
        throw py::type_error(std::string(what) + " must hold integers, got dtype " +
                             py::str(a.dtype()).cast<std::string>());
    }
    if (!a.dtype().is(py::dtype::of<int32_t>())) {
        // Widen to int64 (uint64 values past INT64_MAX wrap negative and fail the range check too).
        const auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
        if (!wide) throw py::error_already_set();
        const int64_t* v = wide.data();
        for (py::ssize_t i = 0; i < wide.size(); ++i) {
            if (v[i] < std::numeric_limits<int32_t>::min() || v[i] > std::numeric_limits<int32_t>::max() ||
                (kind == 'u' && v[i] < 0)) {
                throw py::value_error(std::string(what) + "[" + std::to_string(i) + "] = " +
                                      py::str(a[py::int_(i)]).cast<std::string>() + " does not fit in int32");
            }
        }
    }
    auto out = Int32Array::ensure(a);  // converts, or returns `a` itself when it is already int32
    if (!out) throw py::error_already_set();
    return out;
}

std::unique_ptr<PyContext> create(const py::object& model_obj, int32_t n_ctx, int32_t n_ubatch, int32_t n_threads,
                                  const std::string& device) {
    if (device != "cpu" && device != "cuda") throw py::value_error("Context: device must be 'cpu' or 'cuda', got '" + device + "'");
    if (!py::isinstance<moeinfer::Model>(model_obj)) {
        throw py::type_error("Context: model must be a moeinfer.Model, got " +
                             py::str(py::type::handle_of(model_obj).attr("__name__")).cast<std::string>());
    }
    auto& model = model_obj.cast<moeinfer::Model&>();
    moe_context_params params = moeinfer::context_params();
    params.n_ctx = n_ctx;
    params.n_ubatch = n_ubatch;
    params.n_threads = n_threads;
    params.device = device == "cuda" ? MOE_DEVICE_CUDA : MOE_DEVICE_CPU;
    const int32_t n_vocab = model.info().n_vocab;
    moe_context* raw = nullptr;
    moe_status status = MOE_STATUS_OK;
    {
        py::gil_scoped_release release;  // allocating the KV cache of a large n_ctx takes a while
        status = moe_context_create(model.get(), &params, &raw);
    }
    moeinfer::check(status);
    return std::unique_ptr<PyContext>(new PyContext{model_obj, moeinfer::Context(raw), params, n_vocab, {}});
}

py::array_t<float> decode(PyContext& self, const py::object& tokens_obj, const py::object& positions_obj,
                          bool logits_all) {
    const Int32Array tokens = as_int32_vector(tokens_obj, "tokens");
    Int32Array positions;
    if (!positions_obj.is_none()) {
        positions = as_int32_vector(positions_obj, "positions");
        if (positions.size() != tokens.size()) {
            throw py::value_error("positions has " + std::to_string(positions.size()) + " entries for " +
                                  std::to_string(tokens.size()) + " tokens");
        }
    }
    // The output is allocated up front, so that the logits are copied once, without the GIL.
    const py::ssize_t n_rows = logits_all ? tokens.size() : 1;
    py::array_t<float> out({n_rows, static_cast<py::ssize_t>(self.n_vocab)});
    float* dst = out.mutable_data();
    const int32_t* tok = tokens.data();
    const int32_t* pos = positions_obj.is_none() ? nullptr : positions.data();
    const auto n = static_cast<size_t>(tokens.size());
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(self.mutex);
        const moeinfer::Logits l = self.ctx.decode_n(tok, n, pos, pos ? n : 0, logits_all);
        // Guards the shape promised to Python against a library that answered otherwise.
        if (l.n_rows != n_rows || l.n_vocab != self.n_vocab) {
            throw moeinfer::Error(MOE_STATUS_INTERNAL, "decode returned " + std::to_string(l.n_rows) + " x " +
                                                           std::to_string(l.n_vocab) + " logits, expected " +
                                                           std::to_string(n_rows) + " x " +
                                                           std::to_string(self.n_vocab));
        }
        std::memcpy(dst, l.data, l.size() * sizeof(float));
    }
    return out;
}

// Runs f(ctx) under the context's lock, with the GIL released while waiting for it.
template <class F>
auto locked(PyContext& self, F&& f) {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(self.mutex);
    return f(self.ctx);
}

py::list profile(PyContext& self) {
    const std::vector<moeinfer::OpProfile> entries =
        locked(self, [](moeinfer::Context& c) { return c.profile(); });
    py::list out;
    for (const moeinfer::OpProfile& e : entries) {
        py::dict d;
        d["op"] = e.op;
        d["backend"] = e.backend;
        d["count"] = e.count;
        d["seconds"] = e.seconds;
        out.append(d);
    }
    return out;
}

}  // namespace

void bind_context(py::module_& m) {
    using namespace pybind11::literals;
    py::class_<PyContext>(m, "Context",
                          R"(One sequence over a Model: KV cache, micro-batching (ubatches), logits.

The context keeps its Model alive. Use a context from one thread at a time (concurrent calls wait
for each other); several contexts may share a model.)")
        .def(py::init(&create), "model"_a, "n_ctx"_a = 4096, "n_ubatch"_a = 512, "n_threads"_a = 0, "device"_a = "cpu",
             R"(Creates a context on `model`.

n_ctx: KV cache capacity in tokens. n_ubatch: tokens per graph evaluation (longer inputs are
split). n_threads: CPU threads, 0 for all cores. device: "cpu", or "cuda" to run every op on GPU 0
(NotImplementedError without CUDA in this build, RuntimeError without a GPU). Raises ValueError for
bad values, MemoryError when the KV cache or the weights cannot be allocated.)")
        .def("decode", &decode, "tokens"_a, "positions"_a = py::none(), "logits_all"_a = false,
             R"(Evaluates `tokens` (1-D integers, e.g. np.int32) and returns their logits.

Returns a new float32 array [n_rows, n_vocab]: every token's row when logits_all, else only the
last token's (n_rows = 1). positions=None continues the sequence at n_past; otherwise they are
consecutive and start at or before n_past (starting earlier rewinds the sequence). The GIL is
released meanwhile. ValueError for an empty input, a token id outside [0, n_vocab), bad positions
or a full context; n_past is unchanged after a failure.)")
        .def_property_readonly(
            "n_past", [](PyContext& self) { return locked(self, [](moeinfer::Context& c) { return c.n_past(); }); },
            "Tokens in the KV cache: the position the next decode continues from.")
        .def_property_readonly(
            "n_ctx", [](const PyContext& self) { return self.params.n_ctx; }, "KV cache capacity in tokens.")
        .def_property_readonly(
            "n_ubatch", [](const PyContext& self) { return self.params.n_ubatch; }, "Tokens per graph evaluation.")
        .def_property_readonly(
            "n_vocab", [](const PyContext& self) { return self.n_vocab; }, "Columns of the logits.")
        .def_property_readonly(
            "model", [](const PyContext& self) { return self.model_ref; }, "The Model this context runs.")
        .def(
            "kv_clear", [](PyContext& self) { locked(self, [](moeinfer::Context& c) { c.kv_clear(); }); },
            "Empties the KV cache; the next decode starts a new sequence at position 0.")
        .def(
            "set_profiling",
            [](PyContext& self, bool enabled) {
                locked(self, [enabled](moeinfer::Context& c) { c.set_profiling(enabled); });
            },
            "enabled"_a,
            "Turns per-op timing on or off and resets it (it synchronises after every op, which costs a little).")
        .def("profile", &profile,
             "Per op kind since profiling was turned on: a list of dicts with keys 'op' (e.g. \"MUL_MAT_ID\"), "
             "'backend' (\"cpu\", ...), 'count' (ops evaluated) and 'seconds' (wall time).")
        .def("__repr__", [](const PyContext& self) {
            return "<moeinfer.Context n_ctx=" + std::to_string(self.params.n_ctx) +
                   " n_ubatch=" + std::to_string(self.params.n_ubatch) + " on " +
                   py::repr(self.model_ref).cast<std::string>() + ">";
        });
}

}  // namespace moeinfer_py
