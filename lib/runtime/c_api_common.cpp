// Status strings, the thread-local last error and the version: the parts of the C API every other
// part relies on.
#include <string>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"

namespace moe {
namespace {
thread_local std::string g_last_error;
}  // namespace

moe_status api_return(const Status& s) {
    if (s.is_ok()) {
        g_last_error.clear();
    } else {
        g_last_error = s.message();
    }
    return s.code();
}

void api_clear_error() { g_last_error.clear(); }

const char* g_last_error_cstr() { return g_last_error.c_str(); }

}  // namespace moe

extern "C" {

MOE_API const char* moe_status_string(moe_status status) {
    switch (status) {
        case MOE_STATUS_OK: return "ok";
        case MOE_STATUS_INVALID_ARGUMENT: return "invalid argument";
        case MOE_STATUS_NOT_FOUND: return "not found";
        case MOE_STATUS_OUT_OF_RANGE: return "out of range";
        case MOE_STATUS_RESOURCE_EXHAUSTED: return "resource exhausted";
        case MOE_STATUS_UNIMPLEMENTED: return "unimplemented";
        case MOE_STATUS_INTERNAL: return "internal error";
        case MOE_STATUS_IO_ERROR: return "I/O error";
        case MOE_STATUS_DATA_CORRUPT: return "data corrupt";
        case MOE_STATUS_FAILED_PRECONDITION: return "failed precondition";
        case MOE_STATUS_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

MOE_API const char* moe_last_error(void) { return moe::g_last_error_cstr(); }

MOE_API const char* moe_version(void) { return MOEINFER_VERSION_STRING; }

}  // extern "C"
