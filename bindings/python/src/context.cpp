// moeinfer.Context: one sequence over a Model (KV cache, ubatch loop), decoding to numpy logits.
#include <pybind11/numpy.h>

#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

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
    moe_context_params params;  // as created; its borrowed pointers are cleared
    std::string device;
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

int32_t device_from_name(const std::string& device) {
    if (device == "auto") return MOE_DEVICE_AUTO;
    if (device == "cpu") return MOE_DEVICE_CPU;
    if (device == "cuda") return MOE_DEVICE_CUDA;
    if (device == "emulated" || device.rfind("emulated:", 0) == 0) return MOE_DEVICE_EMULATED;
    throw py::value_error("Context: device must be 'auto', 'cpu', 'cuda', 'emulated' or 'emulated:N', got '" + device +
                          "'");
}

// `backend_options` with what "emulated:N" adds: the N emulated devices a context without a device
// list sees (the backend option emulated_devices), as a host with N GPUs shows them.
std::string with_emulated_devices(const std::string& device, const std::optional<std::string>& backend_options) {
    std::string out = backend_options.value_or("");
    if (device.rfind("emulated:", 0) != 0) return out;
    const std::string n = device.substr(9);
    if (n.empty() || n.size() > 1 || n < "1" || n > "8") {
        throw py::value_error("Context: device 'emulated:N' needs a device count N from 1 to 8, got '" + device + "'");
    }
    return out + (out.empty() ? "" : ",") + "emulated_devices=" + n;
}

// A list argument (None: empty) as a vector of T.
template <typename T>
std::vector<T> list_of(const py::object& o, const char* name) {
    if (o.is_none()) return {};
    if (!py::isinstance<py::sequence>(o) || py::isinstance<py::str>(o)) {
        throw py::type_error(std::string("Context: ") + name + " must be a list or None");
    }
    return o.cast<std::vector<T>>();
}

int32_t split_mode_from_name(const std::string& mode) {
    if (mode == "none") return MOE_SPLIT_NONE;
    if (mode == "layer") return MOE_SPLIT_LAYER;
    if (mode == "row") return MOE_SPLIT_ROW;
    throw py::value_error("Context: split_mode must be 'none', 'layer' or 'row', got '" + mode + "'");
}

// The name of a context's resolved device (never "auto").
std::string device_name(int32_t device) {
    if (device == MOE_DEVICE_CUDA) return "cuda";
    if (device == MOE_DEVICE_EMULATED) return "emulated";
    return "cpu";
}

// tensor_overrides as the C API's one string: None, "re=BACKEND[,...]" or a list of such entries.
std::string overrides_string(const py::object& overrides) {
    if (overrides.is_none()) return "";
    if (py::isinstance<py::str>(overrides)) return overrides.cast<std::string>();
    if (!py::isinstance<py::sequence>(overrides)) {
        throw py::type_error("Context: tensor_overrides must be a str, a list of str or None");
    }
    std::string joined;
    for (const py::handle item : overrides) {
        if (!py::isinstance<py::str>(item)) throw py::type_error("Context: tensor_overrides entries must be str");
        joined += (joined.empty() ? "" : ",") + item.cast<std::string>();
    }
    return joined;
}

