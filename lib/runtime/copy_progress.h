// Progress of a context's creation over the bytes registered in place and uploaded to its devices
// (moe_context_params.progress); 0 from the callback cancels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/status.h"
#include "moeinfer/moeinfer.h"

namespace moe {

class CopyProgress {
public:
    CopyProgress(const moe_context_params& p, uint64_t total) : p_(p), total_(std::max<uint64_t>(total, 1)) {}
    Status advance(uint64_t bytes) {
        done_ += bytes;
        if (p_.progress == nullptr) return Status::ok();
        if (p_.progress(static_cast<float>(static_cast<double>(done_) / static_cast<double>(total_)),
                        p_.progress_user_data) == 0) {
            return cancelled("context creation cancelled by the progress callback");
        }
        return Status::ok();
    }

private:
    const moe_context_params& p_;
    uint64_t total_;
    uint64_t done_ = 0;
};

}  // namespace moe
