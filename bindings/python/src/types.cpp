// Element types and quantisation: moeinfer.quantize / dequantize / type_info / row_bytes.
#include <pybind11/numpy.h>

#include <vector>

#include "bindings.h"

namespace moeinfer_py {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Quantises along the last axis, as GGUF stores rows: (..., n) floats -> (..., row_bytes(n)) bytes.
py::array_t<uint8_t> quantize(const std::string& type_name, const FloatArray& src) {
    const int32_t type = type_from_name(type_name, "quantize: type");
    std::vector<py::ssize_t> shape(src.shape(), src.shape() + src.ndim());
    if (shape.empty()) shape.push_back(1);  // a 0-d array is one value
    const int64_t n = static_cast<int64_t>(src.size());
    const int64_t row = static_cast<int64_t>(shape.back());
    const uint64_t bytes_per_row = moeinfer::row_bytes(type, row);  // rejects rows that are not whole blocks
    const int64_t n_rows = row == 0 ? 0 : n / row;

    shape.back() = static_cast<py::ssize_t>(bytes_per_row);
    py::array_t<uint8_t> dst(shape);
    const uint64_t dst_size = bytes_per_row * static_cast<uint64_t>(n_rows);
    const float* src_data = src.data();
    uint8_t* dst_data = dst.mutable_data();
    {
        py::gil_scoped_release release;
        moeinfer::quantize(type, src_data, n, dst_data, dst_size);
    }
    return dst;
}

// `data` is any C-contiguous buffer whose bytes are the stored blocks (a uint8 array, bytes, or
// e.g. the float16 array holding an F16 tensor). n defaults to every element the bytes hold.
py::array_t<float> dequantize(const std::string& type_name, const py::object& data, const py::object& n_arg) {
    const int32_t type = type_from_name(type_name, "dequantize: type");
    if (!PyObject_CheckBuffer(data.ptr())) {
        throw py::type_error("dequantize: data must be a bytes-like object or a numpy array, got " +
                             py::str(py::type::handle_of(data).attr("__name__")).cast<std::string>());
    }
    const py::array bytes = py::array::ensure(data, py::array::c_style);
    if (!bytes) throw py::error_already_set();
    const uint64_t src_size = static_cast<uint64_t>(bytes.nbytes());

    int64_t n = 0;
    if (n_arg.is_none()) {
        const moeinfer::BlockInfo b = moeinfer::block_info(type);
        if (src_size % static_cast<uint64_t>(b.block_bytes) != 0) {
            throw py::value_error("dequantize: " + std::to_string(src_size) + " bytes are not a whole number of " +
                                  type_name + " blocks (" + std::to_string(b.block_bytes) +
                                  " bytes each); pass n to convert a prefix");
        }
        n = static_cast<int64_t>(src_size / static_cast<uint64_t>(b.block_bytes)) * b.block_size;
    } else {
        n = n_arg.cast<int64_t>();
        if (n < 0) throw py::value_error("dequantize: n must be >= 0, got " + std::to_string(n));
    }

    py::array_t<float> dst(static_cast<py::ssize_t>(n));
    const void* src_data = bytes.data();
    float* dst_data = dst.mutable_data();
    {
        py::gil_scoped_release release;
        moeinfer::dequantize(type, src_data, src_size, n, dst_data);
    }
    return dst;
}

py::tuple type_info(const std::string& type_name) {
    const moeinfer::BlockInfo b = moeinfer::block_info(type_from_name(type_name, "type_info: type"));
    return py::make_tuple(b.block_size, b.block_bytes);
}

}  // namespace

void bind_types(py::module_& m) {
    using namespace pybind11::literals;
    m.def("quantize", &quantize, "type"_a, "data"_a,
          R"(Converts float32 values to `type` ("f16", "bf16", "q8_0", "q4_0", "mxfp4", ...).

Quantises along the last axis, as GGUF stores rows: an array of shape (..., n) gives a uint8
array of shape (..., row_bytes(type, n)); n must be a multiple of the type's block size.
Other float dtypes are converted to float32 first. Bit-exact with ggml's reference quantisers for
f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_K and mxfp4; the other K-quants and iq4_nl / iq4_xs use a
simple rounding scheme of ours. NotImplementedError for a type this build only describes (iq2_xxs, ...).)");
    m.def("dequantize", &dequantize, "type"_a, "data"_a, "n"_a = py::none(),
          R"(Converts stored elements of `type` to a 1-D float32 array of n values.

`data` is any C-contiguous buffer holding the blocks (uint8 array, bytes, ...); its bytes are
used as they are. n defaults to all the elements those bytes hold. NotImplementedError for a type
this build only describes.)");
    m.def("type_info", &type_info, "type"_a,
          "(block_size, block_bytes) of a type: elements per block and bytes per block.");
    m.def(
        "row_bytes",
        [](const std::string& type_name, int64_t n) {
            return moeinfer::row_bytes(type_from_name(type_name, "row_bytes: type"), n);
        },
        "type"_a, "n"_a, "Bytes taken by n elements of `type` (n a multiple of the block size).");
}

}  // namespace moeinfer_py
