// C API: synthetic model files (lib/core/models/synth.h).
#include "core/models/synth.h"
#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"

extern "C" {

MOE_API moe_status moe_synth_params_init(moe_synth_params* params, const char* architecture) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(params != nullptr, "params: must not be NULL");
    return moe::api_return(moe::synth_params_init(params, architecture));
    MOE_API_END
}

MOE_API moe_status moe_synth_write(const char* path, const moe_synth_params* params) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(path != nullptr, "path: must not be NULL");
    MOE_CHECK_ARG(params != nullptr, "params: must not be NULL");
    return moe::api_return(moe::synth_write(path, *params));
    MOE_API_END
}

}  // extern "C"
