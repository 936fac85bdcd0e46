#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/c_api_guard.h"
#include "runtime/context.h"

namespace moe {

bool StopMatcher::push(std::string_view text, std::string* out) {
    out->clear();
    pending_.append(text);
    size_t first = std::string::npos;
    for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
        out->assign(pending_, 0, first);
        pending_.clear();
        return true;
    }
    // Hold back the longest tail of the text that is the start of a stop string.
    size_t hold = 0;
    for (const std::string& s : stops_) {
        for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
            if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
                hold = n;
                break;
            }
        }
    }
    out->assign(pending_, 0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return false;
}

std::string StopMatcher::flush() {
    std::string rest;
    rest.swap(pending_);
    return rest;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int32_t argmax(const float* logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

// Text from the streaming detokenizer (whole UTF-8 characters only): feeds `token`, or flushes when
// token < 0. A first try into a stack buffer; a longer text is asked for again at its size.
moe_status detok_text(moe_detokenizer* detok, int32_t token, std::string* out) {
    auto call = [&](char* buf, int64_t cap, int64_t* n) {
        return token >= 0 ? moe_detokenizer_feed(detok, &token, 1, buf, cap, n) : moe_detokenizer_flush(detok, buf, cap, n);
    };
    char buf[256];
    int64_t n = 0;
    if (moe_status s = call(buf, sizeof buf, &n); s != MOE_STATUS_OK) return s;
    if (n <= static_cast<int64_t>(sizeof buf)) {
        out->assign(buf, static_cast<size_t>(n));
        return MOE_STATUS_OK;
    }
    out->resize(static_cast<size_t>(n));
    return call(out->data(), n, &n);
}

struct DetokFree {
    void operator()(moe_detokenizer* d) const { moe_detokenizer_free(d); }
};

}  // namespace

moe_status generate(moe_context& ctx, const int32_t* prompt, int32_t n_prompt, moe_sampler* sampler,
                    const moe_generate_params& params, moe_generate_result* result) {
    moe_detokenizer* raw = nullptr;
    if (moe_status s = moe_detokenizer_create(ctx.model, params.render_special, &raw); s != MOE_STATUS_OK) return s;
    std::unique_ptr<moe_detokenizer, DetokFree> detok(raw);
    if (n_prompt > ctx.params.n_ctx) {
        return api_return(out_of_range("the prompt has " + std::to_string(n_prompt) + " tokens, more than n_ctx = " +
                                       std::to_string(ctx.params.n_ctx)));
    }

    // The longest prefix already in the cache; the last prompt token is always decoded for its logits.
    const int32_t cached = std::min<int32_t>(ctx.n_past, static_cast<int32_t>(ctx.kv_tokens.size()));
    int32_t reuse = 0;
    while (reuse < cached && reuse < n_prompt - 1 && ctx.kv_tokens[static_cast<size_t>(reuse)] == prompt[reuse]) {
        ++reuse;
    }
    result->n_prompt_reused = reuse;
    result->n_prompt_decoded = n_prompt - reuse;

    std::vector<int32_t> positions(static_cast<size_t>(n_prompt - reuse));
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = reuse + static_cast<int32_t>(i);
    const Clock::time_point t_prompt = Clock::now();
    Status st = decode(ctx, prompt + reuse, positions.data(), n_prompt - reuse, false);
    result->t_prompt_s = seconds_since(t_prompt);
    if (!st.is_ok()) return api_return(st);
    if (sampler != nullptr) {
        if (moe_status s = moe_sampler_accept(sampler, prompt + reuse, n_prompt - reuse); s != MOE_STATUS_OK) return s;
    }

    const Clock::time_point t_gen = Clock::now();
    std::vector<std::string> stops(params.stop, params.stop + params.n_stop);
    StopMatcher matcher(std::move(stops));
    const int32_t n_vocab = ctx.model->hparams.n_vocab;
    std::string text, out;
    auto emit = [&](const std::string& piece) {
        return piece.empty() || params.on_piece == nullptr || params.on_piece(piece.data(), piece.size(), params.user_data) != 0;
    };
    auto finish = [&](int32_t reason) {
        result->stop_reason = reason;
        result->t_gen_s = seconds_since(t_gen);
    };
    result->stop_reason = MOE_STOP_MAX_TOKENS;
    for (int32_t i = 0; i < params.max_tokens; ++i) {
        const float* logits = ctx.logits_data();
        int32_t token = 0;
        if (sampler == nullptr) {
            token = argmax(logits, n_vocab);
        } else if (moe_status s = moe_sampler_sample(sampler, logits, n_vocab, &token); s != MOE_STATUS_OK) {
            finish(MOE_STOP_MAX_TOKENS);
            return s;
        }
        int32_t is_eog = 0;
        if (moe_status s = moe_token_is_eog(ctx.model, token, &is_eog); s != MOE_STATUS_OK) return s;
        if (is_eog != 0) {
            finish(MOE_STOP_EOG);
            break;
        }
        if (params.tokens != nullptr && i < params.tokens_capacity) params.tokens[i] = token;
        result->n_generated = i + 1;
        if (sampler != nullptr) {
            if (moe_status s = moe_sampler_accept(sampler, &token, 1); s != MOE_STATUS_OK) return s;
        }
        if (moe_status s = detok_text(detok.get(), token, &text); s != MOE_STATUS_OK) return s;
        const bool stopped = matcher.push(text, &out);
        if (!emit(out)) {
            finish(MOE_STOP_CALLBACK);
            return MOE_STATUS_OK;
        }
        if (stopped) {
            finish(MOE_STOP_STRING);
            return MOE_STATUS_OK;
        }
        if (i + 1 == params.max_tokens) break;
        if (ctx.n_past >= ctx.params.n_ctx) {
            finish(MOE_STOP_CONTEXT_FULL);
            break;
        }
        st = decode(ctx, &token, nullptr, 1, false);
        if (!st.is_ok()) {
            finish(MOE_STOP_MAX_TOKENS);
            return api_return(st);
        }
    }
    if (result->stop_reason == MOE_STOP_MAX_TOKENS) finish(MOE_STOP_MAX_TOKENS);
    // The end of the stream: bytes of an unfinished character, then the text held for stop strings.
    std::string tail, rest;
    if (moe_status s = detok_text(detok.get(), -1, &tail); s != MOE_STATUS_OK) return s;
    if (matcher.push(tail, &rest)) result->stop_reason = MOE_STOP_STRING;
    if (!emit(rest + matcher.flush())) result->stop_reason = MOE_STOP_CALLBACK;
    return MOE_STATUS_OK;
}

}  // namespace moe
