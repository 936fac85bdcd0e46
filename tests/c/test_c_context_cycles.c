/* C99 test: a program that creates a context, decodes and frees it, thousands of times, keeps its
 * memory. Each context used to own oneTBB task arenas, and oneTBB keeps about 7 KB per destroyed arena
 * of 2 threads once it has run work (more with more threads), so such a loop grew by ~14 MB per 2,000
 * contexts; the arenas are now leased from a process-wide pool (lib/core/task_arenas.h).
 *
 * The bound: after a warm-up (allocator pools, the pool's first arenas), 2,000 create/decode/free
 * cycles of each configuration may grow the resident set by at most 2 MB (1 KB per context); with an
 * arena per context it grew by 9-14 MB (2 threads) and 25 MB (4 threads), and now by under 0.4 MB.
 * Several configurations are measured because the growth depends on them (none with 1 thread; per
 * arena it grows with the thread count).
 *
 * Linux only (the resident set is read from /proc/self/statm). Skipped (exit 77) under AddressSanitizer,
 * whose quarantine of freed memory grows the resident set by design. */
#define _POSIX_C_SOURCE 200112L /* sysconf, clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moeinfer/moeinfer.h"

#if defined(__SANITIZE_ADDRESS__)
#define MOE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_TEST_ASAN 1
#endif
#endif

#define N_WARMUP 200
#define N_CYCLES 2000
#define MAX_GROWTH_KB 2048.0

static int g_failures = 0;
static uint64_t g_rng;

/* Reports a failed call; true when it failed. */
static int failed(moe_status st, const char* what) {
    if (st == MOE_STATUS_OK) return 0;
    fprintf(stderr, "test_c_context_cycles: %s returned %s (%s)\n", what, moe_status_string(st), moe_last_error());
    ++g_failures;
    return 1;
}

/* Resident set size in KiB, or -1 where /proc/self/statm cannot be read. */
static long rss_kb(void) {
    long size = 0, resident = 0;
    FILE* f = fopen("/proc/self/statm", "r");
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int32_t random_token(int32_t n_vocab) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int32_t)((g_rng >> 33) % (uint64_t)n_vocab);
}

/* One context's life: create, decode two fresh random tokens, read the logits, free. 0 on success. */
static int one_cycle(moe_model* model, const moe_context_params* p, int32_t n_vocab) {
    moe_context* ctx = NULL;
    const float* logits = NULL;
    int32_t tokens[2];
    int bad;
    tokens[0] = random_token(n_vocab);
    tokens[1] = random_token(n_vocab);
    if (failed(moe_context_create(model, p, &ctx), "moe_context_create")) return -1;
    bad = failed(moe_decode(ctx, tokens, NULL, 2, 0), "moe_decode") ||
          failed(moe_get_logits(ctx, &logits, NULL, NULL), "moe_get_logits");
    moe_context_free(ctx);
    return bad ? -1 : 0;
}

/* Resident-set growth in KiB over N_CYCLES cycles after N_WARMUP into *out_kb; 0 on success. */
static int growth_kb(moe_model* model, int32_t device, int32_t n_threads, int32_t n_vocab, double* out_kb) {
    moe_context_params p;
    long before, after;
    int i;
    moe_context_params_init(&p);
    p.n_ctx = 16;
    p.n_ubatch = 8;
    p.n_threads = n_threads;
    p.device = device;
    for (i = 0; i < N_WARMUP; ++i) {
        if (one_cycle(model, &p, n_vocab) != 0) return -1;
    }
    before = rss_kb();
    for (i = 0; i < N_CYCLES; ++i) {
        if (one_cycle(model, &p, n_vocab) != 0) return -1;
    }
    after = rss_kb();
    *out_kb = (double)(after - before);
    return 0;
}

int main(void) {
    static const struct {
        int32_t device;
        int32_t n_threads;
        const char* name;
    } configs[] = {
        {MOE_DEVICE_CPU, 2, "cpu, 2 threads"},
        {MOE_DEVICE_CPU, 4, "cpu, 4 threads"},
        {MOE_DEVICE_EMULATED, 2, "emulated device, 2 threads"},
    };
    const char* path = MOE_TEST_TMP_DIR "/c_context_cycles.gguf";
    moe_synth_params sp;
    moe_model* model = NULL;
    moe_model_info info;
    size_t c;

#ifdef MOE_TEST_ASAN
    printf("skipped: the resident set is not a measure of leaks under AddressSanitizer (quarantine)\n");
    return 77;
#endif
    if (rss_kb() < 0) {
        printf("skipped: no /proc/self/statm\n");
        return 77;
    }
    g_rng = (uint64_t)time(NULL);
    printf("test_c_context_cycles: seed %llu\n", (unsigned long long)g_rng);

    if (moe_synth_params_init(&sp, "qwen3moe") != MOE_STATUS_OK) return 1;
    sp.preset = "tiny";
    sp.seed = g_rng;
    if (moe_synth_write(path, &sp) != MOE_STATUS_OK || moe_model_load(path, NULL, &model) != MOE_STATUS_OK) {
        fprintf(stderr, "cannot make the tiny model: %s\n", moe_last_error());
        return 1;
    }
    moe_model_info_init(&info);
    if (moe_model_get_info(model, &info) != MOE_STATUS_OK) return 1;

    for (c = 0; c < sizeof configs / sizeof configs[0]; ++c) {
        const double t0 = now_s();
        double kb = 0.0;
        if (growth_kb(model, configs[c].device, configs[c].n_threads, info.n_vocab, &kb) != 0) continue;
        printf("test_c_context_cycles: %s: %+.0f KB over %d cycles (%.2f KB per context; bound %.0f KB), %.1f s\n",
               configs[c].name, kb, N_CYCLES, kb / N_CYCLES, MAX_GROWTH_KB,
               now_s() - t0);
        if (kb > MAX_GROWTH_KB) {
            fprintf(stderr, "test_c_context_cycles: %s: the resident set grew by %.0f KB (> %.0f KB)\n",
                    configs[c].name, kb, MAX_GROWTH_KB);
            ++g_failures;
        }
    }
    moe_model_free(model);
    if (g_failures > 0) {
        fprintf(stderr, "test_c_context_cycles: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_c_context_cycles: ok\n");
    return 0;
}
