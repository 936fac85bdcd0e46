/* C99: the several-devices fields of moe_context_params (devices, split_mode, tensor_split, main_gpu,
 * vram_budgets) from C: defaults, a caller built before them (struct_size), every bad value named,
 * and a 2-device emulated context whose logits equal the one-device context's bit for bit. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "c_older_caller.h"
#include "c_random.h"
#include "moeinfer/moeinfer.h"

#define N_PROMPT 9

static void base_params(moe_context_params* p) {
    moe_context_params_init(p);
    p->n_ctx = 64;
    p->n_ubatch = 8;
    p->n_threads = 2;
    p->device = MOE_DEVICE_EMULATED;
}

/* Decodes the prompt on a context made with p; copies its last row of logits into out. */
static int logits_of(moe_model* model, const moe_context_params* p, const int32_t* tokens, float* out, int32_t n_vocab) {
    moe_context* ctx = NULL;
    const float* logits = NULL;
    int32_t rows = 0, nv = 0;
    if (moe_context_create(model, p, &ctx) != MOE_STATUS_OK) {
        fprintf(stderr, "create: %s\n", moe_last_error());
        return 0;
    }
    EXPECT(moe_decode(ctx, tokens, NULL, N_PROMPT, 0) == MOE_STATUS_OK);
    EXPECT(moe_get_logits(ctx, &logits, &rows, &nv) == MOE_STATUS_OK);
    EXPECT(rows == 1 && nv == n_vocab);
    if (logits != NULL) memcpy(out, logits, (size_t)n_vocab * sizeof(float));
    moe_context_free(ctx);
    return logits != NULL;
}

int main(void) {
    char path[1024];
    moe_synth_params sp;
    moe_model* model = NULL;
    moe_model_info info;
    moe_context_params p;
    moe_context* ctx = NULL;
    int32_t two[2] = {0, 1}, same[2] = {1, 1};
    float split[2] = {3.0f, 1.0f}, negative[2] = {1.0f, -1.0f};
    uint64_t budgets[3] = {(uint64_t)1 << 30, (uint64_t)1 << 30, (uint64_t)1 << 30};
    int32_t tokens[N_PROMPT];
    float *one_dev, *two_dev;

    seed_random("test_c_multi_device");
    snprintf(path, sizeof path, "%s/c_multi_device.gguf", MOE_TEST_TMP_DIR);
    EXPECT(moe_synth_params_init(&sp, "qwen3moe") == MOE_STATUS_OK);
    sp.preset = "tiny";
    sp.seed = g_rng;
    EXPECT(moe_synth_write(path, &sp) == MOE_STATUS_OK);
    EXPECT(moe_model_load(path, NULL, &model) == MOE_STATUS_OK);
    if (model == NULL) return 1;
    moe_model_info_init(&info);
    EXPECT(moe_model_get_info(model, &info) == MOE_STATUS_OK);

    /* Defaults. */
    moe_context_params_init(&p);
    EXPECT(p.devices == NULL && p.n_devices == 0 && p.split_mode == MOE_SPLIT_LAYER);
    EXPECT(p.tensor_split == NULL && p.n_tensor_split == 0 && p.main_gpu == 0);
    EXPECT(p.vram_budgets == NULL && p.n_vram_budgets == 0);

    /* A caller built before the fields: garbage past its struct_size is never read. */
    base_params(&p);
    as_older_caller(&p, sizeof p, offsetof(moe_context_params, devices));
    EXPECT(moe_context_create(model, &p, &ctx) == MOE_STATUS_OK);
    moe_context_free(ctx);
    ctx = NULL;

    /* Every bad value is INVALID_ARGUMENT naming it; nothing is created. */
    base_params(&p);
    p.devices = two;
    p.n_devices = 2;
    p.tensor_overrides = "blk\\.0\\.=CUDA3";
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "CUDA3");
    p.tensor_overrides = NULL;
    p.tensor_split = negative;
    p.n_tensor_split = 2;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "tensor_split[1]");
    p.tensor_split = NULL;
    p.n_tensor_split = 0;
    p.vram_budgets = budgets;
    p.n_vram_budgets = 3;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "vram_budgets");
    p.vram_budgets = NULL;
    p.n_vram_budgets = 0;
    p.devices = same;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "devices[1]");
    p.devices = two;
    p.split_mode = 9;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "split_mode");
    p.split_mode = MOE_SPLIT_ROW;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_UNIMPLEMENTED, "MOE_SPLIT_ROW");
    p.split_mode = MOE_SPLIT_NONE;
    p.main_gpu = 2;
    EXPECT_ERROR(moe_context_create(model, &p, &ctx), MOE_STATUS_INVALID_ARGUMENT, "main_gpu");
    EXPECT(ctx == NULL);

    /* Two devices (3:1, experts in host RAM) against one: the same logits, bit for bit. */
    one_dev = (float*)malloc((size_t)info.n_vocab * sizeof(float));
    two_dev = (float*)malloc((size_t)info.n_vocab * sizeof(float));
    random_tokens(tokens, N_PROMPT, info.n_vocab);
    base_params(&p);
    p.tensor_overrides = "exps=CPU";
    if (one_dev != NULL && two_dev != NULL && logits_of(model, &p, tokens, one_dev, info.n_vocab)) {
        p.devices = two;
        p.n_devices = 2;
        p.tensor_split = split;
        p.n_tensor_split = 2;
        if (logits_of(model, &p, tokens, two_dev, info.n_vocab)) {
            EXPECT(memcmp(one_dev, two_dev, (size_t)info.n_vocab * sizeof(float)) == 0);
        }
        /* split_mode none: only devices[main_gpu], the one-device context again. */
        p.split_mode = MOE_SPLIT_NONE;
        p.main_gpu = 1;
        if (logits_of(model, &p, tokens, two_dev, info.n_vocab)) {
            EXPECT(memcmp(one_dev, two_dev, (size_t)info.n_vocab * sizeof(float)) == 0);
        }
    }
    free(one_dev);
    free(two_dev);
    moe_model_free(model);
    remove(path);
    if (g_failures != 0) {
        fprintf(stderr, "test_c_multi_device: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_c_multi_device: all checks passed\n");
    return 0;
}
