/* A caller built against an older moeinfer.h passes a shorter params, policy or stats struct: its
 * struct_size ends before the fields added since, and the library must neither read nor write past it.
 * These make a full struct look like such a caller's, with garbage (0xAB bytes: a negative int32_t,
 * a wild pointer) where the newer fields lie, so that any access to them shows. */
#ifndef MOEINFER_TESTS_C_OLDER_CALLER_H
#define MOEINFER_TESTS_C_OLDER_CALLER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define OLDER_CALLER_GARBAGE 0xAB

/* *s (`size` bytes, struct_size first) as a caller whose struct ends at byte `end`: struct_size = end
 * and every byte from `end` on garbage. REQUIRES: sizeof(uint32_t) <= end <= size. */
static inline void as_older_caller(void* s, size_t size, size_t end) {
    const uint32_t n = (uint32_t)end;
    memset((unsigned char*)s + end, OLDER_CALLER_GARBAGE, size - end);
    memcpy(s, &n, sizeof n);
}

/* Whether the bytes from `end` on are still as_older_caller's garbage (nothing was written past an
 * older caller's struct_size). */
static inline int older_caller_tail_untouched(const void* s, size_t size, size_t end) {
    size_t i;
    for (i = end; i < size; ++i) {
        if (((const unsigned char*)s)[i] != OLDER_CALLER_GARBAGE) return 0;
    }
    return 1;
}

#endif
