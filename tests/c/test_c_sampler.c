/* C99 test of the sampler API: defaults, every parameter error naming its field, struct_size for older
 * callers, greedy and top-k against a C reference (argmax, selection plus a double softmax) on fresh
 * random logits, logit-bias entries adding up, seeded reproducibility and reset. The numpy reference of
 * every stage is tests/python/test_sampler.py. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moeinfer/moeinfer.h"

#include "c_check.h"

#define N_VOCAB 1000

static unsigned long long g_rng_state;

/* xorshift64*: fresh test data per run (the seed is printed). */
static double uniform01(void) {
    g_rng_state ^= g_rng_state >> 12;
    g_rng_state ^= g_rng_state << 25;
    g_rng_state ^= g_rng_state >> 27;
    return (double)((g_rng_state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}

static void random_logits(float* logits, int n) {
    int i;
    for (i = 0; i < n; ++i) logits[i] = (float)(uniform01() * 12.0 - 6.0);
}

/* exp by halving to a tiny argument, a Taylor series, then squaring back (relative error ~1e-11), so
 * that the test needs no libm (the C tests link only the library). */
static double exp_ref(double x) {
    double y = x / 65536.0, term = 1.0, sum = 1.0;
    int i;
    for (i = 1; i < 12; ++i) sum += (term *= y / i);
    for (i = 0; i < 16; ++i) sum *= sum;
    return sum;
}

static double abs_ref(double x) { return x < 0 ? -x : x; }

static int argmax(const float* logits, int n) {
    int i, best = 0;
    for (i = 1; i < n; ++i) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

static moe_sampler* make(const moe_sampler_params* p) {
    moe_sampler* s = NULL;
    moe_status st = moe_sampler_create(p, N_VOCAB, &s);
    EXPECT(st == MOE_STATUS_OK && s != NULL);
    return s;
}

static void neutral(moe_sampler_params* p) {
    moe_sampler_params_init(p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->seed = 7;
}

static void test_defaults(void) {
    moe_sampler_params p;
    uint64_t seed = 0;
    moe_sampler* s = NULL;
    moe_sampler_params_init(&p);
    EXPECT(p.struct_size == sizeof p);
    EXPECT(p.temperature == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f);
    EXPECT(p.min_keep == 0 && p.repeat_last_n == 64 && p.repeat_penalty == 1.0f);
    EXPECT(p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
    EXPECT(p.n_logit_bias == 0 && p.logit_bias == NULL && p.seed == MOE_SAMPLER_SEED_RANDOM);
    moe_sampler_params_init(NULL); /* no-op */
    moe_sampler_free(NULL);        /* no-op */
    EXPECT(moe_sampler_create(NULL, N_VOCAB, &s) == MOE_STATUS_OK); /* NULL params: defaults */
    EXPECT(moe_sampler_get_seed(s, &seed) == MOE_STATUS_OK && seed != MOE_SAMPLER_SEED_RANDOM);
    moe_sampler_free(s);
}

static void test_parameter_errors(void) {
    moe_sampler_params p;
    moe_sampler* s = NULL;
    moe_logit_bias bias[2];

    EXPECT_ERROR(moe_sampler_create(NULL, N_VOCAB, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_sampler");
    EXPECT_ERROR(moe_sampler_create(NULL, 0, &s), MOE_STATUS_INVALID_ARGUMENT, "n_vocab");
    EXPECT_ERROR(moe_sampler_create(NULL, -5, &s), MOE_STATUS_INVALID_ARGUMENT, "n_vocab");

#define BAD(stmt, field)                                                                 \
    do {                                                                                 \
        moe_sampler_params_init(&p);                                                     \
        stmt;                                                                            \
        EXPECT_ERROR(moe_sampler_create(&p, N_VOCAB, &s), MOE_STATUS_INVALID_ARGUMENT, field); \
    } while (0)
    BAD(p.struct_size = 0, "struct_size");
    BAD(p.temperature = NAN, "params->temperature");
    BAD(p.temperature = -INFINITY, "params->temperature");
    BAD(p.top_k = -1, "params->top_k");
    BAD(p.top_p = 0.0f, "params->top_p");
    BAD(p.top_p = 1.0001f, "params->top_p");
    BAD(p.top_p = NAN, "params->top_p");
    BAD(p.min_p = -0.01f, "params->min_p");
    BAD(p.min_p = NAN, "params->min_p");
    BAD(p.min_keep = -1, "params->min_keep");
    BAD(p.repeat_last_n = -2, "params->repeat_last_n");
    BAD(p.repeat_penalty = 0.0f, "params->repeat_penalty");
    BAD(p.repeat_penalty = INFINITY, "params->repeat_penalty");
    BAD(p.frequency_penalty = NAN, "params->frequency_penalty");
    BAD(p.presence_penalty = -INFINITY, "params->presence_penalty");
    BAD(p.n_logit_bias = -1, "params->n_logit_bias");
    BAD(p.n_logit_bias = 1, "params->logit_bias is NULL");
    bias[0].token = 3;
    bias[0].bias = 1.0f;
    bias[1].token = 4;
    bias[1].bias = NAN;
    BAD((p.logit_bias = bias, p.n_logit_bias = 2), "params->logit_bias[1].bias");
    bias[1].bias = INFINITY;
    BAD((p.logit_bias = bias, p.n_logit_bias = 2), "params->logit_bias[1].bias");
#undef BAD
    moe_sampler_params_init(&p);
    bias[1].bias = 1.0f;
    bias[1].token = N_VOCAB;
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    EXPECT_ERROR(moe_sampler_create(&p, N_VOCAB, &s), MOE_STATUS_OUT_OF_RANGE, "params->logit_bias[1].token");
    bias[1].token = -1;
    EXPECT_ERROR(moe_sampler_create(&p, N_VOCAB, &s), MOE_STATUS_OUT_OF_RANGE, "params->logit_bias[1].token");
}

/* A caller built before the logit bias and seed fields existed: whatever lies past its struct_size is
 * not read (the defaults apply). */
static void test_short_struct(void) {
    moe_sampler_params p;
    moe_sampler* s = NULL;
    moe_sampler_params_init(&p);
    p.struct_size = (uint32_t)offsetof(moe_sampler_params, n_logit_bias);
    p.n_logit_bias = -1;
    p.logit_bias = (const moe_logit_bias*)(void*)&p; /* never read */
    EXPECT(moe_sampler_create(&p, N_VOCAB, &s) == MOE_STATUS_OK);
    moe_sampler_free(s);
}

static void test_call_errors(void) {
    float logits[N_VOCAB];
    int32_t tok = -1, n = -1, ids[4], bad_tokens[2];
    float probs[4];
    moe_sampler_params p;
    moe_sampler* s;
    int i;
    neutral(&p);
    p.repeat_penalty = 2.0f;
    s = make(&p);
    random_logits(logits, N_VOCAB);
    EXPECT_ERROR(moe_sampler_sample(NULL, logits, N_VOCAB, &tok), MOE_STATUS_INVALID_ARGUMENT, "sampler");
    EXPECT_ERROR(moe_sampler_sample(s, NULL, N_VOCAB, &tok), MOE_STATUS_INVALID_ARGUMENT, "logits");
    EXPECT_ERROR(moe_sampler_sample(s, logits, N_VOCAB, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_token");
    EXPECT_ERROR(moe_sampler_sample(s, logits, N_VOCAB - 1, &tok), MOE_STATUS_INVALID_ARGUMENT, "n_vocab");
    EXPECT_ERROR(moe_sampler_apply(s, logits, N_VOCAB, NULL, NULL, 4, &n), MOE_STATUS_INVALID_ARGUMENT, "out_ids");
    EXPECT_ERROR(moe_sampler_apply(s, logits, N_VOCAB, ids, probs, -1, &n), MOE_STATUS_INVALID_ARGUMENT, "capacity");
    EXPECT_ERROR(moe_sampler_apply(s, logits, N_VOCAB, ids, probs, 4, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_n");
    EXPECT(tok == -1); /* outputs untouched on failure */
    logits[123] = NAN;
    EXPECT_ERROR(moe_sampler_sample(s, logits, N_VOCAB, &tok), MOE_STATUS_INVALID_ARGUMENT, "logits[123]");
    logits[123] = INFINITY;
    EXPECT_ERROR(moe_sampler_sample(s, logits, N_VOCAB, &tok), MOE_STATUS_INVALID_ARGUMENT, "logits[123]");
    for (i = 0; i < N_VOCAB; ++i) logits[i] = -INFINITY;
    EXPECT_ERROR(moe_sampler_sample(s, logits, N_VOCAB, &tok), MOE_STATUS_INVALID_ARGUMENT, "-inf");

    bad_tokens[0] = 1;
    bad_tokens[1] = N_VOCAB;
    EXPECT_ERROR(moe_sampler_accept(s, bad_tokens, 2), MOE_STATUS_OUT_OF_RANGE, "tokens[1]");
    EXPECT_ERROR(moe_sampler_accept(s, NULL, 1), MOE_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT_ERROR(moe_sampler_accept(s, bad_tokens, -1), MOE_STATUS_INVALID_ARGUMENT, "n_tokens");
    EXPECT(moe_sampler_accept(s, NULL, 0) == MOE_STATUS_OK);
    EXPECT_ERROR(moe_sampler_accept(NULL, bad_tokens, 1), MOE_STATUS_INVALID_ARGUMENT, "sampler");
    EXPECT_ERROR(moe_sampler_reset(NULL), MOE_STATUS_INVALID_ARGUMENT, "sampler");
    EXPECT_ERROR(moe_sampler_get_seed(s, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_seed");
    moe_sampler_free(s);
}

/* Greedy is the argmax; a -INFINITY bias bans the argmax, so the runner-up follows. */
static void test_greedy(void) {
    float logits[N_VOCAB];
    moe_sampler_params p;
    moe_logit_bias ban;
    moe_sampler *s, *banned;
    int32_t tok = -1, ids[2], n = 0;
    float probs[2];
    int trial, top;
    neutral(&p);
    p.temperature = 0.0f;
    p.top_k = 5; /* filters cannot change a greedy choice */
    p.top_p = 0.3f;
    s = make(&p);
    for (trial = 0; trial < 50; ++trial) {
        random_logits(logits, N_VOCAB);
        top = argmax(logits, N_VOCAB);
        EXPECT(moe_sampler_sample(s, logits, N_VOCAB, &tok) == MOE_STATUS_OK && tok == top);
        EXPECT(moe_sampler_apply(s, logits, N_VOCAB, ids, probs, 2, &n) == MOE_STATUS_OK);
        EXPECT(n == 1 && ids[0] == top && probs[0] == 1.0f);

        ban.token = top;
        ban.bias = -INFINITY;
        p.logit_bias = &ban;
        p.n_logit_bias = 1;
        banned = make(&p);
        p.logit_bias = NULL;
        p.n_logit_bias = 0;
        logits[top] = -INFINITY;
        EXPECT(moe_sampler_sample(banned, logits, N_VOCAB, &tok) == MOE_STATUS_OK && tok == argmax(logits, N_VOCAB));
        moe_sampler_free(banned);
    }
    moe_sampler_free(s);
}

/* Top-k alone: the k highest logits (lower ids first among equal ones), with softmax probabilities. */
static void test_top_k(void) {
    enum { K = 7 };
    float logits[N_VOCAB], probs[N_VOCAB];
    int32_t ids[N_VOCAB], n = 0;
    int want[K], taken[N_VOCAB];
    double e[K], sum = 0.0;
    moe_sampler_params p;
    moe_sampler* s;
    int i, j;
    neutral(&p);
    p.top_k = K;
    s = make(&p);
    random_logits(logits, N_VOCAB);
    memset(taken, 0, sizeof taken);
    for (i = 0; i < K; ++i) { /* selection by repeated argmax over the ones not taken */
        int best = -1;
        for (j = 0; j < N_VOCAB; ++j) {
            if (!taken[j] && (best < 0 || logits[j] > logits[best])) best = j;
        }
        taken[best] = 1;
        want[i] = best;
    }
    for (i = 0; i < K; ++i) sum += (e[i] = exp_ref((double)logits[want[i]] - (double)logits[want[0]]));
    EXPECT(moe_sampler_apply(s, logits, N_VOCAB, NULL, NULL, 0, &n) == MOE_STATUS_OK && n == K);
    EXPECT(moe_sampler_apply(s, logits, N_VOCAB, ids, probs, N_VOCAB, &n) == MOE_STATUS_OK && n == K);
    for (i = 0; i < K; ++i) {
        EXPECT(ids[i] == want[i]);
        EXPECT(abs_ref(probs[i] - e[i] / sum) <= 1e-6 + 1e-5 * e[i] / sum);
    }
    moe_sampler_free(s);
}

/* Two entries for one token add up: the same distribution as one entry with their sum. */
static void test_bias_entries_add(void) {
    float logits[N_VOCAB], pa[16], pb[16];
    int32_t ia[16], ib[16], na = 0, nb = 0;
    moe_logit_bias two[2], one;
    moe_sampler_params p;
    moe_sampler *a, *b;
    int i;
    neutral(&p);
    p.top_k = 16;
    random_logits(logits, N_VOCAB);
    two[0].token = two[1].token = one.token = 321;
    two[0].bias = 6.0f; /* logits lie in [-6, 6): 13 puts token 321 first */
    two[1].bias = 7.0f;
    one.bias = 13.0f;
    p.logit_bias = two;
    p.n_logit_bias = 2;
    a = make(&p);
    p.logit_bias = &one;
    p.n_logit_bias = 1;
    b = make(&p);
    EXPECT(moe_sampler_apply(a, logits, N_VOCAB, ia, pa, 16, &na) == MOE_STATUS_OK);
    EXPECT(moe_sampler_apply(b, logits, N_VOCAB, ib, pb, 16, &nb) == MOE_STATUS_OK);
    EXPECT(na == 16 && nb == 16 && ia[0] == 321);
    /* (x + 6) + 7 and x + 13 may round apart by an ulp in float: the probabilities agree to rounding. */
    for (i = 0; i < 16 && i < na && i < nb; ++i) EXPECT(ia[i] == ib[i] && fabsf(pa[i] - pb[i]) <= 1e-5f * pb[i]);
    moe_sampler_free(a);
    moe_sampler_free(b);
}

/* Same seed, same tokens; reset replays them; get_seed reproduces a random seed. */
static void test_reproducible(void) {
    enum { STEPS = 64 };
    static float logits[STEPS][N_VOCAB];
    int32_t first[STEPS], tok;
    moe_sampler_params p;
    moe_sampler *a, *b, *r, *r2;
    uint64_t seed = 0;
    int i, differ = 0;
    moe_sampler_params_init(&p); /* the default chain */
    p.seed = 20261126;
    p.temperature = 1.5f;
    p.repeat_penalty = 1.1f;
    a = make(&p);
    b = make(&p);
    for (i = 0; i < STEPS; ++i) {
        random_logits(logits[i], N_VOCAB);
        EXPECT(moe_sampler_sample(a, logits[i], N_VOCAB, &first[i]) == MOE_STATUS_OK);
        EXPECT(moe_sampler_accept(a, &first[i], 1) == MOE_STATUS_OK);
        EXPECT(moe_sampler_sample(b, logits[i], N_VOCAB, &tok) == MOE_STATUS_OK && tok == first[i]);
        EXPECT(moe_sampler_accept(b, &tok, 1) == MOE_STATUS_OK);
    }
    EXPECT(moe_sampler_reset(a) == MOE_STATUS_OK);
    for (i = 0; i < STEPS; ++i) {
        EXPECT(moe_sampler_sample(a, logits[i], N_VOCAB, &tok) == MOE_STATUS_OK && tok == first[i]);
        EXPECT(moe_sampler_accept(a, &tok, 1) == MOE_STATUS_OK);
    }
    p.seed = MOE_SAMPLER_SEED_RANDOM;
    r = make(&p);
    EXPECT(moe_sampler_get_seed(r, &seed) == MOE_STATUS_OK);
    p.seed = seed;
    r2 = make(&p);
    for (i = 0; i < STEPS; ++i) {
        int32_t t2 = -2;
        EXPECT(moe_sampler_sample(r, logits[i], N_VOCAB, &tok) == MOE_STATUS_OK);
        EXPECT(moe_sampler_sample(r2, logits[i], N_VOCAB, &t2) == MOE_STATUS_OK && tok == t2);
        differ += tok != first[i];
    }
    EXPECT(differ > 0); /* another seed, other tokens (64 draws from tens of candidates) */
    moe_sampler_free(a);
    moe_sampler_free(b);
    moe_sampler_free(r);
    moe_sampler_free(r2);
}

int main(void) {
    g_rng_state = (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ULL | 1ULL;
    if (getenv("MOEINFER_TEST_SEED") != NULL) g_rng_state = strtoull(getenv("MOEINFER_TEST_SEED"), NULL, 10) | 1ULL;
    printf("MOEINFER_TEST_SEED=%llu\n", g_rng_state);
    test_defaults();
    test_parameter_errors();
    test_short_struct();
    test_call_errors();
    test_greedy();
    test_top_k();
    test_bias_entries_add();
    test_reproducible();
    if (g_failures != 0) {
        fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    printf("sampler C API: all checks passed\n");
    return 0;
}