std::unique_ptr<PyContext> create(const py::object& model_obj, int32_t n_ctx, int32_t n_ubatch, int32_t n_threads,
                                  const std::string& device, const py::object& tensor_overrides, int32_t n_cpu_moe,
                                  int32_t n_gpu_layers, const py::object& vram_budget,
                                  const std::optional<moe_sched_policy>& policy, const py::object& progress,
                                  const std::optional<std::string>& backend_options, const py::object& devices_obj,
                                  const py::object& tensor_split_obj, int32_t main_gpu, const std::string& split_mode) {
    const int32_t device_id = device_from_name(device);
    const std::vector<int32_t> devices = list_of<int32_t>(devices_obj, "devices");
    const std::string options = with_emulated_devices(device, backend_options);
    const std::vector<float> tensor_split = list_of<float>(tensor_split_obj, "tensor_split");
    // vram_budget: one size for every device, or a list of one per device.
    std::vector<uint64_t> budgets;
    uint64_t budget = 0;
    if (py::isinstance<py::int_>(vram_budget)) {
        budget = vram_budget.cast<uint64_t>();
    } else {
        budgets = list_of<uint64_t>(vram_budget, "vram_budget");
    }
    if (!py::isinstance<moeinfer::Model>(model_obj)) {
        throw py::type_error("Context: model must be a moeinfer.Model, got " +
                             py::str(py::type::handle_of(model_obj).attr("__name__")).cast<std::string>());
    }
    auto& model = model_obj.cast<moeinfer::Model&>();
    const std::string overrides = overrides_string(tensor_overrides);
    moe_context_params params = moeinfer::context_params();
    params.n_ctx = n_ctx;
    params.n_ubatch = n_ubatch;
    params.n_threads = n_threads;
    params.device = device_id;
    // Borrowed by the C call: `overrides` and `policy` outlive it.
    params.tensor_overrides = overrides.empty() ? nullptr : overrides.c_str();
    params.n_cpu_moe = n_cpu_moe;
    params.n_gpu_layers = n_gpu_layers;
    params.vram_budget = budget;
    // Borrowed by the C call like the strings: the vectors outlive it.
    params.devices = devices.empty() ? nullptr : devices.data();
    params.n_devices = static_cast<int32_t>(devices.size());
    params.tensor_split = tensor_split.empty() ? nullptr : tensor_split.data();
    params.n_tensor_split = static_cast<int32_t>(tensor_split.size());
    params.vram_budgets = budgets.empty() ? nullptr : budgets.data();
    params.n_vram_budgets = static_cast<int32_t>(budgets.size());
    params.main_gpu = main_gpu;
    params.split_mode = split_mode_from_name(split_mode);
    params.policy = policy ? &*policy : nullptr;
    params.backend_options = options.empty() ? nullptr : options.c_str();
    const int32_t n_vocab = model.info().n_vocab;
    const moeinfer::ProgressFn fn = progress_fn(progress);
    std::optional<moeinfer::Context> created;
    {
        // Locking the weights' pages (read from disk when the file is cold), uploads and the KV cache
        // take a while.
        py::gil_scoped_release release;
        created.emplace(moeinfer::Context::create(model, params, fn));
    }
    moeinfer::Context ctx = std::move(*created);
    params.tensor_overrides = nullptr;
    params.policy = nullptr;
    params.backend_options = nullptr;
    params.devices = nullptr;
    params.tensor_split = nullptr;
    params.vram_budgets = nullptr;
    params.device = ctx.device();
    return std::unique_ptr<PyContext>(
        new PyContext{model_obj, std::move(ctx), params, device_name(params.device), n_vocab, {}});
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

const char* stop_reason_name(int32_t reason) {
    switch (reason) {
        case MOE_STOP_EOG: return "eog";
        case MOE_STOP_STRING: return "stop";
        case MOE_STOP_CALLBACK: return "callback";
        case MOE_STOP_CONTEXT_FULL: return "context_full";
        default: return "max_tokens";
    }
}

// moe_generate without the GIL; on_piece (a callable taking a str, returning False to stop) is called
// with the GIL held. Context.generate / chat (moeinfer/generation.py) build on this.
py::dict generate_ids(PyContext& self, const py::object& prompt_obj, const py::object& sampler_obj, int32_t max_tokens,
                      const std::vector<std::string>& stop, bool render_special, const py::object& on_piece) {
    const Int32Array prompt_arr = as_int32_vector(prompt_obj, "prompt");
    const std::vector<int32_t> prompt(prompt_arr.data(), prompt_arr.data() + prompt_arr.size());
    moeinfer::Sampler* sampler = sampler_of(sampler_obj);
    moeinfer::GenerateOptions options;
    options.max_tokens = max_tokens;
    options.stop = stop;
    options.render_special = render_special;
    moeinfer::PieceFn fn;
    if (!on_piece.is_none()) {
        fn = [&on_piece](const char* text, size_t len) {
            py::gil_scoped_acquire gil;
            // Pieces are whole UTF-8 characters; "replace" keeps invalid bytes of a malformed vocabulary visible.
            py::object piece = py::reinterpret_steal<py::object>(
                PyUnicode_DecodeUTF8(text, static_cast<py::ssize_t>(len), "replace"));
            if (!piece) throw py::error_already_set();
            const py::object go_on = on_piece(piece);
            return go_on.is_none() || go_on.cast<bool>();
        };
    }
    moeinfer::GenerateResult r = locked(self, [&](moeinfer::Context& c) {
        return moeinfer::generate(c, prompt, sampler, options, fn);
    });
    py::dict out;
    out["tokens"] = r.tokens;
    out["n_prompt_reused"] = r.stats.n_prompt_reused;
    out["n_prompt_decoded"] = r.stats.n_prompt_decoded;
    out["n_generated"] = r.stats.n_generated;
    out["stop_reason"] = stop_reason_name(r.stats.stop_reason);
    out["t_prompt_s"] = r.stats.t_prompt_s;
    out["t_gen_s"] = r.stats.t_gen_s;
    return out;
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

// The recorded ubatches as a dict of equal-length numpy arrays (one per moe_ubatch_timing field).
py::dict timeline(PyContext& self) {
    struct Record {
        std::vector<moe_ubatch_timing> entries;
        uint64_t dropped = 0;
    };
    const Record r = locked(self, [](moeinfer::Context& c) {
        Record out;
        out.entries = c.timeline(&out.dropped);
        return out;
    });
    const auto n = static_cast<py::ssize_t>(r.entries.size());
    py::dict d;
    const auto column = [&](const char* name, auto field) {
        using T = std::decay_t<decltype(r.entries[0].*field)>;
        py::array_t<T> a(n);
        for (py::ssize_t i = 0; i < n; ++i) a.mutable_data()[i] = r.entries[static_cast<size_t>(i)].*field;
        d[name] = a;
    };
    column("n_tokens", &moe_ubatch_timing::n_tokens);
    py::array_t<bool> ok(n);
    for (py::ssize_t i = 0; i < n; ++i) ok.mutable_data()[i] = r.entries[static_cast<size_t>(i)].ok != 0;
    d["ok"] = ok;
    column("t_start", &moe_ubatch_timing::t_start);
    column("t_end", &moe_ubatch_timing::t_end);
    column("seconds_host_compute", &moe_ubatch_timing::seconds_host_compute);
    column("seconds_device_submit", &moe_ubatch_timing::seconds_device_submit);
    column("seconds_wait", &moe_ubatch_timing::seconds_wait);
    column("bytes_weights", &moe_ubatch_timing::bytes_weights);
    column("bytes_activations", &moe_ubatch_timing::bytes_activations);
    d["dropped"] = r.dropped;
    return d;
}

template <class T>
py::dict per_op(const T (&values)[MOE_OFFLOAD_OP_COUNT]) {
    py::dict d;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        d[py::str(moeinfer::offload_op_name(op).value_or("op" + std::to_string(op)))] = values[op];
    }
    return d;
}

// A field of moe_sched_stats as Python: per-op arrays as {op name: value}.
py::object stats_value(const uint64_t (&values)[MOE_OFFLOAD_OP_COUNT]) { return per_op(values); }
py::object stats_value(const int32_t (&values)[MOE_OFFLOAD_OP_COUNT]) { return per_op(values); }
py::object stats_value(const double (&values)[MOE_OFFLOAD_OP_COUNT]) { return per_op(values); }
template <class T>
py::object stats_value(T value) {
    return py::cast(value);
}

py::dict stats_dict(const moe_sched_stats& s) {
    py::dict d;
#define MOE_STATS_ITEM(type, name, dims) d[#name] = stats_value(s.name);
    MOE_SCHED_STATS_COUNTERS(MOE_STATS_ITEM)
    MOE_SCHED_STATS_CONTEXT(MOE_STATS_ITEM)
#undef MOE_STATS_ITEM
    // By name ("measured", ...) rather than the moe_threshold_source number.
    py::dict sources;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        const char* name = moe_threshold_source_name(s.offload_min_batch_source[op]);
        sources[py::str(moeinfer::offload_op_name(op).value_or("op" + std::to_string(op)))] = name ? name : "?";
    }
    d["offload_min_batch_source"] = sources;
    return d;
}

