/* C99 test of the public API: model loading, queries and every error path, as a C user sees them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const char* tmp_path(const char* name) {
    static char buf[4][1024];
    static int slot = 0;
    slot = (slot + 1) % 4;
    snprintf(buf[slot], sizeof buf[slot], "%s/%s", MOE_TEST_TMP_DIR, name);
    return buf[slot];
}

/* Copies the first `keep` bytes of src to dst, optionally overwriting the magic. */
static int copy_prefix(const char* src, const char* dst, long keep, const char* magic) {
    FILE* in = fopen(src, "rb");
    FILE* out = fopen(dst, "wb");
    char* buf;
    size_t got;
    if (in == NULL || out == NULL) return 0;
    buf = (char*)malloc((size_t)keep);
    got = fread(buf, 1, (size_t)keep, in);
    if (magic != NULL) memcpy(buf, magic, 4);
    fwrite(buf, 1, got, out);
    free(buf);
    fclose(in);
    fclose(out);
    return 1;
}

static long file_size(const char* path) {
    FILE* f = fopen(path, "rb");
    long n;
    if (f == NULL) return -1;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fclose(f);
    return n;
}

static int count_progress_calls;
static int on_progress(float fraction, void* user) {
    (void)user;
    if (fraction >= 0.0f && fraction <= 1.0f) ++count_progress_calls;
    return 1;
}

static void test_status_and_version(void) {
    EXPECT(strcmp(moe_status_string(MOE_STATUS_OK), "ok") == 0);
    EXPECT(strcmp(moe_status_string(MOE_STATUS_DATA_CORRUPT), "data corrupt") == 0);
    EXPECT(moe_status_string((moe_status)12345) != NULL);
    EXPECT(strcmp(moe_version(), MOEINFER_VERSION_STRING) == 0);
    EXPECT(strcmp(moe_type_name(MOE_TYPE_Q8_0), "q8_0") == 0);
    EXPECT(moe_type_name(12345) == NULL);
}

