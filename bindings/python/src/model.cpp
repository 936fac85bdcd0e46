// moeinfer.Model: load a GGUF model, read its hyper-parameters, tensor table, tensors and metadata.
#include <pybind11/numpy.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"

namespace moeinfer_py {
namespace {

// Model.info: the C struct's numbers plus owned copies of its borrowed strings, so an info object
// may outlive its model.
struct ModelInfo : moe_model_info {
    explicit ModelInfo(const moe_model_info& c)
        : moe_model_info(c),
          architecture_str(c.architecture != nullptr ? c.architecture : ""),
          name_str(c.name != nullptr ? c.name : "") {}
    std::string architecture_str;
    std::string name_str;
};

// Shapes in numpy order: the reverse of GGUF's ne (ne[0], the contiguous dimension, last).
std::vector<py::ssize_t> numpy_shape(const moe_tensor_info& t) {
    std::vector<py::ssize_t> shape;
    for (int32_t d = t.n_dims - 1; d >= 0; --d) shape.push_back(static_cast<py::ssize_t>(t.ne[d]));
    return shape;
}

std::string type_name_of(int32_t type) {
    return moeinfer::type_name(type).value_or("type" + std::to_string(type));
}

struct TensorInfo {
    explicit TensorInfo(const moe_tensor_info& t)
        : name(t.name != nullptr ? t.name : ""), type(type_name_of(t.type)), shape(numpy_shape(t)),
          n_bytes(t.n_bytes), file_offset(t.file_offset) {}
    std::string name;
    std::string type;
    std::vector<py::ssize_t> shape;
    uint64_t n_bytes;
    uint64_t file_offset;
};

py::tuple as_tuple(const std::vector<py::ssize_t>& v) {
    py::tuple t(v.size());
    for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
    return t;
}

int32_t tensor_index(const moeinfer::Model& model, const std::string& name) {
    const std::optional<int32_t> index = model.find_tensor(name);
    if (!index) throw py::key_error("no tensor named '" + name + "' in the model");
    return *index;
}

// raw=False: float32 values with the tensor's shape. raw=True: the stored bytes, shaped like
// gguf.GGUFReader's quantised tensors: (..., bytes per row).
py::array tensor(const moeinfer::Model& model, const std::string& name, bool raw) {
    const int32_t index = tensor_index(model, name);
    const moe_tensor_info t = model.tensor(index);
    std::vector<py::ssize_t> shape = numpy_shape(t);
    if (shape.empty()) shape.push_back(1);

    if (raw || t.type == MOE_TYPE_F32) {
        if (raw) shape.back() = static_cast<py::ssize_t>(moeinfer::row_bytes(t.type, t.ne[0]));
        py::array out = raw ? py::array(py::array_t<uint8_t>(shape)) : py::array(py::array_t<float>(shape));
        if (static_cast<uint64_t>(out.nbytes()) != t.n_bytes) {
            throw py::value_error("tensor '" + name + "': " + std::to_string(t.n_bytes) +
                                  " bytes do not match its shape and type");
        }
        void* dst = out.mutable_data();
        py::gil_scoped_release release;
        model.read_tensor(index, dst, t.n_bytes);
        return out;
    }

    int64_t n = 1;
    for (int32_t d = 0; d < t.n_dims; ++d) n *= t.ne[d];
    py::array_t<float> out(shape);
    float* dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        const std::vector<uint8_t> bytes = model.read_tensor(index);
        moeinfer::dequantize(t.type, bytes.data(), bytes.size(), n, dst);
    }
    return out;
}

// A metadata array as a list of int, bool, float or str (strings that are not UTF-8 keep their
// bytes as surrogate escapes).
py::list meta_array(const moeinfer::Model& model, const std::string& key, const moeinfer::Model::MetaType& t) {
    py::list out;
    if (t.elem_type == MOE_META_STRING) {
        for (int64_t i = 0; i < t.n; ++i) {
            const std::string v = model.meta_array_string(key, i);
            PyObject* s = PyUnicode_DecodeUTF8(v.data(), static_cast<Py_ssize_t>(v.size()), "surrogateescape");
            if (s == nullptr) throw py::error_already_set();
            out.append(py::reinterpret_steal<py::str>(s));
        }
    } else if (t.elem_type == MOE_META_FLOAT32 || t.elem_type == MOE_META_FLOAT64) {
        for (double v : model.meta_array_float(key)) out.append(v);
    } else if (t.elem_type == MOE_META_ARRAY) {
        throw py::value_error("metadata '" + key + "' is an array of arrays, which Model.meta does not read");
    } else if (t.elem_type == MOE_META_BOOL) {
        for (int64_t v : model.meta_array_int(key)) out.append(py::bool_(v != 0));
    } else {
        for (int64_t v : model.meta_array_int(key)) out.append(v);
    }
    return out;
}

// Integers (and bools) -> int, floats -> float, strings -> str, arrays -> list; KeyError when absent.
py::object meta(const moeinfer::Model& model, const std::string& key) {
    if (const auto t = model.meta_type(key); t && t->type == MOE_META_ARRAY) return meta_array(model, key, *t);
    // The typed getters answer INVALID_ARGUMENT for another type; try them in turn.
    const auto mismatch = [](const moeinfer::Error& e) { return e.status() == MOE_STATUS_INVALID_ARGUMENT; };
    try {
        if (const auto v = model.meta_int(key)) return py::int_(*v);
        throw py::key_error("no metadata key '" + key + "' in the model");
    } catch (const moeinfer::Error& e) {
        if (!mismatch(e)) throw;
    }
    try {
        if (const auto v = model.meta_float(key)) return py::float_(*v);
    } catch (const moeinfer::Error& e) {
        if (!mismatch(e)) throw;
    }
    if (const auto v = model.meta_string(key)) return py::str(*v);
    throw py::key_error("no metadata key '" + key + "' in the model");
}

moeinfer::Model load(const py::object& path, bool use_mmap, const py::object& progress) {
    const std::string p = fspath(path);
    moe_model_params params = moeinfer::model_params();
    params.use_mmap = use_mmap ? 1 : 0;
    const moeinfer::ProgressFn fn = progress_fn(progress);
    py::gil_scoped_release release;
    return moeinfer::Model::load(p, params, fn);
}

std::string model_repr(const moeinfer::Model& model) {
    const moe_model_info i = model.info();
    return "<moeinfer.Model " + std::string(i.architecture) + " '" + i.name + "': " + std::to_string(i.n_layer) +
           " layers, " + std::to_string(i.n_expert) + " experts (top-" + std::to_string(i.n_expert_used) + "), " +
           std::to_string(i.n_tensors) + " tensors>";
}

std::string info_repr(const ModelInfo& i) {
    std::string s = "ModelInfo(architecture='" + i.architecture_str + "', name='" + i.name_str + "'";
    const std::pair<const char*, long long> fields[] = {
        {"n_layer", i.n_layer},        {"n_embd", i.n_embd},
        {"n_vocab", i.n_vocab},        {"n_head", i.n_head},
        {"n_head_kv", i.n_head_kv},    {"head_dim", i.head_dim},
        {"n_expert", i.n_expert},      {"n_expert_used", i.n_expert_used},
        {"n_ff_expert", i.n_ff_expert}, {"n_ctx_train", i.n_ctx_train},
        {"sliding_window", i.sliding_window}, {"n_tensors", i.n_tensors},
        {"n_bytes", static_cast<long long>(i.n_bytes)}, {"n_expert_bytes", static_cast<long long>(i.n_expert_bytes)},
    };
    for (const auto& [k, v] : fields) s += std::string(", ") + k + "=" + std::to_string(v);
    return s + ")";
}

}  // namespace

