// Conversions of Python arguments shared by the bindings: paths, type names, progress callbacks.
#include "bindings.h"

namespace moeinfer_py {

std::string fspath(const py::handle& path) {
    // The file system's bytes, as open(2) wants them (not every POSIX path is valid UTF-8).
    std::string bytes = py::module_::import("os").attr("fsencode")(path).cast<std::string>();
    // The C API takes a C string: the bytes after a NUL would be dropped and another file opened.
    if (bytes.find('\0') != std::string::npos) {
        throw py::value_error("path contains an embedded null byte: " + py::repr(path).cast<std::string>());
    }
    return bytes;
}

int32_t type_from_name(const std::string& name, const char* what) {
    try {
        return moeinfer::type_from_name(name);
    } catch (const moeinfer::Error& e) {
        // An unknown type name is a bad argument value, not a missing file.
        if (e.status() == MOE_STATUS_NOT_FOUND) throw py::value_error(std::string(what) + ": " + e.what());
        throw;
    }
}

moeinfer::ProgressFn progress_fn(const py::handle& callback) {
    if (!callback.is_none() && !PyCallable_Check(callback.ptr())) {
        throw py::type_error("progress must be a callable taking a float, or None");
    }
    // Installed even without a callback, so that Ctrl-C can stop a long load or write.
    return [callback](float fraction) -> bool {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        if (callback.is_none()) return true;
        const py::object result = callback(fraction);
        if (result.is_none()) return true;
        const int truth = PyObject_IsTrue(result.ptr());
        if (truth < 0) throw py::error_already_set();
        return truth != 0;
    };
}

}  // namespace moeinfer_py
