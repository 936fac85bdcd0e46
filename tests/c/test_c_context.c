/* C99 test of the context API: creating contexts on tiny synthetic models, decoding, logits, the KV
 * cache, profiling and every error path, as a C user sees them. (The logits' values are checked against
 * a float64 reference in tests/python/test_forward_reference.py; here the contract is.) */
#include <math.h> /* isfinite (a macro) */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_older_caller.h"
#include "c_random.h"
#include "moeinfer/moeinfer.h"

static int g_failures = 0;

#define EXPECT(cond)                                                             \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: EXPECT failed: %s (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, moe_last_error());                          \
            ++g_failures;                                                        \
        }                                                                        \
    } while (0)

#define EXPECT_STATUS(expr, want)                                                          \
    do {                                                                                   \
        moe_status got_ = (expr);                                                          \
        if (got_ != (want)) {                                                              \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, \
                    __LINE__, #expr, moe_status_string(got_), moe_status_string(want),     \
                    moe_last_error());                                                     \
            ++g_failures;                                                                  \
        }                                                                                  \
    } while (0)

/* A failing call must say why: moe_last_error() names the argument or the problem. */
#define EXPECT_ERROR(expr, want, words)                                                      \
    do {                                                                                     \
        EXPECT_STATUS(expr, want);                                                           \
        if (strstr(moe_last_error(), (words)) == NULL) {                                     \
            fprintf(stderr, "%s:%d: %s: message '%s' does not mention '%s'\n", __FILE__,     \
                    __LINE__, #expr, moe_last_error(), (words));                             \
            ++g_failures;                                                                    \
        }                                                                                    \
    } while (0)

#define N_PROMPT 12

static const char* tmp_path(const char* name) {
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", MOE_TEST_TMP_DIR, name);
    return buf;
}

static moe_model* tiny_model(const char* arch) {
    char name[64];
    const char* path;
    moe_synth_params sp;
    moe_model* model = NULL;
    snprintf(name, sizeof name, "c_context_%s.gguf", arch);
    path = tmp_path(name);
    EXPECT_STATUS(moe_synth_params_init(&sp, arch), MOE_STATUS_OK);
    sp.preset = "tiny";
    sp.seed = (uint64_t)g_rng;
    EXPECT_STATUS(moe_synth_write(path, &sp), MOE_STATUS_OK);
    EXPECT_STATUS(moe_model_load(path, NULL, &model), MOE_STATUS_OK);
    return model;
}

static int32_t vocab_of(const moe_model* model) {
    moe_model_info info;
    moe_model_info_init(&info);
    EXPECT_STATUS(moe_model_get_info(model, &info), MOE_STATUS_OK);
    return info.n_vocab;
}

static int32_t n_past_of(const moe_context* ctx) {
    int32_t n = -1;
    EXPECT_STATUS(moe_context_n_past(ctx, &n), MOE_STATUS_OK);
    return n;
}

/* max |a - b| / max |b| */
static double rel_diff(const float* a, const float* b, size_t n) {
    double num = 0.0, den = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) {
        double d = (double)a[i] - (double)b[i], m = (double)b[i];
        if (d < 0.0) d = -d; /* no fabs: the test links only moeinfer, not libm */
        if (m < 0.0) m = -m;
        if (d > num) num = d;
        if (m > den) den = m;
    }
    return den > 0.0 ? num / den : num;
}

static void test_params_and_create(moe_model* model) {
    moe_context_params p;
    moe_context* ctx = NULL;
    moe_context* untouched = (moe_context*)&p; /* a sentinel: outputs are written only on success */
    int32_t tokens[10];

    moe_context_params_init(&p);
    EXPECT(p.struct_size == sizeof p);
    EXPECT(p.n_ctx == 4096 && p.n_ubatch == 512 && p.n_threads == 0);
    moe_context_params_init(NULL); /* no-op */

    EXPECT_ERROR(moe_context_create(NULL, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "model");
    EXPECT_ERROR(moe_context_create(model, &p, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_ctx");

    ctx = untouched;
    p.n_ctx = 0;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "n_ctx");
    moe_context_params_init(&p);
    p.n_ubatch = -1;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "n_ubatch");
    moe_context_params_init(&p);
    p.n_threads = -3;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "n_threads");
    /* Above MOE_MAX_THREADS is refused at creation (2^24 and more used to be accepted, then crash or hang
     * oneTBB at the first decode); MOE_MAX_THREADS itself works, though this machine has fewer cores. */
    p.device = MOE_DEVICE_CPU;
    p.n_threads = MOE_MAX_THREADS + 1;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "n_threads");
    p.n_threads = 1 << 24;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "n_threads");
    p.n_threads = INT32_MAX;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "n_threads");
    {
        moe_context* most = NULL;
        p.n_threads = MOE_MAX_THREADS;
        p.n_ctx = 16;
        EXPECT_STATUS(moe_context_create(model, &p, &most), MOE_STATUS_OK);
        random_tokens(tokens, 4, vocab_of(model));
        if (most != NULL) EXPECT_STATUS(moe_decode(most, tokens, NULL, 4, 0), MOE_STATUS_OK);
        moe_context_free(most);
    }
    moe_context_params_init(&p);
    EXPECT(p.device == MOE_DEVICE_AUTO);
    p.device = 7;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "device");
    p.device = MOE_DEVICE_CUDA;
