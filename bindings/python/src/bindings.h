// Shared pieces of the Python module moeinfer._moeinfer. Each bind_*() adds one part of the API to
// the module; module.cpp calls them in order. Everything goes through include/moeinfer/moeinfer.hpp
// (the public API only), so every Python test also exercises the C ABI.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "moeinfer/moeinfer.hpp"

namespace moeinfer_py {

namespace py = pybind11;

// Creates moeinfer.DataCorruptError / moeinfer.CancelledError and registers the translator that
// turns every moeinfer::Error into a Python exception (errors.cpp has the mapping).
void bind_errors(py::module_& m);
void bind_types(py::module_& m);
void bind_model(py::module_& m);
void bind_policy(py::module_& m);
void bind_context(py::module_& m);
void bind_synth(py::module_& m);
void bind_bandwidth(py::module_& m);
void bind_sampler(py::module_& m);
void bind_text(py::module_& m);  // after bind_model: it adds methods to Model
void bind_chat(py::module_& m);

// A path argument (str, bytes or os.PathLike) as the file system's bytes (os.fsencode); ValueError
// when it contains a NUL byte.
std::string fspath(const py::handle& path);

// A type name ("q8_0", case-insensitive) -> moe_type; ValueError naming `what` when unknown.
int32_t type_from_name(const std::string& name, const char* what);

// The progress function passed to long C calls made with the GIL released. It re-acquires the GIL,
// lets pending signals (Ctrl-C) cancel the call, then calls `callback` (None, or a callable taking
// the fraction done; returning False cancels, None or True continues). `callback` is borrowed: it
// must outlive the call, which it does as an argument of the bound function.
moeinfer::ProgressFn progress_fn(const py::handle& callback);

// The moeinfer.Sampler behind `obj` (nullptr for None); TypeError for anything else. Borrowed: valid
// while `obj` lives.
moeinfer::Sampler* sampler_of(const py::handle& obj);

}  // namespace moeinfer_py
