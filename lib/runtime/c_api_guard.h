// The one macro pair that wraps every exported function body: no exception crosses the C ABI.
// Inside, code returns moe::Status (through moe::api_return) or a moe_status.
#pragma once

#include <new>
#include <stdexcept>

#include "core/status.h"

namespace moe {

// Records `s` as this thread's last error (or clears it when OK) and returns its code.
moe_status api_return(const Status& s);
void api_clear_error();
const char* g_last_error_cstr();

}  // namespace moe

#define MOE_API_BEGIN \
    try {             \
        ::moe::api_clear_error();

#define MOE_API_END                                                                              \
    }                                                                                            \
    catch (const std::bad_alloc&) {                                                              \
        return ::moe::api_return(::moe::resource_exhausted("out of host memory"));              \
    }                                                                                            \
    catch (const std::exception& e) {                                                            \
        return ::moe::api_return(::moe::internal_error(std::string("unexpected exception: ") + e.what())); \
    }                                                                                            \
    catch (...) {                                                                                \
        return ::moe::api_return(::moe::internal_error("unexpected unknown exception"));        \
    }

// Returns from the exported function when the Status `expr` fails.
#define MOE_RETURN_API(expr)                                          \
    do {                                                              \
        ::moe::Status moe_api_status_ = (expr);                       \
        if (!moe_api_status_.is_ok()) return ::moe::api_return(moe_api_status_); \
    } while (0)

// `lhs = value of the StatusOr expr`, or return its status from the exported function.
#define MOE_API_ASSIGN(lhs, expr) MOE_API_ASSIGN_IMPL(MOE_CONCAT(moe_api_or_, __LINE__), lhs, expr)
#define MOE_API_ASSIGN_IMPL(tmp, lhs, expr)                        \
    auto tmp = (expr);                                             \
    if (!tmp.is_ok()) return ::moe::api_return(tmp.status());      \
    lhs = std::move(tmp).value()

// Caller-error check: returns MOE_STATUS_INVALID_ARGUMENT naming the argument.
#define MOE_CHECK_ARG(cond, what)                                                       \
    do {                                                                                \
        if (!(cond)) return ::moe::api_return(::moe::invalid_argument(what));           \
    } while (0)