#if !MOEINFER_HAS_CUDA
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_UNIMPLEMENTED, "cuda");
#else
    {
        /* A CUDA build: OK with a GPU, FAILED_PRECONDITION without one. */
        moe_context* gpu = NULL;
        moe_status st = moe_context_create(model, &p, &gpu);
        EXPECT(st == MOE_STATUS_OK || st == MOE_STATUS_FAILED_PRECONDITION);
        if (st == MOE_STATUS_FAILED_PRECONDITION) printf("skipped: no CUDA device (CUDA context creation)\n");
        moe_context_free(gpu);
    }
#endif
    moe_context_params_init(&p);
    p.struct_size = 0;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "struct_size");
    p.struct_size = (uint32_t)offsetof(moe_context_params, n_ctx); /* ends before n_ctx */
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "struct_size");
    EXPECT(ctx == untouched);

    /* An older caller whose struct ends after n_ctx: fields past struct_size are not read. */
    moe_context_params_init(&p);
    p.n_ctx = 8;
    as_older_caller(&p, sizeof p, offsetof(moe_context_params, n_ctx) + sizeof(int32_t));
    ctx = NULL;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    EXPECT(ctx != NULL);
    random_tokens(tokens, 10, vocab_of(model));
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 8, 0), MOE_STATUS_OK);         /* n_ctx = 8 was read */
    EXPECT_ERROR(moe_decode(ctx, tokens, NULL, 1, 0), MOE_STATUS_OUT_OF_RANGE, "n_ctx");
    moe_context_free(ctx);

    /* NULL params: the defaults. */
    ctx = NULL;
    EXPECT_STATUS(moe_context_create(model, NULL, &ctx), MOE_STATUS_OK);
    EXPECT(ctx != NULL);
    moe_context_free(ctx);
    moe_context_free(NULL); /* no-op */
}