py::dict stats(PyContext& self) {
    return stats_dict(locked(self, [](moeinfer::Context& c) { return c.stats(); }));
}

py::dict device_stats(PyContext& self, int32_t index) {
    return stats_dict(locked(self, [index](moeinfer::Context& c) { return c.device_stats(index); }));
}

const char* device_kind_name(int32_t kind) {
    switch (kind) {
        case MOE_DEVICE_CPU: return "cpu";
        case MOE_DEVICE_CUDA: return "cuda";
        case MOE_DEVICE_EMULATED: return "emulated";
        default: return "?";
    }
}

py::list devices(PyContext& self) {
    const std::vector<moe_device_info> infos = locked(self, [](moeinfer::Context& c) {
        std::vector<moe_device_info> out;
        for (int32_t i = 0; i < c.n_devices(); ++i) out.push_back(c.device_info(i));
        return out;
    });
    py::list out;
    for (const moe_device_info& d : infos) {
        py::dict e;
        e["kind"] = device_kind_name(d.kind);
        e["ordinal"] = d.ordinal;
        e["n_layers"] = d.n_layers;
        out.append(e);
    }
    return out;
}

py::array_t<uint64_t> expert_counts(PyContext& self) {
    struct Counts {
        moe_sched_stats stats;
        std::vector<uint64_t> values;
    };
    const Counts c = locked(self, [](moeinfer::Context& ctx) { return Counts{ctx.stats(), ctx.expert_counts()}; });
    const auto n_layer = static_cast<py::ssize_t>(c.stats.n_layer);
    const auto n_expert = static_cast<py::ssize_t>(c.stats.n_expert);
    if (n_layer < 0 || n_expert < 0 || static_cast<size_t>(n_layer * n_expert) != c.values.size()) {
        throw moeinfer::Error(MOE_STATUS_INTERNAL, "expert_counts: " + std::to_string(c.values.size()) +
                                                       " counts for " + std::to_string(n_layer) + " layers x " +
                                                       std::to_string(n_expert) + " experts");
    }
    py::array_t<uint64_t> out({n_layer, n_expert});
    if (!c.values.empty()) std::memcpy(out.mutable_data(), c.values.data(), c.values.size() * sizeof(uint64_t));
    return out;
}

