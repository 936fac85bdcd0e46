/* C99 test of the text API on a synthetic model, whose SentencePiece-style vocabulary ("llama") holds
 * <unk>, <s>, </s>, the 256 byte tokens "<0xXX>" (ids 3..258) and fillers that no text reaches: every
 * character goes to byte fallback, so the expected ids follow from the bytes alone (a space becomes
 * U+2581, and one U+2581 is put before the text). Fresh random bytes each run, invalid UTF-8 and NUL
 * included. Also: the buffer-size convention (nothing written, nothing consumed when too small), the
 * streaming detokenizer holding back a split character, out-of-range ids, vocab queries and the
 * metadata array getters. The comparison with reference tokenizers is tests/python/test_tokenizer.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moeinfer/moeinfer.h"

#include "c_check.h"

#define BYTE_TOKEN(b) (3 + (int32_t)(unsigned char)(b))
#define MAX_TEXT 64
#define MAX_TOKENS (3 * (MAX_TEXT + 1) + 2)

static unsigned long long g_rng_state;

static unsigned next_rand(void) {
    g_rng_state ^= g_rng_state >> 12;
    g_rng_state ^= g_rng_state << 25;
    g_rng_state ^= g_rng_state >> 27;
    return (unsigned)((g_rng_state * 2685821657736338717ULL) >> 40);
}

/* The escaped text SentencePiece tokenizes: U+2581 first (unless the text is empty), and for every
 * space. Returns its length. */
static size_t escape(const char* text, size_t n, char* out) {
    static const char kSpace[] = "\xE2\x96\x81";
    size_t i, k = 0;
    if (n == 0) return 0;
    memcpy(out, kSpace, 3);
    k = 3;
    for (i = 0; i < n; ++i) {
        if (text[i] == ' ') {
            memcpy(out + k, kSpace, 3);
            k += 3;
        } else {
            out[k++] = text[i];
        }
    }
    return k;
}

static void test_tokenize_random_bytes(const moe_model* model) {
    char text[MAX_TEXT], escaped[3 * (MAX_TEXT + 1)], out[3 * (MAX_TEXT + 1)];
    int32_t tokens[MAX_TOKENS];
    int round;
    for (round = 0; round < 200; ++round) {
        size_t n = next_rand() % MAX_TEXT, i, n_esc;
        int64_t n_tok = -1, n_out = -1;
        for (i = 0; i < n; ++i) text[i] = (char)(next_rand() % 4 == 0 ? ' ' : next_rand() % 256);
        n_esc = escape(text, n, escaped);
        EXPECT(moe_tokenize(model, text, n, 1, 0, tokens, MAX_TOKENS, &n_tok) == MOE_STATUS_OK);
        EXPECT(n_tok == (int64_t)n_esc + 1);
        if (n_tok != (int64_t)n_esc + 1) continue;
        EXPECT(tokens[0] == 1); /* BOS: add_bos_token */
        for (i = 0; i < n_esc; ++i) EXPECT(tokens[i + 1] == BYTE_TOKEN(escaped[i]));
        /* Byte tokens give their bytes back; BOS renders as nothing. */
        EXPECT(moe_detokenize(model, tokens, n_tok, 0, out, sizeof out, &n_out) == MOE_STATUS_OK);
        EXPECT(n_out == (int64_t)n_esc && memcmp(out, escaped, n_esc) == 0);
    }
}