static void test_decode_and_logits(moe_model* model, const char* arch) {
    const int32_t n_vocab = vocab_of(model);
    moe_context_params p;
    moe_context* ctx = NULL;
    int32_t tokens[N_PROMPT], positions[4];
    const float* logits = NULL;
    float* last_row;
    float* all_rows;
    int32_t rows = -1, vocab = -1;
    size_t i;
    int finite = 1, nonzero = 0;

    moe_context_params_init(&p);
    p.n_ctx = 32;
    p.n_ubatch = 5; /* N_PROMPT tokens take three ubatches */
    p.n_threads = 2;
    p.device = MOE_DEVICE_CPU; /* the 1e-5 bounds below are the CPU backend's */
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    random_tokens(tokens, N_PROMPT, n_vocab);
    /* Rows 0 and 1 must differ below: with one token twice, row 1 attends to two equal values and repeats
     * row 0 (MOEINFER_TEST_SEED=1795811160 drew that). */
    if (tokens[1] == tokens[0]) tokens[1] = (tokens[0] + 1) % n_vocab;

    EXPECT(n_past_of(ctx) == 0);
    EXPECT_ERROR(moe_get_logits(ctx, &logits, &rows, &vocab), MOE_STATUS_FAILED_PRECONDITION, "moe_decode");

    /* Last token only. */
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, N_PROMPT, 0), MOE_STATUS_OK);
    EXPECT(n_past_of(ctx) == N_PROMPT);
    EXPECT_STATUS(moe_get_logits(ctx, &logits, &rows, &vocab), MOE_STATUS_OK);
    EXPECT(rows == 1 && vocab == n_vocab);
    for (i = 0; i < (size_t)n_vocab; ++i) {
        if (!isfinite(logits[i])) finite = 0;
        if (logits[i] != 0.0f) ++nonzero;
    }
    EXPECT(finite && nonzero > n_vocab / 2);
    last_row = (float*)malloc(sizeof(float) * (size_t)n_vocab);
    memcpy(last_row, logits, sizeof(float) * (size_t)n_vocab); /* borrowed until the next decode */
    /* The row-count and vocabulary outputs are optional. */
    logits = NULL;
    EXPECT_STATUS(moe_get_logits(ctx, &logits, NULL, NULL), MOE_STATUS_OK);
    EXPECT(logits != NULL);

    /* Every token, after clearing the cache: the last row is the same as before. */
    EXPECT_STATUS(moe_kv_clear(ctx), MOE_STATUS_OK);
    EXPECT(n_past_of(ctx) == 0);
    EXPECT_STATUS(moe_get_logits(ctx, &logits, &rows, &vocab), MOE_STATUS_FAILED_PRECONDITION);
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, N_PROMPT, 1), MOE_STATUS_OK);
    EXPECT_STATUS(moe_get_logits(ctx, &logits, &rows, &vocab), MOE_STATUS_OK);
    EXPECT(rows == N_PROMPT && vocab == n_vocab);
    all_rows = (float*)malloc(sizeof(float) * (size_t)n_vocab * N_PROMPT);
    memcpy(all_rows, logits, sizeof(float) * (size_t)n_vocab * N_PROMPT);
    EXPECT(rel_diff(all_rows + (size_t)(N_PROMPT - 1) * (size_t)n_vocab, last_row, (size_t)n_vocab) < 1e-5);
    EXPECT(rel_diff(all_rows, all_rows + (size_t)n_vocab, (size_t)n_vocab) > 1e-3); /* rows differ */

    /* Rewinding: positions from 4 replace tokens 4.. ; the result is the prompt's own rows 4..7. */
    for (i = 0; i < 4; ++i) positions[i] = 4 + (int32_t)i;
    EXPECT_STATUS(moe_decode(ctx, tokens + 4, positions, 4, 1), MOE_STATUS_OK);
    EXPECT(n_past_of(ctx) == 8);
    EXPECT_STATUS(moe_get_logits(ctx, &logits, &rows, &vocab), MOE_STATUS_OK);
    EXPECT(rows == 4);
    EXPECT(rel_diff(logits, all_rows + 4 * (size_t)n_vocab, 4 * (size_t)n_vocab) < 1e-5);
    /* Positions equal to n_past simply continue. */
    positions[0] = 8;
    EXPECT_STATUS(moe_decode(ctx, tokens + 8, positions, 1, 0), MOE_STATUS_OK);
    EXPECT(n_past_of(ctx) == 9);
    EXPECT_STATUS(moe_get_logits(ctx, &logits, &rows, &vocab), MOE_STATUS_OK);
    EXPECT(rows == 1 && rel_diff(logits, all_rows + 8 * (size_t)n_vocab, (size_t)n_vocab) < 1e-5);

    free(last_row);
    free(all_rows);
    moe_context_free(ctx);
    printf("test_c_context: %s decode ok (n_vocab %d)\n", arch, (int)n_vocab);
}

