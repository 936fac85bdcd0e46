// The one place where a moe_status becomes a Python exception.
//
// Key lookups (Model.meta, Model.tensor) raise KeyError at their call sites, because the library's
// NOT_FOUND does not say whether a path or a key was missing; everything else lands here.
#include "bindings.h"

namespace moeinfer_py {
namespace {

// Exception types created at import; owned by the module (it holds a reference too) and never
// released, like the built-in ones.
PyObject* g_data_corrupt_error = nullptr;
PyObject* g_cancelled_error = nullptr;

PyObject* exception_type(moe_status status) {
    switch (status) {
        case MOE_STATUS_INVALID_ARGUMENT:
        case MOE_STATUS_OUT_OF_RANGE: return PyExc_ValueError;
        case MOE_STATUS_NOT_FOUND: return PyExc_FileNotFoundError;
        case MOE_STATUS_RESOURCE_EXHAUSTED: return PyExc_MemoryError;
        case MOE_STATUS_UNIMPLEMENTED: return PyExc_NotImplementedError;
        case MOE_STATUS_IO_ERROR: return PyExc_OSError;
        case MOE_STATUS_DATA_CORRUPT: return g_data_corrupt_error;
        case MOE_STATUS_CANCELLED: return g_cancelled_error;
        case MOE_STATUS_OK:  // never thrown; listed so that a new code is a compiler warning
        case MOE_STATUS_INTERNAL:
        case MOE_STATUS_FAILED_PRECONDITION: break;
    }
    return PyExc_RuntimeError;
}

PyObject* new_exception(py::module_& m, const char* name, PyObject* base, const char* doc) {
    // __module__ is "moeinfer": the package re-exports these, and that is where users catch them.
    // (Built with append: GCC 12 gives a false -Wrestrict on `std::string(...) + name` at -O3.)
    std::string qualified = "moeinfer.";
    qualified.append(name);
    PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
    if (type == nullptr) throw py::error_already_set();
    m.attr(name) = py::handle(type);
    return type;
}

}  // namespace

void bind_errors(py::module_& m) {
    g_data_corrupt_error = new_exception(
        m, "DataCorruptError", PyExc_ValueError,
        "A model file is malformed (bad magic, counts, offsets or sizes). The message names the field.");
    g_cancelled_error = new_exception(
        m, "CancelledError", PyExc_RuntimeError,
        "A long operation stopped because its progress callback returned False.");

    py::register_exception_translator([](std::exception_ptr error) {
        try {
            if (error) std::rethrow_exception(error);
        } catch (const moeinfer::Error& e) {
            py::set_error(exception_type(e.status()), e.what());
        }
    });
}

}  // namespace moeinfer_py