py::dict expert_cache_layers(PyContext& self) {
    const moeinfer::Context::ExpertCacheLayers c =
        locked(self, [](moeinfer::Context& ctx) { return ctx.expert_cache_layers(); });
    auto array = [](const std::vector<uint64_t>& v) {
        py::array_t<uint64_t> a(static_cast<py::ssize_t>(v.size()));
        if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(uint64_t));
        return a;
    };
    py::dict d;
    d["hits"] = array(c.hits);
    d["misses"] = array(c.misses);
    d["bytes_saved"] = array(c.bytes_saved);
    return d;
}

py::tuple tensor_location(PyContext& self, const std::string& name) {
    const std::optional<moeinfer::TensorLocation> where =
        locked(self, [&name](moeinfer::Context& c) { return c.tensor_location(name); });
    if (!where) throw py::key_error("no tensor named '" + name + "' in the model");
    return py::make_tuple(where->location == MOE_LOCATION_DEVICE ? "device" : "host", where->duplicated);
}

}  // namespace

void bind_context(py::module_& m) {
    using namespace pybind11::literals;
    m.def(
        "backend_options_help", [] { return std::string(moe_backend_options_help()); },
        "The keys Context(backend_options=...) takes, their values, defaults and environment variables, as text.");
    py::class_<PyContext>(m, "Context",
                          R"(One sequence over a Model: KV cache, micro-batching (ubatches), logits.

The context keeps its Model alive. Use a context from one thread at a time (concurrent calls wait
for each other); several contexts may share a model.)")
        .def(py::init(&create), "model"_a, "n_ctx"_a = 4096, "n_ubatch"_a = 512, "n_threads"_a = 0, "device"_a = "auto",
             py::kw_only(), "tensor_overrides"_a = py::none(), "n_cpu_moe"_a = 0, "n_gpu_layers"_a = -1,
             "vram_budget"_a = 0, "policy"_a = py::none(), "progress"_a = py::none(), "backend_options"_a = py::none(),
             "devices"_a = py::none(), "tensor_split"_a = py::none(), "main_gpu"_a = 0, "split_mode"_a = "layer",
             R"(Creates a context on `model`.

n_ctx: KV cache capacity in tokens. n_ubatch: tokens per graph evaluation (longer inputs are
split). n_threads: CPU threads, 0 for all cores. device: "auto" (the default) is "cuda" when this
build has CUDA and a GPU is present, else "cpu" (the `device` property tells which); "cpu";
"cuda" for the GPUs plus the CPU (NotImplementedError without CUDA in this build, RuntimeError
without a GPU); "emulated" for the same hybrid scheduling with a host-memory backend playing the
GPU (testing; slower than "cpu"); "emulated:N" plays a host with N devices (backend option
emulated_devices=N). The placement arguments below apply to device contexts only: a
context that "auto" made a CPU context ignores them, as "cpu" does.

Placement of the weights (device contexts), first match wins:
tensor_overrides: llama.cpp's -ot rules, "regex=BACKEND" or a list of them (e.g. "exps=CPU";
BACKEND is CPU for host RAM, GPU / CUDA0 / DEVICE for device memory). n_cpu_moe: the expert
tensors of layers 0 .. n_cpu_moe-1 stay in host RAM. n_gpu_layers: the last n_gpu_layers layers
go to the device (-1: all). vram_budget: bytes of device memory for weights (0: what is free);
expert tensors move to host RAM until the rest fits; a list gives one budget per device.
policy: a moeinfer.Policy (None: defaults).

Several devices (llama.cpp's -dev, -ts, -mg, -sm): devices: the device ordinals to use (None: every
GPU for "cuda", 0 .. N-1 for "emulated:N"); each layer (weights, KV cache) belongs to one device and
runs there. tensor_split: proportions of the layers per device (None: the budgets, else free
memory). split_mode: "layer" (default), "none" (only devices[main_gpu]) or "row" (not implemented).
In tensor_overrides, CUDAn names device n of the list. The default, with several devices visible and
none of devices, tensor_split or an override naming a device given: the devices filled one after the
other in order of free memory (of their vram_budget where given), so that a model that fits one stays
on it, experts spilling to host RAM only when all are full (docs/MULTI_GPU.md); devices=[0] or
split_mode="none" keep to one GPU. The `devices` property says which were used.
Host-resident weights are used in place from the model's file, page-locked where the device allows
(stats()["weights_host_pinned_bytes"]), not copied.

backend_options: backend switches, "key=value[,key=value...]" (moeinfer.backend_options_help()
lists the keys), e.g. "cuda_graphs=off,offload_calibration=off"; a key left out takes its
environment variable (docs/ENVIRONMENT.md), else its default. None: none.

progress, when given, is called with the fraction done of creation's long work (locking the
host-resident weights' pages, which reads them from disk when the file is cold, then uploading the
device-resident ones); returning False cancels (CancelledError). The GIL is released meanwhile.