static void test_buffer_convention(const moe_model* model) {
    const char text[] = "a\0b c";
    int32_t tokens[16];
    int64_t n = -1, need = -1;
    char buf[16];
    int i;
    EXPECT(moe_tokenize(model, text, 5, 0, 0, NULL, 0, &need) == MOE_STATUS_OK);
    EXPECT(need == 3 + 5 + 2); /* U+2581 a NUL b U+2581 c */
    for (i = 0; i < 16; ++i) tokens[i] = -7;
    EXPECT(moe_tokenize(model, text, 5, 0, 0, tokens, need - 1, &n) == MOE_STATUS_OK);
    EXPECT(n == need && tokens[0] == -7); /* too small: nothing written */
    EXPECT(moe_tokenize(model, text, 5, 0, 0, tokens, 16, &n) == MOE_STATUS_OK);
    EXPECT(n == need && tokens[3] == BYTE_TOKEN('a') && tokens[4] == BYTE_TOKEN('\0'));
    EXPECT(moe_tokenize(model, NULL, 0, 0, 0, tokens, 16, &n) == MOE_STATUS_OK && n == 0);
    EXPECT_ERROR(moe_tokenize(model, NULL, 3, 0, 0, tokens, 16, &n), MOE_STATUS_INVALID_ARGUMENT, "text");
    EXPECT_ERROR(moe_tokenize(model, text, 5, 0, 0, NULL, 4, &n), MOE_STATUS_INVALID_ARGUMENT, "tokens");
    EXPECT_ERROR(moe_tokenize(model, text, 5, 0, 0, tokens, -1, &n), MOE_STATUS_INVALID_ARGUMENT, "capacity");
    /* parse_special: "<s>" is BOS's text; after a special token SentencePiece prefixes a space again. */
    EXPECT(moe_tokenize(model, "<s>x", 4, 0, 1, tokens, 16, &n) == MOE_STATUS_OK);
    EXPECT(n == 5 && tokens[0] == 1 && tokens[1] == BYTE_TOKEN(0xE2) && tokens[4] == BYTE_TOKEN('x'));
    EXPECT(moe_tokenize(model, "<s>x", 4, 0, 0, tokens, 16, &n) == MOE_STATUS_OK);
    EXPECT(n == 3 + 4 && tokens[3] == BYTE_TOKEN('<'));
    EXPECT(moe_token_to_piece(model, 1, 0, buf, sizeof buf, &n) == MOE_STATUS_OK && n == 0);
    EXPECT(moe_token_to_piece(model, 1, 1, buf, sizeof buf, &n) == MOE_STATUS_OK && n == 3 && memcmp(buf, "<s>", 3) == 0);
    EXPECT(moe_token_to_piece(model, BYTE_TOKEN(0x80), 0, buf, sizeof buf, &n) == MOE_STATUS_OK);
    EXPECT(n == 1 && (unsigned char)buf[0] == 0x80);
}

static void test_stream(const moe_model* model) {
    /* U+1F600 (4 bytes), then U+00E9 (2 bytes). */
    const unsigned char bytes[] = {0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9};
    moe_detokenizer* d = NULL;
    char buf[16];
    int64_t n = -1;
    int32_t t;
    int i;
    EXPECT(moe_detokenizer_create(model, 0, &d) == MOE_STATUS_OK);
    for (i = 0; i < 3; ++i) {
        t = BYTE_TOKEN(bytes[i]);
        EXPECT(moe_detokenizer_feed(d, &t, 1, buf, sizeof buf, &n) == MOE_STATUS_OK && n == 0);
    }
    t = BYTE_TOKEN(bytes[3]);
    EXPECT(moe_detokenizer_feed(d, &t, 1, buf, 2, &n) == MOE_STATUS_OK && n == 4); /* too small: kept */
    EXPECT(moe_detokenizer_feed(d, &t, 1, buf, sizeof buf, &n) == MOE_STATUS_OK);
    EXPECT(n == 4 && memcmp(buf, bytes, 4) == 0);
    t = BYTE_TOKEN(bytes[4]);
    EXPECT(moe_detokenizer_feed(d, &t, 1, buf, sizeof buf, &n) == MOE_STATUS_OK && n == 0);
    EXPECT(moe_detokenizer_flush(d, buf, sizeof buf, &n) == MOE_STATUS_OK && n == 1 && (unsigned char)buf[0] == 0xC3);
    t = 512;
    EXPECT_ERROR(moe_detokenizer_feed(d, &t, 1, buf, sizeof buf, &n), MOE_STATUS_OUT_OF_RANGE, "tokens[0]");
    moe_detokenizer_free(d);
    moe_detokenizer_free(NULL);
}