void bind_model(py::module_& m) {
    using namespace pybind11::literals;

    py::class_<ModelInfo>(m, "ModelInfo", "Hyper-parameters of a loaded model (Model.info).")
        .def_readonly("architecture", &ModelInfo::architecture_str, "\"qwen3moe\", \"gpt-oss\" or \"glm4moe\"")
        .def_readonly("name", &ModelInfo::name_str, "general.name, \"\" when absent")
        .def_readonly("n_layer", &ModelInfo::n_layer)
        .def_readonly("n_embd", &ModelInfo::n_embd)
        .def_readonly("n_vocab", &ModelInfo::n_vocab)
        .def_readonly("n_head", &ModelInfo::n_head)
        .def_readonly("n_head_kv", &ModelInfo::n_head_kv)
        .def_readonly("head_dim", &ModelInfo::head_dim)
        .def_readonly("n_expert", &ModelInfo::n_expert)
        .def_readonly("n_expert_used", &ModelInfo::n_expert_used)
        .def_readonly("n_ff_expert", &ModelInfo::n_ff_expert, "hidden size of one expert's FFN")
        .def_readonly("n_ctx_train", &ModelInfo::n_ctx_train)
        .def_readonly("sliding_window", &ModelInfo::sliding_window, "0 when the architecture has none")
        .def_readonly("n_tensors", &ModelInfo::n_tensors)
        .def_readonly("n_bytes", &ModelInfo::n_bytes, "bytes of all tensor data")
        .def_readonly("n_expert_bytes", &ModelInfo::n_expert_bytes, "bytes of the expert tensors (*_exps.*) of the layers run")
        .def("__repr__", &info_repr);

    py::class_<TensorInfo>(m, "TensorInfo", "One tensor of a model (Model.tensors).")
        .def_readonly("name", &TensorInfo::name)
        .def_readonly("type", &TensorInfo::type, "type name, e.g. \"q8_0\"")
        .def_property_readonly(
            "shape", [](const TensorInfo& t) { return as_tuple(t.shape); },
            "numpy order: the reverse of GGUF's ne (the contiguous dimension last)")
        .def_readonly("n_bytes", &TensorInfo::n_bytes)
        .def_readonly("file_offset", &TensorInfo::file_offset, "absolute offset of the data in the file")
        .def("__repr__", [](const TensorInfo& t) {
            return "TensorInfo(name='" + t.name + "', type='" + t.type + "', shape=" +
                   py::repr(as_tuple(t.shape)).cast<std::string>() + ", n_bytes=" + std::to_string(t.n_bytes) +
                   ", file_offset=" + std::to_string(t.file_offset) + ")";
        });

    py::class_<moeinfer::Model>(m, "Model",
                                "A loaded GGUF model (immutable; safe to query from several threads).")
        .def(py::init(&load), "path"_a, "use_mmap"_a = true, "progress"_a = py::none(),
             R"(Loads a GGUF model (the GIL is released meanwhile).

use_mmap maps the tensor data instead of reading it into memory. progress, when given, is
called with the fraction done; returning False cancels (CancelledError).
Raises FileNotFoundError, DataCorruptError (malformed file), NotImplementedError (unsupported
architecture or type), OSError.)")
        .def_property_readonly("info", [](const moeinfer::Model& self) { return ModelInfo(self.info()); })
        .def_property_readonly(
            "tensors",
            [](const moeinfer::Model& self) {
                std::vector<TensorInfo> out;
                for (const moe_tensor_info& t : self.tensors()) out.emplace_back(t);
                return out;
            },
            "list of TensorInfo, in file order")
        .def("tensor", &tensor, "name"_a, "raw"_a = false,
             R"(A tensor's data as a new numpy array.

raw=False: float32 values (dequantised), shape = TensorInfo.shape.
raw=True: the stored bytes as uint8, shape = TensorInfo.shape with the last dimension in bytes.
KeyError when there is no such tensor.)")
        .def("meta", &meta, "key"_a,
             "Metadata value: int (integers, bools), float, str, or a list of them for an array "
             "(tokenizer.ggml.tokens, ...). KeyError when absent.")
        .def(
            "set_expert_profile",
            [](moeinfer::Model& self, const std::optional<std::string>& path) {
                self.set_expert_profile(path ? path->c_str() : nullptr);
            },
            "path"_a,
            R"(Reads an expert activation profile (Context.save_expert_profile) into the model: contexts
created afterwards keep the hottest experts of each layer in device memory when the weights do not
all fit (the VRAM budget), the rest in host RAM. None clears it. FileNotFoundError when the file does
not exist, DataCorruptError for a malformed one, ValueError naming the field when it was written for
another model.)")
        .def("__repr__", &model_repr);
}

}  // namespace moeinfer_py
