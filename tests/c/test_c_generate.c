/* C99 test of moe_generate on a tiny synthetic model: greedy generation equals a manual loop of
 * moe_decode + argmax (the reference), prefix reuse decodes only the new tokens and gives the tokens of
 * a fresh context, stop strings that straddle two tokens' pieces, max_tokens, a callback that stops,
 * the streamed text equals moe_detokenize of the ids, and every bad argument named. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moeinfer/moeinfer.h"

#include "c_check.h"

#define N_GEN 12
#define N_PROMPT 8
#define TEXT_CAP 4096

static unsigned long long g_rng_state;

static unsigned next_u32(void) {
    g_rng_state ^= g_rng_state >> 12;
    g_rng_state ^= g_rng_state << 25;
    g_rng_state ^= g_rng_state >> 27;
    return (unsigned)((g_rng_state * 2685821657736338717ULL) >> 32);
}

/* The reference: decode the prompt, then argmax (lowest id on ties) and decode it, up to n tokens or
 * an end-of-generation token. Returns the count. */
static int manual_greedy(moe_context* ctx, const moe_model* model, const int32_t* prompt, int n_prompt, int n,
                         int32_t* out) {
    int count = 0;
    EXPECT(moe_kv_clear(ctx) == MOE_STATUS_OK);
    EXPECT(moe_decode(ctx, prompt, NULL, n_prompt, 0) == MOE_STATUS_OK);
    while (count < n) {
        const float* logits = NULL;
        int32_t rows = 0, n_vocab = 0, best = 0, i, eog = 0;
        EXPECT(moe_get_logits(ctx, &logits, &rows, &n_vocab) == MOE_STATUS_OK);
        for (i = 1; i < n_vocab; ++i) {
            if (logits[i] > logits[best]) best = i;
        }
        EXPECT(moe_token_is_eog(model, best, &eog) == MOE_STATUS_OK);
        if (eog) break;
        out[count++] = best;
        if (count < n) EXPECT(moe_decode(ctx, &best, NULL, 1, 0) == MOE_STATUS_OK);
    }
    return count;
}

typedef struct {
    char text[TEXT_CAP];
    size_t len;
    int calls;
    int stop_at; /* return 0 on this call (1-based); 0: never */
} Sink;

static int on_piece(const char* text, size_t len, void* user_data) {
    Sink* s = (Sink*)user_data;
    if (s->len + len < TEXT_CAP) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
    }
    s->text[s->len] = '\0';
    ++s->calls;
    return s->stop_at == 0 || s->calls < s->stop_at;
}

static moe_status run(moe_context* ctx, const int32_t* prompt, int n_prompt, int max_tokens, const char* const* stop,
                      int n_stop, Sink* sink, int32_t* tokens, moe_generate_result* r) {
    moe_generate_params gp;
    moe_generate_params_init(&gp);
    gp.max_tokens = max_tokens;
    gp.stop = stop;
    gp.n_stop = n_stop;
    gp.on_piece = on_piece;
    gp.user_data = sink;
    gp.tokens = tokens;
    gp.tokens_capacity = max_tokens;
    moe_generate_result_init(r);
    return moe_generate(ctx, prompt, n_prompt, NULL, &gp, r);
}