static void test_load_and_query(void) {
    const char* path = tmp_path("c_api_tiny.gguf");
    moe_synth_params sp;
    moe_model_params mp;
    moe_model* model = NULL;
    moe_model_info info;
    moe_tensor_info ti;
    int32_t idx = -1;
    int64_t n_layer = 0;
    const char* arch = NULL;
    int32_t i;
    uint64_t total = 0;

    EXPECT_STATUS(moe_synth_params_init(&sp, "qwen3moe"), MOE_STATUS_OK);
    sp.preset = "tiny";
    sp.seed = 7;
    EXPECT_STATUS(moe_synth_write(path, &sp), MOE_STATUS_OK);

    moe_model_params_init(&mp);
    EXPECT(mp.struct_size == sizeof mp);
    EXPECT(mp.use_mmap == 1);
    mp.progress = on_progress;
    count_progress_calls = 0;
    EXPECT_STATUS(moe_model_load(path, &mp, &model), MOE_STATUS_OK);
    EXPECT(model != NULL);
    EXPECT(count_progress_calls >= 1);
    if (model == NULL) return;

    moe_model_info_init(&info);
    EXPECT_STATUS(moe_model_get_info(model, &info), MOE_STATUS_OK);
    EXPECT(strcmp(info.architecture, "qwen3moe") == 0);
    EXPECT(info.n_layer > 0 && info.n_expert > info.n_expert_used && info.n_expert_used > 0);
    EXPECT(info.n_tensors == 3 + 12 * info.n_layer);
    EXPECT(info.n_expert_bytes > 0 && info.n_expert_bytes < info.n_bytes);

    EXPECT_STATUS(moe_model_meta_int(model, "qwen3moe.block_count", &n_layer), MOE_STATUS_OK);
    EXPECT(n_layer == info.n_layer);
    EXPECT_STATUS(moe_model_meta_string(model, "general.architecture", &arch), MOE_STATUS_OK);
    EXPECT(arch != NULL && strcmp(arch, "qwen3moe") == 0);
    EXPECT_STATUS(moe_model_meta_int(model, "no.such.key", &n_layer), MOE_STATUS_NOT_FOUND);
    EXPECT_STATUS(moe_model_meta_string(model, "qwen3moe.block_count", &arch), MOE_STATUS_INVALID_ARGUMENT);

    EXPECT_STATUS(moe_model_find_tensor(model, "blk.0.ffn_up_exps.weight", &idx), MOE_STATUS_OK);
    moe_tensor_info_init(&ti);
    EXPECT_STATUS(moe_model_get_tensor(model, idx, &ti), MOE_STATUS_OK);
    EXPECT(strcmp(ti.name, "blk.0.ffn_up_exps.weight") == 0);
    EXPECT(ti.n_dims == 3);
    EXPECT(ti.ne[0] == info.n_embd && ti.ne[1] == info.n_ff_expert && ti.ne[2] == info.n_expert);
    EXPECT(ti.type == MOE_TYPE_Q8_0);
    {
        void* buf = malloc(ti.n_bytes);
        EXPECT_STATUS(moe_model_read_tensor(model, idx, buf, ti.n_bytes), MOE_STATUS_OK);
        EXPECT_STATUS(moe_model_read_tensor(model, idx, buf, ti.n_bytes - 1), MOE_STATUS_INVALID_ARGUMENT);
        free(buf);
    }
    for (i = 0; i < info.n_tensors; ++i) {
        EXPECT_STATUS(moe_model_get_tensor(model, i, &ti), MOE_STATUS_OK);
        total += ti.n_bytes;
    }
    EXPECT(total == info.n_bytes);
    EXPECT_STATUS(moe_model_get_tensor(model, info.n_tensors, &ti), MOE_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(moe_model_get_tensor(model, -1, &ti), MOE_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(moe_model_find_tensor(model, "nope", &idx), MOE_STATUS_NOT_FOUND);

    /* NULL arguments are caller errors, never crashes. */
    EXPECT_STATUS(moe_model_get_info(NULL, &info), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(moe_model_get_info(model, NULL), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(moe_model_find_tensor(model, NULL, &idx), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(moe_model_get_tensor(model, 0, NULL), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT(strlen(moe_last_error()) > 0);

    moe_model_free(model);
    moe_model_free(NULL); /* no-op */

    /* Loading without mmap gives the same table. */
    mp.use_mmap = 0;
    model = NULL;
    EXPECT_STATUS(moe_model_load(path, &mp, &model), MOE_STATUS_OK);
    if (model != NULL) {
        moe_model_info info2;
        moe_model_info_init(&info2);
        EXPECT_STATUS(moe_model_get_info(model, &info2), MOE_STATUS_OK);
        EXPECT(info2.n_bytes == info.n_bytes && info2.n_tensors == info.n_tensors);
        moe_model_free(model);
    }
}

static void test_load_errors(void) {
    const char* good = tmp_path("c_api_tiny.gguf");
    const char* trunc = tmp_path("c_api_truncated.gguf");
    const char* magic = tmp_path("c_api_badmagic.gguf");
    moe_model* model = (moe_model*)0x1; /* must stay untouched on failure */
    moe_model_params mp;
    long size = file_size(good);

    EXPECT_STATUS(moe_model_load(tmp_path("does_not_exist.gguf"), NULL, &model), MOE_STATUS_NOT_FOUND);
    EXPECT(strstr(moe_last_error(), "does_not_exist.gguf") != NULL);
    EXPECT(model == (moe_model*)0x1);
    EXPECT_STATUS(moe_model_load(NULL, NULL, &model), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(moe_model_load(good, NULL, NULL), MOE_STATUS_INVALID_ARGUMENT);

    EXPECT(size > 1000);
    EXPECT(copy_prefix(good, trunc, size / 2, NULL));
    EXPECT_STATUS(moe_model_load(trunc, NULL, &model), MOE_STATUS_DATA_CORRUPT);
    EXPECT(copy_prefix(good, trunc, 10, NULL));
    EXPECT_STATUS(moe_model_load(trunc, NULL, &model), MOE_STATUS_DATA_CORRUPT);
    EXPECT(copy_prefix(good, magic, size, "GGML"));
    EXPECT_STATUS(moe_model_load(magic, NULL, &model), MOE_STATUS_DATA_CORRUPT);
    EXPECT(strstr(moe_last_error(), "magic") != NULL);
    EXPECT(model == (moe_model*)0x1);

    moe_model_params_init(&mp);
    mp.struct_size = 2; /* too small to hold any field */
    EXPECT_STATUS(moe_model_load(good, &mp, &model), MOE_STATUS_INVALID_ARGUMENT);
}

static void test_quantize(void) {
    float src[64], back[64];
    unsigned char q[2 * 34];
    uint64_t bytes = 0;
    int64_t bs = 0, bb = 0;
    int i;
    for (i = 0; i < 64; ++i) src[i] = (float)((i * 37) % 19) - 9.0f + 0.25f * (float)(i % 3);
    EXPECT_STATUS(moe_type_row_bytes(MOE_TYPE_Q8_0, 64, &bytes), MOE_STATUS_OK);
    EXPECT(bytes == 68);
    EXPECT_STATUS(moe_type_block_info(MOE_TYPE_MXFP4, &bs, &bb), MOE_STATUS_OK);
    EXPECT(bs == 32 && bb == 17);
    EXPECT_STATUS(moe_quantize(MOE_TYPE_Q8_0, src, 64, q, sizeof q), MOE_STATUS_OK);
    EXPECT_STATUS(moe_dequantize(MOE_TYPE_Q8_0, q, sizeof q, 64, back), MOE_STATUS_OK);
    for (i = 0; i < 64; ++i) EXPECT(back[i] - src[i] < 0.05f && src[i] - back[i] < 0.05f);
    EXPECT_STATUS(moe_quantize(MOE_TYPE_Q8_0, src, 63, q, sizeof q), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(moe_quantize(MOE_TYPE_Q8_0, src, 64, q, 10), MOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(moe_quantize(12345, src, 64, q, sizeof q), MOE_STATUS_UNIMPLEMENTED);
    EXPECT_STATUS(moe_quantize(MOE_TYPE_Q8_0, NULL, 64, q, sizeof q), MOE_STATUS_INVALID_ARGUMENT);
}

int main(void) {
    test_status_and_version();
    test_load_and_query();
    test_load_errors();
    test_quantize();
    if (g_failures != 0) {
        fprintf(stderr, "test_c_api: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_c_api: all checks passed\n");
    return 0;
}
