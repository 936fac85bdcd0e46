#include "runtime/device.h"

#include "core/backend_registry.h"
#include "moeinfer/moeinfer.h"

namespace moe {

int32_t resolve_device(int32_t device) {
    if (device != MOE_DEVICE_AUTO) return device;
    const BackendFactory* cuda = find_backend_factory("cuda");
    return cuda != nullptr && cuda->device_count() > 0 ? MOE_DEVICE_CUDA : MOE_DEVICE_CPU;
}

}  // namespace moe
