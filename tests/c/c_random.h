/* Fresh random token ids for the C99 tests: a 64-bit LCG seeded from the clock, or from
 * MOEINFER_TEST_SEED to replay a run (the seed is printed either way). Included by one test file per
 * program. */
#ifndef MOEINFER_TESTS_C_RANDOM_H
#define MOEINFER_TESTS_C_RANDOM_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t g_rng;

/* Seeds g_rng and prints "<test>: MOEINFER_TEST_SEED=<seed>". */
static inline void seed_random(const char* test) {
    g_rng = (uint64_t)time(NULL);
    if (getenv("MOEINFER_TEST_SEED") != NULL) g_rng = (uint64_t)strtoull(getenv("MOEINFER_TEST_SEED"), NULL, 10);
    printf("%s: MOEINFER_TEST_SEED=%" PRIu64 "\n", test, g_rng);
}

/* n token ids in [0, n_vocab). */
static inline void random_tokens(int32_t* dst, int n, int32_t n_vocab) {
    int i;
    for (i = 0; i < n; ++i) {
        g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
        dst[i] = (int32_t)((g_rng >> 33) % (uint64_t)n_vocab);
    }
}

#endif
