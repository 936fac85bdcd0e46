// Random weights of synthetic models: counter-based streams (one per tensor chunk) and the
// initialisers that make random weights behave like trained ones where it matters for benchmarks:
// activations stay O(1) and the router spreads tokens over the experts (or skews them on purpose).
#include <algorithm>
#include <cmath>

#include "core/models/synth_model.h"

namespace moe::synth {
namespace {

constexpr int64_t kChunkElems = int64_t{1} << 18;  // ~1 MiB of floats per chunk
constexpr float kSqrt3 = 1.7320508f;

// splitmix64's finaliser: a bijective 64-bit mixer.
uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
    return h;
}

// splitmix64: a tiny generator whose whole state is one counter, seeded per (tensor, chunk).
class Stream {
public:
    explicit Stream(uint64_t seed) : state_(seed) {}
    uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
    // Fills dst[0..n) with U(-1, 1), two values per 64-bit draw (24 bits each; never exactly +/-1).
    void uniform(float* dst, int64_t n) {
        constexpr float kScale = 1.0f / 8388608.0f;  // 2^-23: maps [0, 2^24) to [0, 2)
        int64_t i = 0;
        for (; i + 1 < n; i += 2) {
            const uint64_t r = next();
            dst[i] = (static_cast<float>(r >> 40) + 0.5f) * kScale - 1.0f;
            dst[i + 1] = (static_cast<float>((r >> 16) & 0xFFFFFF) + 0.5f) * kScale - 1.0f;
        }
        if (i < n) dst[i] = (static_cast<float>(next() >> 40) + 0.5f) * kScale - 1.0f;
    }

private:
    uint64_t state_;
};

uint64_t stream_seed(uint64_t seed, const std::string& name, uint64_t chunk) {
    return mix64(mix64(mix64(seed ^ 0x5EEDF00Dull) ^ fnv1a(name)) ^ chunk);
}

// Scales x[0..n) to unit L2 norm (a zero vector, impossible with U(-1, 1) draws, stays zero).
void normalise(float* x, int64_t n) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    if (ss <= 0.0) return;
    const float inv = static_cast<float>(1.0 / std::sqrt(ss));
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

float skew_offset(float skew, int rank, int n_expert) {
    if (n_expert <= 1) return 0.0f;
    return -kSkewLogitRange * skew * static_cast<float>(rank) / static_cast<float>(n_expert - 1);
}

std::vector<int> expert_ranks(uint64_t seed, int layer, int n_expert) {
    std::vector<int> ranks(static_cast<size_t>(n_expert));
    for (int e = 0; e < n_expert; ++e) ranks[static_cast<size_t>(e)] = e;
    Stream s(stream_seed(seed, "expert_ranks", static_cast<uint64_t>(layer)));
    for (int i = n_expert - 1; i > 0; --i) {  // Fisher-Yates
        const auto j = static_cast<int>(s.next() % static_cast<uint64_t>(i + 1));
        std::swap(ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(j)]);
    }
    return ranks;
}

int64_t chunk_rows(const TensorSpec& t) { return std::max<int64_t>(1, kChunkElems / t.row_len()); }

void fill_rows(const Config& c, const TensorSpec& t, const std::vector<int>& ranks, int64_t row0, int64_t n_rows,
               float* dst) {
    const int64_t len = t.row_len();
    const int64_t n = n_rows * len;
    Stream s(stream_seed(c.seed, t.name, static_cast<uint64_t>(row0 / chunk_rows(t))));
    // qwen3moe has no router bias: channel 0 of every token embedding is a constant 1, and router
    // row e holds expert e's skew offset in that channel, so the router adds it to every token's logit.
    // So has deepseek2 with softmax routing (its sigmoid routers carry the skew in exp_probs_b).
    const bool bias_channel = c.arch == Arch::QWEN3MOE || (c.arch == Arch::DEEPSEEK2 && !c.ds.gating_sigmoid);

    switch (t.init) {
        case Init::UNIFORM: {
            s.uniform(dst, n);
            const float a = t.std * kSqrt3;
            for (int64_t i = 0; i < n; ++i) dst[i] = t.mean + a * dst[i];
            break;
        }
        case Init::EMBEDDING: {
            // Std 1 per element: the embeddings dominate the residual stream (layers add ~0.2 each).
            s.uniform(dst, n);
            for (int64_t i = 0; i < n; ++i) dst[i] *= kSqrt3;
            if (bias_channel) {
                for (int64_t r = 0; r < n_rows; ++r) dst[r * len] = 1.0f;
            }
            break;
        }
        case Init::ROUTER: {
            // Unit-norm rows: for a normalised input (rms 1, norm sqrt(n_embd)) each logit is ~N(0, 1)
            // and the experts' logits are nearly independent, so top-k spreads tokens evenly.
            s.uniform(dst, n);
            for (int64_t r = 0; r < n_rows; ++r) {
                float* row = dst + r * len;
                const int expert = static_cast<int>(row0 + r);
                if (bias_channel) {
                    normalise(row + 1, len - 1);
                    row[0] = skew_offset(c.routing_skew, ranks[static_cast<size_t>(expert)], c.n_expert);
                } else {
                    normalise(row, len);
                }
            }
            break;
        }
        case Init::ROUTER_BIAS: {
            for (int64_t e = 0; e < n; ++e) {
                dst[e] = skew_offset(c.routing_skew, ranks[static_cast<size_t>(e)], c.n_expert);
            }
            break;
        }
        case Init::SELECTION_BIAS: {
            // Sigmoid scores move by ~1/4 of a logit change near 0, hence the skew offsets / 4; the
            // random part makes the bias matter to the choice even without skew.
            s.uniform(dst, n);
            for (int64_t e = 0; e < n; ++e) {
                dst[e] = 0.05f * kSqrt3 * dst[e] +
                         0.25f * skew_offset(c.routing_skew, ranks[static_cast<size_t>(e)], c.n_expert);
            }
            break;
        }
    }
}

}  // namespace moe::synth
