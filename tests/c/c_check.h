/* The checks the C99 API tests share: failures are counted (g_failures) rather than aborting, so one run
 * reports every broken expectation with moe_last_error()'s text. Included by one test file per program. */
#ifndef MOEINFER_TESTS_C_CHECK_H
#define MOEINFER_TESTS_C_CHECK_H

#include <stdio.h>
#include <string.h>

#include "moeinfer/moeinfer.h"

static int g_failures = 0;

#define EXPECT(cond)                                                                         \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: EXPECT failed: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, moe_last_error());                                                \
            ++g_failures;                                                                    \
        }                                                                                    \
    } while (0)

/* `expr` returns `want` and moe_last_error() mentions `field`. */
#define EXPECT_ERROR(expr, want, field)                                                               \
    do {                                                                                              \
        moe_status got_ = (expr);                                                                     \
        if (got_ != (want) || strstr(moe_last_error(), (field)) == NULL) {                             \
            fprintf(stderr, "%s:%d: %s returned %s (\"%s\"), expected %s naming \"%s\"\n", __FILE__,     \
                    __LINE__, #expr, moe_status_string(got_), moe_last_error(), moe_status_string(want), \
                    (field));                                                                         \
            ++g_failures;                                                                             \
        }                                                                                             \
    } while (0)

#endif