static void test_errors_and_queries(const moe_model* model) {
    int32_t tokens[2] = {5, 512};
    char buf[8];
    int64_t n = 0, n_elem = 0;
    int32_t v = 0, elem = 0, type = 0;
    const char* s = NULL;
    uint64_t len = 0;
    double scores[512];
    int64_t types[512];
    moe_vocab_info vi;

    EXPECT_ERROR(moe_detokenize(model, tokens, 2, 0, buf, sizeof buf, &n), MOE_STATUS_OUT_OF_RANGE, "tokens[1] = 512");
    EXPECT_ERROR(moe_token_to_piece(model, -1, 0, buf, sizeof buf, &n), MOE_STATUS_OUT_OF_RANGE, "token -1");
    EXPECT_ERROR(moe_token_get_type(model, 512, &v), MOE_STATUS_OUT_OF_RANGE, "512");

    moe_vocab_info_init(&vi);
    EXPECT(moe_model_get_vocab_info(model, &vi) == MOE_STATUS_OK);
    EXPECT(strcmp(vi.model, "llama") == 0 && strcmp(vi.pre, "") == 0 && vi.n_tokens == 512);
    EXPECT(vi.bos == 1 && vi.eos == 2 && vi.unk == 0 && vi.eot == -1 && vi.add_bos == 1 && vi.add_eos == 0);
    EXPECT(vi.add_space_prefix == 1 && vi.n_eog == 1);
    EXPECT(moe_token_is_eog(model, 2, &v) == MOE_STATUS_OK && v == 1);
    EXPECT(moe_token_is_eog(model, 1, &v) == MOE_STATUS_OK && v == 0);
    EXPECT(moe_token_get_text(model, 1, &s) == MOE_STATUS_OK && strcmp(s, "<s>") == 0);
    EXPECT(moe_token_get_type(model, 1, &v) == MOE_STATUS_OK && v == MOE_TOKEN_TYPE_CONTROL);
    EXPECT(moe_token_get_type(model, BYTE_TOKEN(7), &v) == MOE_STATUS_OK && v == MOE_TOKEN_TYPE_BYTE);

    EXPECT(moe_model_meta_type(model, "tokenizer.ggml.tokens", &type, &elem, &n_elem) == MOE_STATUS_OK);
    EXPECT(type == MOE_META_ARRAY && elem == MOE_META_STRING && n_elem == 512);
    EXPECT(moe_model_meta_type(model, "general.architecture", &type, &elem, &n_elem) == MOE_STATUS_OK);
    EXPECT(type == MOE_META_STRING && elem == -1 && n_elem == 1);
    EXPECT_ERROR(moe_model_meta_type(model, "no.such.key", &type, NULL, NULL), MOE_STATUS_NOT_FOUND, "no.such.key");
    EXPECT(moe_model_meta_array_string(model, "tokenizer.ggml.tokens", BYTE_TOKEN(0x0A), &s, &len) == MOE_STATUS_OK);
    EXPECT(strcmp(s, "<0x0A>") == 0 && len == 6);
    EXPECT_ERROR(moe_model_meta_array_string(model, "tokenizer.ggml.tokens", 512, &s, NULL), MOE_STATUS_OUT_OF_RANGE, "512");
    EXPECT(moe_model_meta_array_float(model, "tokenizer.ggml.scores", NULL, 0, &n) == MOE_STATUS_OK && n == 512);
    EXPECT(moe_model_meta_array_float(model, "tokenizer.ggml.scores", scores, 512, &n) == MOE_STATUS_OK);
    EXPECT(scores[300] == -300.0 && scores[1] == 0.0); /* the synthetic vocabulary scores filler i as -i */
    EXPECT(moe_model_meta_array_int(model, "tokenizer.ggml.token_type", types, 512, &n) == MOE_STATUS_OK);
    EXPECT(n == 512 && types[0] == MOE_TOKEN_TYPE_UNKNOWN && types[2] == MOE_TOKEN_TYPE_CONTROL);
    EXPECT(types[3] == MOE_TOKEN_TYPE_BYTE && types[300] == MOE_TOKEN_TYPE_NORMAL);
    EXPECT_ERROR(moe_model_meta_array_int(model, "tokenizer.ggml.tokens", types, 512, &n), MOE_STATUS_INVALID_ARGUMENT,
                 "not an array of integers");
    EXPECT_ERROR(moe_model_meta_string(model, "tokenizer.ggml.tokens", &s), MOE_STATUS_INVALID_ARGUMENT, "not a string");
}

int main(void) {
    char path[1024];
    moe_synth_params sp;
    moe_model* model = NULL;
    g_rng_state = (unsigned long long)time(NULL) * 2654435761ULL + 1;
    printf("seed %llu\n", g_rng_state);
    snprintf(path, sizeof path, "%s/%s", MOE_TEST_TMP_DIR, "c_text_tiny.gguf");
    EXPECT(moe_synth_params_init(&sp, "qwen3moe") == MOE_STATUS_OK);
    sp.preset = "tiny";
    EXPECT(moe_synth_write(path, &sp) == MOE_STATUS_OK);
    EXPECT(moe_model_load(path, NULL, &model) == MOE_STATUS_OK);
    if (model == NULL) return 1;
    test_tokenize_random_bytes(model);
    test_buffer_convention(model);
    test_stream(model);
    test_errors_and_queries(model);
    moe_model_free(model);
    if (g_failures != 0) {
        fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    printf("1 passed, 0 failed\n");
    return 0;
}
