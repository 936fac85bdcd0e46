// The sampler chain behind moe_sampler_*: logits -> penalties -> logit bias -> top-k -> top-p -> min-p ->
// temperature -> one draw from a seeded mt19937_64. Driven token by token: accept() feeds the penalties'
// history, sample() picks the next token, reset() starts over. The stages' exact semantics are documented
// once, in the "Sampling" section of include/moeinfer/moeinfer.h; this file follows them.
//
// Thread safety: one thread at a time per Sampler (it keeps scratch buffers and the PRNG state).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "moeinfer/moeinfer.h"

namespace moe {

// A token left after the chain, with its probability (softmax of its tempered logit over those left).
struct SamplerCandidate {
    int32_t id;
    float logit;  // after the penalties and the logit bias, before the temperature
    double p;
};

class Sampler {
public:
    // Validates `params` (errors name the C field, "params->top_p ...") and copies the logit bias.
    static StatusOr<std::unique_ptr<Sampler>> create(const moe_sampler_params& params, int32_t n_vocab);

    int32_t n_vocab() const { return n_vocab_; }
    // The seed in use: params.seed, or the one drawn at creation for MOE_SAMPLER_SEED_RANDOM.
    uint64_t seed() const { return seed_; }

    // Appends tokens to the penalties' history. OUT_OF_RANGE (nothing appended) for an id outside
    // [0, n_vocab).
    Status accept(const int32_t* tokens, int32_t n_tokens);

    // Empties the history and re-seeds the PRNG with seed(): the sampler is as just created.
    void reset();

    // Runs the chain on logits[0, n_vocab) without drawing (the PRNG does not move). `ranked` receives
    // the candidates left, by descending probability (equal ones by ascending id).
    Status apply(const float* logits, int32_t n_vocab, std::vector<SamplerCandidate>* ranked);

    // Runs the chain and draws one token. Does not accept it (the caller decides what enters the history).
    StatusOr<int32_t> sample(const float* logits, int32_t n_vocab);

private:
    Sampler(const moe_sampler_params& params, int32_t n_vocab, std::vector<std::pair<int32_t, float>> bias,
            uint64_t seed);

    // Leaves the candidates after the chain in cand_, in ascending id order, with their probabilities.
    Status run_chain(const float* logits, int32_t n_vocab);
    // logits_ = the caller's logits after the penalties and the logit bias; rejects NaN and +inf.
    Status load_logits(const float* logits, int32_t n_vocab);
    void gather_top_k(size_t k);
    void gather_all();
    void top_p();
    size_t select_mass(double mass);
    void min_p();
    void softmax(double inv_temperature);

    moe_sampler_params params_;  // validated; logit_bias cleared (bias_ holds the copy)
    int32_t n_vocab_;
    std::vector<std::pair<int32_t, float>> bias_;
    uint64_t seed_;
    std::mt19937_64 rng_;

    // The last repeat_last_n accepted tokens (all of them for -1) and how often each occurs there.
    std::deque<int32_t> window_;
    std::unordered_map<int32_t, int32_t> counts_;

    std::vector<float> logits_;
    std::vector<SamplerCandidate> cand_;
    // cand_'s order: by id, rank order (descending logit, then ascending id), or neither.
    enum class Order { kById, kRanked, kAny };
    Order order_ = Order::kById;
};

}  // namespace moe
