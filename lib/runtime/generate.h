// The generation loop behind moe_generate: prefix reuse over the context's KV cache, sampling, stop
// strings held back across pieces, streaming.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moeinfer/moeinfer.h"

namespace moe {

// Finds stop strings in a stream of text pieces. Text that could still begin a stop string is held
// back; the rest is released.
class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

    // Appends `text`; *out gets the text now known to precede any stop string. True when a stop string
    // was found (*out then ends right before it and the matcher holds nothing more).
    bool push(std::string_view text, std::string* out);
    // The text held back (the stream ended without a stop string).
    std::string flush();

private:
    std::vector<std::string> stops_;
    std::string pending_;
};

// REQUIRES: arguments validated by moe_generate (c_api_generate.cpp). Returns a moe_status whose
// message is this thread's last error.
moe_status generate(moe_context& ctx, const int32_t* prompt, int32_t n_prompt, moe_sampler* sampler,
                    const moe_generate_params& params, moe_generate_result* result);

}  // namespace moe
