// Catch2 main for the C++ unit tests (tests/*/test_*.cpp).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