static void test_decode_errors(moe_model* model) {
    const int32_t n_vocab = vocab_of(model);
    moe_context_params p;
    moe_context* ctx = NULL;
    int32_t tokens[16], bad[2], positions[16];
    int i;
    const float* logits = NULL;
    int32_t rows = 0, n = 0;

    moe_context_params_init(&p);
    p.n_ctx = 16;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    random_tokens(tokens, 16, n_vocab);
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 10, 0), MOE_STATUS_OK);

    EXPECT_ERROR(moe_decode(NULL, tokens, NULL, 1, 0), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_decode(ctx, NULL, NULL, 1, 0), MOE_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT_ERROR(moe_decode(ctx, tokens, NULL, 0, 0), MOE_STATUS_INVALID_ARGUMENT, "n_tokens");
    EXPECT_ERROR(moe_decode(ctx, tokens, NULL, -4, 0), MOE_STATUS_INVALID_ARGUMENT, "n_tokens");
    bad[0] = 1;
    bad[1] = n_vocab;
    EXPECT_ERROR(moe_decode(ctx, bad, NULL, 2, 0), MOE_STATUS_OUT_OF_RANGE, "tokens[1]");
    bad[1] = -1;
    EXPECT_ERROR(moe_decode(ctx, bad, NULL, 2, 0), MOE_STATUS_OUT_OF_RANGE, "tokens[1]");
    EXPECT_ERROR(moe_decode(ctx, tokens, NULL, 7, 0), MOE_STATUS_OUT_OF_RANGE, "overflow");
    positions[0] = 10;
    positions[1] = 11;
    positions[2] = 13;
    EXPECT_ERROR(moe_decode(ctx, tokens, positions, 3, 0), MOE_STATUS_INVALID_ARGUMENT, "consecutive");
    positions[0] = 11;
    positions[1] = 12;
    EXPECT_ERROR(moe_decode(ctx, tokens, positions, 2, 0), MOE_STATUS_INVALID_ARGUMENT, "n_past");
    positions[0] = -1;
    EXPECT_ERROR(moe_decode(ctx, tokens, positions, 1, 0), MOE_STATUS_INVALID_ARGUMENT, "positions[0]");
    /* A rewind that would still overflow is refused too. */
    for (i = 0; i < 15; ++i) positions[i] = 2 + i;
    EXPECT_ERROR(moe_decode(ctx, tokens, positions, 15, 0), MOE_STATUS_OUT_OF_RANGE, "overflow");
    EXPECT(n_past_of(ctx) == 10); /* no failure changed the sequence */

    /* The rest of the cache fills exactly; then nothing more fits. */
    EXPECT_STATUS(moe_decode(ctx, tokens + 10, NULL, 6, 0), MOE_STATUS_OK);
    EXPECT(n_past_of(ctx) == 16);
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 1, 0), MOE_STATUS_OUT_OF_RANGE);
    EXPECT(n_past_of(ctx) == 16);

    EXPECT_ERROR(moe_get_logits(NULL, &logits, &rows, NULL), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_get_logits(ctx, NULL, &rows, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_logits");
    EXPECT_ERROR(moe_context_n_past(NULL, &n), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_context_n_past(ctx, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_n_past");
    EXPECT_ERROR(moe_kv_clear(NULL), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    moe_context_free(ctx);
}

static void test_profiling(moe_model* model) {
    moe_context_params p;
    moe_context* ctx = NULL;
    moe_op_profile entries[64], one;
    int32_t tokens[N_PROMPT], n = -1, got = -1, i, n_layer;
    int found_moe = 0;
    double total = 0.0;
    moe_model_info info;

    moe_model_info_init(&info);
    EXPECT_STATUS(moe_model_get_info(model, &info), MOE_STATUS_OK);
    n_layer = info.n_layer;
    moe_context_params_init(&p);
    p.n_ctx = 32;
    p.n_ubatch = 4;
    p.device = MOE_DEVICE_CPU; /* every profiled op must run on the "cpu" backend */
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    random_tokens(tokens, N_PROMPT, info.n_vocab);

    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 2, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_context_get_profile(ctx, NULL, 0, &n), MOE_STATUS_OK);
    EXPECT(n == 0); /* off by default */

    EXPECT_STATUS(moe_context_set_profiling(ctx, 1), MOE_STATUS_OK);
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, N_PROMPT, 0), MOE_STATUS_OK); /* 3 ubatches of 4 */
    EXPECT_STATUS(moe_context_get_profile(ctx, NULL, 0, &n), MOE_STATUS_OK);
    EXPECT(n > 0 && n <= 64);
    if (n <= 0 || n > 64) n = 0;
    EXPECT_STATUS(moe_context_get_profile(ctx, entries, 64, &got), MOE_STATUS_OK);
    EXPECT(got == n);
    for (i = 0; i < n; ++i) {
        EXPECT(entries[i].op != NULL && entries[i].backend != NULL);
        if (entries[i].op == NULL || entries[i].backend == NULL) continue;
        EXPECT(strcmp(entries[i].backend, "cpu") == 0);
        EXPECT(entries[i].count > 0 && entries[i].seconds >= 0.0);
        total += entries[i].seconds;
        if (strcmp(entries[i].op, "MOE_UP_GATE") == 0 || strcmp(entries[i].op, "MUL_MAT_ID") == 0 ||
            strcmp(entries[i].op, "ATTENTION") == 0) {
            EXPECT(entries[i].count == 3 * (int64_t)n_layer); /* once per layer and ubatch */
            ++found_moe;
        }
    }
    EXPECT(found_moe == 3);
    EXPECT(total > 0.0);
    /* A smaller array gets the first entries; out_n still counts all of them. */
    got = -1;
    EXPECT_STATUS(moe_context_get_profile(ctx, &one, 1, &got), MOE_STATUS_OK);
    EXPECT(got == n);
    if (n > 0) EXPECT(one.op != NULL && entries[0].op != NULL && strcmp(one.op, entries[0].op) == 0);

    EXPECT_ERROR(moe_context_get_profile(NULL, entries, 64, &got), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_context_get_profile(ctx, entries, 64, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_n");
    EXPECT_ERROR(moe_context_get_profile(ctx, entries, -1, &got), MOE_STATUS_INVALID_ARGUMENT, "capacity");
    EXPECT_ERROR(moe_context_get_profile(ctx, NULL, 4, &got), MOE_STATUS_INVALID_ARGUMENT, "entries");
    EXPECT_ERROR(moe_context_set_profiling(NULL, 1), MOE_STATUS_INVALID_ARGUMENT, "ctx");

    /* Turning it off resets the counters, and nothing more is counted. */
    EXPECT_STATUS(moe_context_set_profiling(ctx, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 4, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_context_get_profile(ctx, NULL, 0, &n), MOE_STATUS_OK);
    EXPECT(n == 0);
    moe_context_free(ctx);
}

/* The ubatch timeline: off by default, the last `capacity` ubatches oldest first, the dropped count,
 * argument checks. */
static void test_timeline(moe_model* model) {
    moe_context_params p;
    moe_context* ctx = NULL;
    moe_ubatch_timing t[4], one;
    int32_t tokens[N_PROMPT], n = -1, got = -1, i;
    uint64_t dropped = 99;
    moe_model_info info;

    moe_model_info_init(&info);
    EXPECT_STATUS(moe_model_get_info(model, &info), MOE_STATUS_OK);
    moe_context_params_init(&p);
    p.n_ctx = 32;
    p.n_ubatch = 4;
    p.device = MOE_DEVICE_CPU;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    random_tokens(tokens, N_PROMPT, info.n_vocab);

    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 2, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_context_get_timeline(ctx, NULL, 0, &n, &dropped), MOE_STATUS_OK);
    EXPECT(n == 0 && dropped == 0); /* off by default */

    EXPECT_STATUS(moe_context_set_timeline(ctx, 3), MOE_STATUS_OK);
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 10, 0), MOE_STATUS_OK); /* ubatches of 4, 4, 2 */
    EXPECT_STATUS(moe_decode(ctx, tokens + 10, NULL, 1, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_context_get_timeline(ctx, t, 4, &n, &dropped), MOE_STATUS_OK);
    EXPECT(n == 3 && dropped == 1);
    if (n == 3) {
        EXPECT(t[0].n_tokens == 4 && t[1].n_tokens == 2 && t[2].n_tokens == 1);
        for (i = 0; i < 3; ++i) {
            EXPECT(t[i].ok == 1 && t[i].t_start >= 0.0 && t[i].t_end >= t[i].t_start);
            EXPECT(t[i].seconds_host_compute > 0.0 && t[i].seconds_host_compute <= t[i].t_end - t[i].t_start);
            EXPECT(t[i].bytes_weights == 0 && t[i].bytes_activations == 0); /* a CPU context copies nothing */
            if (i > 0) EXPECT(t[i].t_start >= t[i - 1].t_end);
        }
    }
    /* A smaller array gets the oldest entries; out_n still counts all of them. */
    EXPECT_STATUS(moe_context_get_timeline(ctx, &one, 1, &got, NULL), MOE_STATUS_OK);
    EXPECT(got == 3 && one.n_tokens == 4);

    EXPECT_ERROR(moe_context_set_timeline(NULL, 4), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_context_set_timeline(ctx, -1), MOE_STATUS_INVALID_ARGUMENT, "timeline capacity -1");
    EXPECT_ERROR(moe_context_set_timeline(ctx, (1 << 20) + 1), MOE_STATUS_INVALID_ARGUMENT, "timeline capacity");
    EXPECT_ERROR(moe_context_get_timeline(NULL, t, 4, &n, NULL), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_context_get_timeline(ctx, t, 4, NULL, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_n");
    EXPECT_ERROR(moe_context_get_timeline(ctx, t, -1, &n, NULL), MOE_STATUS_INVALID_ARGUMENT, "capacity");
    EXPECT_ERROR(moe_context_get_timeline(ctx, NULL, 4, &n, NULL), MOE_STATUS_INVALID_ARGUMENT, "entries");

    /* Switched off, the record is dropped and nothing more is recorded. */
    EXPECT_STATUS(moe_context_set_timeline(ctx, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_decode(ctx, tokens + 11, NULL, 1, 0), MOE_STATUS_OK);
    EXPECT_STATUS(moe_context_get_timeline(ctx, NULL, 0, &n, &dropped), MOE_STATUS_OK);
    EXPECT(n == 0 && dropped == 0);
    moe_context_free(ctx);
}

/* The device a context was created for, through moe_context_get_device: explicit devices as given,
 * MOE_DEVICE_AUTO (the default) resolved to CUDA exactly when a CUDA context can be created here. */
static void test_device_auto(moe_model* model) {
    moe_context_params p;
    moe_context* ctx = NULL;
    moe_context* gpu = NULL;
    int32_t device = -1, want = MOE_DEVICE_CPU;
    int32_t tokens[4];

    moe_context_params_init(&p);
    p.n_ctx = 16;
    p.device = MOE_DEVICE_CUDA;
    if (moe_context_create(model, &p, &gpu) == MOE_STATUS_OK) want = MOE_DEVICE_CUDA;
    moe_context_free(gpu);

    p.device = MOE_DEVICE_AUTO;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    EXPECT_STATUS(moe_context_get_device(ctx, &device), MOE_STATUS_OK);
    EXPECT(device == want);
    random_tokens(tokens, 4, vocab_of(model));
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, 4, 0), MOE_STATUS_OK);
    EXPECT_ERROR(moe_context_get_device(NULL, &device), MOE_STATUS_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(moe_context_get_device(ctx, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_device");
    moe_context_free(ctx);

    /* NULL params are the defaults: auto as well. */
    ctx = NULL;
    EXPECT_STATUS(moe_context_create(model, NULL, &ctx), MOE_STATUS_OK);
    device = -1;
    if (ctx != NULL) EXPECT_STATUS(moe_context_get_device(ctx, &device), MOE_STATUS_OK);
    EXPECT(device == want);
    moe_context_free(ctx);

    /* Explicit devices are kept. */
    p.device = MOE_DEVICE_CPU;
    ctx = NULL;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    device = -1;
    if (ctx != NULL) EXPECT_STATUS(moe_context_get_device(ctx, &device), MOE_STATUS_OK);
    EXPECT(device == MOE_DEVICE_CPU);
    moe_context_free(ctx);
    p.device = MOE_DEVICE_EMULATED;
    ctx = NULL;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    device = -1;
    if (ctx != NULL) EXPECT_STATUS(moe_context_get_device(ctx, &device), MOE_STATUS_OK);
    EXPECT(device == MOE_DEVICE_EMULATED);
    moe_context_free(ctx);
    printf("test_c_context: MOE_DEVICE_AUTO chose %s\n", want == MOE_DEVICE_CUDA ? "CUDA" : "CPU");
}

/* Callers built before the expert split pass the older, shorter policy and stats structs: the fields
 * they know are read and written, the newer ones take their defaults and are not written. */
/* backend_options: NULL by default, ignored past an older caller's struct_size, a bad entry named; the
 * thresholds' sources in the stats (the emulated device keeps the fixed ones). */
static void test_backend_options(moe_model* model) {
    moe_context_params p;
    moe_sched_stats st;
    moe_context* ctx = NULL;
    int op;

    moe_context_params_init(&p);
    EXPECT(p.backend_options == NULL);
    EXPECT(strstr(moe_backend_options_help(), "offload_calibration=auto|on|off") != NULL);
    p.n_ctx = 64;
    p.n_ubatch = 16;
    p.device = MOE_DEVICE_EMULATED;
    p.tensor_overrides = "exps=CPU";
    p.backend_options = "emulated_async=off,nonsense=3";
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "unknown key 'nonsense'");
    EXPECT(ctx == NULL);
    as_older_caller(&p, sizeof p, offsetof(moe_context_params, backend_options)); /* built before the field */
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    moe_context_free(ctx);
    ctx = NULL;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.n_ubatch = 16;
    p.device = MOE_DEVICE_EMULATED;
    p.tensor_overrides = "exps=CPU";
    p.backend_options = "offload_calibration=off,emulated_pcie_gbps=0";
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    st.struct_size = sizeof st;
    EXPECT_STATUS(moe_context_get_stats(ctx, &st), MOE_STATUS_OK);
    for (op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        EXPECT(st.offload_min_batch_source[op] == MOE_THRESHOLD_DEFAULT);
        EXPECT(st.offload_min_batch[op] >= 32);
    }
    EXPECT(strcmp(moe_threshold_source_name(MOE_THRESHOLD_MEASURED), "measured") == 0);
    EXPECT(strcmp(moe_threshold_source_name(MOE_THRESHOLD_OVERRIDE), "override") == 0);
    EXPECT(moe_threshold_source_name(-1) == NULL);
    moe_context_free(ctx);
}

static void test_older_struct_sizes(moe_model* model) {
    moe_context_params p;
    moe_sched_policy old_policy, got;
    moe_sched_stats old_stats;
    moe_context* ctx = NULL;
    int32_t tokens[N_PROMPT];

    moe_sched_policy_init(&old_policy);
    old_policy.bias_dup = 0;
    as_older_caller(&old_policy, sizeof old_policy, offsetof(moe_sched_policy, expert_split));
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.n_ubatch = 16;
    p.device = MOE_DEVICE_EMULATED;
    p.tensor_overrides = "exps=CPU";
    p.policy = &old_policy;
    EXPECT_STATUS(moe_context_create(model, &p, &ctx), MOE_STATUS_OK);
    if (ctx == NULL) return;
    moe_sched_policy_init(&got);
    EXPECT_STATUS(moe_context_get_policy(ctx, &got), MOE_STATUS_OK);
    EXPECT(got.bias_dup == 0 && got.expert_split == MOE_EXPERT_SPLIT_AUTO); /* the default */
    EXPECT(got.expert_cache == MOE_EXPERT_CACHE_AUTO);                       /* ... and this one's */

    random_tokens(tokens, N_PROMPT, vocab_of(model));
    EXPECT_STATUS(moe_decode(ctx, tokens, NULL, N_PROMPT, 0), MOE_STATUS_OK);
    memset(&old_stats, 0xAB, sizeof old_stats);
    as_older_caller(&old_stats, sizeof old_stats, offsetof(moe_sched_stats, n_split_layers));
    EXPECT_STATUS(moe_context_get_stats(ctx, &old_stats), MOE_STATUS_OK);
    EXPECT(old_stats.n_ubatches == 1);
    EXPECT(older_caller_tail_untouched(&old_stats, sizeof old_stats, offsetof(moe_sched_stats, n_split_layers)));
    /* A caller built before n_split_trials: the split fields it knows are written, the new tail is not. */
    memset(&old_stats, 0xAB, sizeof old_stats);
    as_older_caller(&old_stats, sizeof old_stats, offsetof(moe_sched_stats, n_split_trials));
    EXPECT_STATUS(moe_context_get_stats(ctx, &old_stats), MOE_STATUS_OK);
    EXPECT(old_stats.n_ubatches == 1);
    EXPECT(old_stats.n_split_layers != 0xABABABABABABABABull && old_stats.n_split_host_experts != 0xABABABABABABABABull);
    EXPECT(older_caller_tail_untouched(&old_stats, sizeof old_stats, offsetof(moe_sched_stats, n_split_trials)));
    moe_context_free(ctx);
}

int main(void) {
    static const char* const archs[] = {"qwen3moe", "gpt-oss"};
    size_t a;
    seed_random("test_c_context");

    for (a = 0; a < sizeof archs / sizeof archs[0]; ++a) {
        moe_model* model = tiny_model(archs[a]);
        if (model == NULL) continue;
        test_params_and_create(model);
        test_decode_and_logits(model, archs[a]);
        test_decode_errors(model);
        test_profiling(model);
        test_timeline(model);
        test_device_auto(model);
        test_backend_options(model);
        test_older_struct_sizes(model);
        moe_model_free(model);
    }
    if (g_failures != 0) {
        fprintf(stderr, "test_c_context: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_c_context: all checks passed\n");
    return 0;
}