Raises ValueError for bad values (a bad regex or backend, an unknown backend option or a value it
does not take names its entry), MemoryError when the
KV cache or the weights cannot be allocated or do not fit the budget.)")
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
        .def("_generate", &generate_ids, "prompt"_a, "sampler"_a = py::none(), "max_tokens"_a = 128,
             "stop"_a = std::vector<std::string>{}, "render_special"_a = false, "on_piece"_a = py::none(),
             "moe_generate on token ids; returns a dict of the generated ids and statistics (see Context.generate).")
        .def(
            "set_timeline",
            [](PyContext& self, int32_t capacity) {
                locked(self, [capacity](moeinfer::Context& c) { c.set_timeline(capacity); });
            },
            "capacity"_a,
            "Records the timing of the last `capacity` ubatches from now on (0: off, the default), dropping what "
            "was recorded; times count from this call. reset_stats() leaves the record alone. ValueError for a "
            "capacity outside [0, 1048576].")
        .def("timeline", &timeline,
             "The recorded ubatches, oldest first: a dict of numpy arrays 'n_tokens', 'ok', 't_start', 't_end' "
             "(seconds since set_timeline), 'seconds_host_compute', 'seconds_device_submit', 'seconds_wait' "
             "(the host blocked on the device: its uploads and kernels), 'bytes_weights' (uploaded) and "
             "'bytes_activations', plus 'dropped' (ubatches the ring no longer holds).")
        .def("profile", &profile,
             "Per op kind since profiling was turned on: a list of dicts with keys 'op' (e.g. \"MUL_MAT_ID\"), "
             "'backend' (\"cpu\", ...), 'count' (ops evaluated) and 'seconds' (wall time).")
        .def(
            "set_policy",
            [](PyContext& self, const moe_sched_policy& policy) {
                const moe_sched_policy p = policy;  // copied while holding the GIL
                locked(self, [&p](moeinfer::Context& c) { c.set_policy(p); });
            },
            "policy"_a,
            "Replaces the scheduling policy (a moeinfer.Policy) from the next decode on. ValueError for bad values.")
        .def_property_readonly(
            "policy",
            [](PyContext& self) { return locked(self, [](moeinfer::Context& c) { return c.policy(); }); },
            "The policy in use (a new moeinfer.Policy), with the default thresholds resolved to numbers.")
        .def_property_readonly(
            "device", [](const PyContext& self) { return self.device; },
            "\"cpu\", \"cuda\" or \"emulated\": where the context computes (\"auto\" resolved).")
        .def("tensor_location", &tensor_location, "name"_a,
             "Where the weight tensor `name` lives: (\"host\" or \"device\", duplicated), duplicated being True "
             "when a copy is also kept on the other side (bias duplication). KeyError for an unknown name.")
        .def("stats", &stats,
             R"(Scheduler statistics since creation or reset_stats(), as a dict.

Keys: n_ubatches, n_splits (runs of consecutive ops on one side), bytes_weights_full (weights
uploaded whole), bytes_weights_experts (expert slices uploaded by expert_copy "active"),
bytes_weights_skipped (expert bytes "active" did not upload), bytes_activations, n_weight_copies,
n_activation_copies, n_id_readbacks, n_offloaded and n_kept_host (dicts by op name: ops with host
weights computed on the device / on the host), n_ops_host, n_ops_device, seconds_total,
seconds_host_compute, seconds_wait, seconds_device_submit, n_split_layers, n_split_host_experts and
n_split_trials (expert split), weights_host_bytes and weights_device_bytes (placement),
weights_host_pinned_bytes (of the host-resident weights of a device context, the bytes page-locked
in place for fast uploads; the rest are pageable), n_layer and n_expert; n_cache_hits, n_cache_misses
and bytes_cache_saved (the expert cache, Policy.expert_cache: experts an offloaded op found already on
the device, those it uploaded, and the bytes the hits saved; counted while the cache is on).)")
        .def("device_stats", &device_stats, "index"_a,
             R"(The statistics of device `index` of the context (an index into devices) alone, as a dict with
the keys of stats(): the counters of that device's scheduler (its layers' ops, the uploads to it,
the bytes_between_devices it sent through host memory or received), the placement figures of its
layers' weights and the offload thresholds in effect on it. Over devices, every counter and placement
figure sums to stats()' except n_ubatches (there the most any device ran); one device: index 0 gives
stats(). ValueError for an index out of range.)")
        .def_property_readonly("devices", &devices,
             R"(The devices the context computes on, in the order of its device list (the first holds the
token embeddings and is CUDA0 of tensor_overrides): a list of dicts with "kind" ("cpu", "cuda" or
"emulated"), "ordinal" (the backend's device number) and "n_layers" (model layers it holds). One
entry for a context over one device and for a CPU context. Without a devices argument, the devices
the default chose.)")
        .def("expert_cache_layers", &expert_cache_layers,
             "The expert cache's counts per layer since creation or reset_stats(): a dict of new uint64 "
             "arrays [n_layer] 'hits', 'misses' and 'bytes_saved' (stats()' n_cache_hits, n_cache_misses "
             "and bytes_cache_saved by layer).")
        .def(
            "save_expert_profile",
            [](PyContext& self, const std::string& path) {
                locked(self, [&](moeinfer::Context& c) { c.save_expert_profile(path); });
            },
            "path"_a,
            "Writes the expert counts (expert_counts()) to path as an activation profile, which "
            "Model.set_expert_profile reads before the next context is created. OSError names the path.")
        .def(
            "resident_experts",
            [](PyContext& self) {
                const moeinfer::Context::ResidentExperts r =
                    locked(self, [](moeinfer::Context& c) { return c.resident_experts(); });
                py::array_t<int32_t> n(static_cast<py::ssize_t>(r.n_experts.size()));
                py::array_t<uint64_t> b(static_cast<py::ssize_t>(r.bytes.size()));
                if (!r.n_experts.empty()) std::memcpy(n.mutable_data(), r.n_experts.data(), r.n_experts.size() * sizeof(int32_t));
                if (!r.bytes.empty()) std::memcpy(b.mutable_data(), r.bytes.data(), r.bytes.size() * sizeof(uint64_t));
                py::dict d;
                d["n_experts"] = n;
                d["bytes"] = b;
                return d;
            },
            "Per layer, the experts whose weights are in device memory and their bytes: a dict of new "
            "arrays [n_layer] 'n_experts' (int32: n_expert for a layer on the device, fewer for a partly "
            "resident one, 0 for one in host RAM) and 'bytes' (uint64, padded to 256 per tensor or slice).")
        .def("expert_counts", &expert_counts,
             "Tokens that selected each expert since creation or reset_stats(): a new uint64 array "
             "[n_layer, n_expert].")
        .def(
            "reset_stats", [](PyContext& self) { locked(self, [](moeinfer::Context& c) { c.reset_stats(); }); },
            "Zeroes the statistics and expert counts (the placement figures stay).")
        .def("__repr__", [](const PyContext& self) {
            return "<moeinfer.Context n_ctx=" + std::to_string(self.params.n_ctx) +
                   " n_ubatch=" + std::to_string(self.params.n_ubatch) + " device=" + self.device + " on " +
                   py::repr(self.model_ref).cast<std::string>() + ">";
        });
}

}  // namespace moeinfer_py
