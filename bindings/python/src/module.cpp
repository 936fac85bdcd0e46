// moeinfer._moeinfer: the compiled half of the `moeinfer` package (bindings/python/moeinfer/ is the
// other half and re-exports everything here).
#include "bindings.h"

PYBIND11_MODULE(_moeinfer, m) {
    m.doc() = "moeinfer: Mixture-of-Experts inference (compiled module; import `moeinfer` instead)";
    m.attr("__version__") = moe_version();
    m.attr("has_cuda") = pybind11::bool_(MOEINFER_HAS_CUDA != 0);

    moeinfer_py::bind_errors(m);
    moeinfer_py::bind_types(m);
    moeinfer_py::bind_model(m);
    moeinfer_py::bind_policy(m);
    moeinfer_py::bind_context(m);
    moeinfer_py::bind_synth(m);
    moeinfer_py::bind_bandwidth(m);
    moeinfer_py::bind_sampler(m);
    moeinfer_py::bind_text(m);
    moeinfer_py::bind_chat(m);
}
