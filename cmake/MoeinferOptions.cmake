# Build options. Each has a sane default; see README.md "Build options".
set(MOEINFER_CUDA "AUTO" CACHE STRING "Build the CUDA backend: ON, OFF or AUTO (on when nvcc is found)")
set_property(CACHE MOEINFER_CUDA PROPERTY STRINGS AUTO ON OFF)
set(MOEINFER_CUDA_ARCHS "90" CACHE STRING
    "CUDA architectures (CMAKE_CUDA_ARCHITECTURES syntax; '90' = sm_90 code plus compute_90 PTX)")
option(MOEINFER_BUILD_PYTHON "Build the Python module (needs pybind11)" ON)
option(MOEINFER_BUILD_TESTS "Build the tests" ON)
option(MOEINFER_BUILD_TOOLS "Build the command-line tools (moeinfer-bench, moeinfer-synth)" ON)
option(MOEINFER_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
option(MOEINFER_WERROR "Treat warnings as errors" OFF)
set(MOEINFER_SANITIZE "" CACHE STRING
    "Sanitizers for every target, as -fsanitize= takes them (e.g. address,undefined); empty: none")