int main(void) {
    char path[512];
    moe_synth_params sp;
    moe_model* model = NULL;
    moe_context *ref_ctx = NULL, *ctx = NULL, *fresh = NULL;
    moe_context_params cp;
    int32_t prompt[N_PROMPT + N_GEN + 4], ref[N_GEN], got[N_GEN];
    int n_ref = 0, tries, i;
    char ref_text[TEXT_CAP];
    int64_t n_text = 0;
    Sink sink;
    moe_generate_result r;

    g_rng_state = (unsigned long long)time(NULL) * 6364136223846793005ULL + 1442695040888963407ULL;
    printf("seed %llu\n", g_rng_state);
    fflush(stdout);
    snprintf(path, sizeof path, "%s/%s", MOE_TEST_TMP_DIR, "c_generate_tiny.gguf");
    EXPECT(moe_synth_params_init(&sp, "qwen3moe") == MOE_STATUS_OK);
    sp.preset = "tiny";
    EXPECT(moe_synth_write(path, &sp) == MOE_STATUS_OK);
    EXPECT(moe_model_load(path, NULL, &model) == MOE_STATUS_OK);
    if (model == NULL) return 1;
    moe_context_params_init(&cp);
    cp.n_ctx = 64;
    cp.n_threads = 1;
    EXPECT(moe_context_create(model, &cp, &ref_ctx) == MOE_STATUS_OK);
    EXPECT(moe_context_create(model, &cp, &ctx) == MOE_STATUS_OK);
    EXPECT(moe_context_create(model, &cp, &fresh) == MOE_STATUS_OK);
    if (ref_ctx == NULL || ctx == NULL || fresh == NULL) return 1;

    /* A random prompt of filler tokens whose greedy continuation is long enough to test with. */
    for (tries = 0; tries < 20 && n_ref < 6; ++tries) {
        for (i = 0; i < N_PROMPT; ++i) prompt[i] = 300 + (int32_t)(next_u32() % 200);
        n_ref = manual_greedy(ref_ctx, model, prompt, N_PROMPT, N_GEN, ref);
    }
    EXPECT(n_ref >= 6);

    /* Greedy equals the manual loop; the streamed text equals moe_detokenize of the ids. */
    memset(&sink, 0, sizeof sink);
    EXPECT(run(ctx, prompt, N_PROMPT, N_GEN, NULL, 0, &sink, got, &r) == MOE_STATUS_OK);
    EXPECT(r.n_generated == n_ref && r.n_prompt_reused == 0 && r.n_prompt_decoded == N_PROMPT);
    EXPECT(r.stop_reason == (n_ref == N_GEN ? MOE_STOP_MAX_TOKENS : MOE_STOP_EOG));
    EXPECT(r.t_prompt_s >= 0.0 && r.t_gen_s >= 0.0);
    EXPECT(memcmp(got, ref, sizeof(int32_t) * (size_t)n_ref) == 0);
    EXPECT(moe_detokenize(model, ref, n_ref, 0, ref_text, TEXT_CAP - 1, &n_text) == MOE_STATUS_OK);
    ref_text[n_text] = '\0';
    EXPECT(sink.len == (size_t)n_text && strcmp(sink.text, ref_text) == 0);

    /* Prefix reuse: the prompt extended by 3 generated tokens and 2 new ones decodes only what the
     * cache lacks, and continues as a fresh context does. */
    {
        const int n_ext = N_PROMPT + 5;
        int32_t ext[N_PROMPT + 5], fresh_tok[N_GEN];
        moe_generate_result rf;
        Sink s2;
        memcpy(ext, prompt, sizeof(int32_t) * N_PROMPT);
        memcpy(ext + N_PROMPT, ref, sizeof(int32_t) * 3);
        ext[N_PROMPT + 3] = 300 + (int32_t)(next_u32() % 200);
        ext[N_PROMPT + 4] = 300 + (int32_t)(next_u32() % 200);
        memset(&s2, 0, sizeof s2);
        EXPECT(run(ctx, ext, n_ext, N_GEN, NULL, 0, &s2, got, &r) == MOE_STATUS_OK);
        EXPECT(r.n_prompt_reused == N_PROMPT + 3 && r.n_prompt_decoded == 2);
        memset(&s2, 0, sizeof s2);
        EXPECT(run(fresh, ext, n_ext, N_GEN, NULL, 0, &s2, fresh_tok, &rf) == MOE_STATUS_OK);
        EXPECT(rf.n_prompt_reused == 0 && rf.n_prompt_decoded == n_ext);
        EXPECT(r.n_generated == rf.n_generated &&
               memcmp(got, fresh_tok, sizeof(int32_t) * (size_t)r.n_generated) == 0);
        /* The same prompt again: all but its last token is reused (rewinding past the generation). */
        memset(&s2, 0, sizeof s2);
        EXPECT(run(ctx, ext, n_ext, N_GEN, NULL, 0, &s2, got, &r) == MOE_STATUS_OK);
        EXPECT(r.n_prompt_reused == n_ext - 1 && r.n_prompt_decoded == 1);
        EXPECT(r.n_generated == rf.n_generated &&
               memcmp(got, fresh_tok, sizeof(int32_t) * (size_t)r.n_generated) == 0);
        /* A different first token: nothing is reused. */
        ext[0] = ext[0] == 300 ? 301 : 300;
        EXPECT(run(ctx, ext, n_ext, 1, NULL, 0, &s2, got, &r) == MOE_STATUS_OK);
        EXPECT(r.n_prompt_reused == 0);
    }

    /* A stop string across a piece boundary: the last 2 bytes of the text of tokens [0, k) and the first
     * bytes (up to 2) of token k's piece, at the first k where both exist. */
    {
        char pre[TEXT_CAP], pk[64], stop[8];
        int64_t n_pre = 0, n_k = 0;
        const char* stops[2];
        const char* at;
        int k, found = 0;
        for (k = 1; k < n_ref && !found; ++k) {
            EXPECT(moe_detokenize(model, ref, k, 0, pre, sizeof pre, &n_pre) == MOE_STATUS_OK);
            EXPECT(moe_detokenize(model, ref + k, 1, 0, pk, sizeof pk, &n_k) == MOE_STATUS_OK);
            if (n_pre < 2 || n_k < 1) continue;
            found = 1;
            memcpy(stop, pre + n_pre - 2, 2);
            memcpy(stop + 2, pk, n_k >= 2 ? 2 : 1);
            stop[n_k >= 2 ? 4 : 3] = '\0';
            stops[0] = "never appears \x01";
            stops[1] = stop;
            at = strstr(ref_text, stop);
            memset(&sink, 0, sizeof sink);
            EXPECT(run(ctx, prompt, N_PROMPT, N_GEN, stops, 2, &sink, got, &r) == MOE_STATUS_OK);
            EXPECT(r.stop_reason == MOE_STOP_STRING);
            EXPECT(at != NULL && sink.len == (size_t)(at - ref_text) && strncmp(sink.text, ref_text, sink.len) == 0);
        }
        EXPECT(found);
    }

    /* max_tokens, and 0 decodes the prompt only. */
    memset(&sink, 0, sizeof sink);
    EXPECT(run(ctx, prompt, N_PROMPT, 3, NULL, 0, &sink, got, &r) == MOE_STATUS_OK);
    EXPECT(r.n_generated == (n_ref < 3 ? n_ref : 3) && memcmp(got, ref, sizeof(int32_t) * (size_t)r.n_generated) == 0);
    EXPECT(r.stop_reason == MOE_STOP_MAX_TOKENS);
    memset(&sink, 0, sizeof sink);
    EXPECT(run(ctx, prompt, N_PROMPT, 0, NULL, 0, &sink, got, &r) == MOE_STATUS_OK);
    EXPECT(r.n_generated == 0 && sink.calls == 0 && r.stop_reason == MOE_STOP_MAX_TOKENS);

    /* The callback stops the generation on its 3rd piece. A random model's tokens may hold back partial
     * UTF-8 characters, so N_GEN tokens can give fewer than 3 pieces: then it must not have stopped. */
    memset(&sink, 0, sizeof sink);
    sink.stop_at = 3;
    EXPECT(run(ctx, prompt, N_PROMPT, N_GEN, NULL, 0, &sink, got, &r) == MOE_STATUS_OK);
    if (sink.calls == 3) {
        EXPECT(r.stop_reason == MOE_STOP_CALLBACK && r.n_generated <= 3 + 1);
    } else {
        EXPECT(sink.calls < 3 && r.stop_reason != MOE_STOP_CALLBACK);
    }

    /* A sampler at temperature 0 draws as greedy. */
    {
        moe_sampler_params spp;
        moe_sampler* sampler = NULL;
        moe_generate_params gp;
        moe_sampler_params_init(&spp);
        spp.temperature = 0.0f;
        spp.seed = 1;
        EXPECT(moe_sampler_create(&spp, 512, &sampler) == MOE_STATUS_OK);
        moe_generate_params_init(&gp);
        gp.max_tokens = N_GEN;
        gp.tokens = got;
        gp.tokens_capacity = N_GEN;
        moe_generate_result_init(&r);
        EXPECT(moe_generate(fresh, prompt, N_PROMPT, sampler, &gp, &r) == MOE_STATUS_OK);
        EXPECT(r.n_generated == n_ref && memcmp(got, ref, sizeof(int32_t) * (size_t)n_ref) == 0);
        moe_sampler_free(sampler);
    }

    /* Bad arguments, each named. */
    {
        moe_generate_params gp;
        const char* bad_stop[2] = {"ok", ""};
        int32_t bad_prompt[2] = {5, 512};
        moe_generate_params_init(&gp);
        EXPECT(gp.struct_size == sizeof gp && gp.max_tokens == 128 && gp.n_stop == 0 && gp.on_piece == NULL);
        EXPECT_ERROR(moe_generate(NULL, prompt, 1, NULL, NULL, NULL), MOE_STATUS_INVALID_ARGUMENT, "ctx");
        EXPECT_ERROR(moe_generate(ctx, NULL, 1, NULL, NULL, NULL), MOE_STATUS_INVALID_ARGUMENT, "prompt");
        EXPECT_ERROR(moe_generate(ctx, prompt, 0, NULL, NULL, NULL), MOE_STATUS_INVALID_ARGUMENT, "n_prompt");
        EXPECT_ERROR(moe_generate(ctx, bad_prompt, 2, NULL, NULL, NULL), MOE_STATUS_OUT_OF_RANGE, "prompt[1]");
        gp.max_tokens = -1;
        EXPECT_ERROR(moe_generate(ctx, prompt, 1, NULL, &gp, NULL), MOE_STATUS_INVALID_ARGUMENT, "max_tokens");
        gp.max_tokens = 1;
        gp.stop = bad_stop;
        gp.n_stop = 2;
        EXPECT_ERROR(moe_generate(ctx, prompt, 1, NULL, &gp, NULL), MOE_STATUS_INVALID_ARGUMENT, "stop[1]");
        gp.n_stop = -1;
        EXPECT_ERROR(moe_generate(ctx, prompt, 1, NULL, &gp, NULL), MOE_STATUS_INVALID_ARGUMENT, "n_stop");
        gp.n_stop = 0;
        gp.tokens_capacity = 4;
        EXPECT_ERROR(moe_generate(ctx, prompt, 1, NULL, &gp, NULL), MOE_STATUS_INVALID_ARGUMENT, "tokens");
        gp.tokens_capacity = 0;
        gp.struct_size = 2;
        EXPECT_ERROR(moe_generate(ctx, prompt, 1, NULL, &gp, NULL), MOE_STATUS_INVALID_ARGUMENT, "struct_size");
        gp.struct_size = sizeof gp;
        {
            int32_t long_prompt[65];
            for (i = 0; i < 65; ++i) long_prompt[i] = 300;
            EXPECT_ERROR(moe_generate(ctx, long_prompt, 65, NULL, &gp, NULL), MOE_STATUS_OUT_OF_RANGE, "n_ctx");
        }
        /* An old caller's params without the fields past max_tokens. */
        gp.struct_size = (uint32_t)offsetof(moe_generate_params, stop);
        gp.max_tokens = 2;
        moe_generate_result_init(&r);
        EXPECT(moe_generate(ctx, prompt, N_PROMPT, NULL, &gp, &r) == MOE_STATUS_OK);
        EXPECT(r.n_generated == (n_ref < 2 ? n_ref : 2));
    }

    moe_context_free(fresh);
    moe_context_free(ctx);
    moe_context_free(ref_ctx);
    moe_model_free(model);
    remove(path);
    if (g_failures) {
        fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
