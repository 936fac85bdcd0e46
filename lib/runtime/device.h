// MOE_DEVICE_AUTO made concrete: what a context or a bandwidth measurement runs on.
#pragma once

#include <cstdint>

namespace moe {

// MOE_DEVICE_CUDA when this build registered the CUDA backend and it sees a device, MOE_DEVICE_CPU
// otherwise; any other value is returned unchanged (validated by the caller).
int32_t resolve_device(int32_t device);

}  // namespace moe
