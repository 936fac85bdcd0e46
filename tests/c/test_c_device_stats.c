/* C99: per-device statistics of a context over two emulated devices (moe_context_get_n_devices,
 * moe_context_get_device_info, moe_context_get_device_stats): every counter and placement figure of
 * the devices sums to moe_context_get_stats' (n_ubatches: the most any device ran), the bytes between
 * devices are counted on the device that sent them and on the one that received them, a reset zeroes
 * every device's, an index out of range is named, and a caller built with a shorter moe_device_info
 * keeps the fields past its struct_size. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "c_older_caller.h"
#include "c_random.h"
#include "moeinfer/moeinfer.h"

#define N_PROMPT 11

/* Sums a field of moe_sched_stats over its elements (scalar or per-op array) of type T. */
#define SUM_INTO(T, acc, a, b)                                      \
    do {                                                            \
        size_t i_, n_ = sizeof(acc) / sizeof(T);                    \
        T* acc_ = (T*)(void*)&(acc);                                \
        const T* b_ = (const T*)(const void*)&(b);                  \
        memcpy(&(acc), &(a), sizeof(acc));                          \
        for (i_ = 0; i_ < n_; ++i_) acc_[i_] += b_[i_];             \
    } while (0)

/* The devices' counters summed (device 0 first, as the context sums them) equal the context's. */
static void check_sum(const moe_sched_stats* whole, const moe_sched_stats* d0, const moe_sched_stats* d1) {
    moe_sched_stats sum;
    memset(&sum, 0, sizeof sum);
#define SUM_FIELD(type, name, dims) SUM_INTO(type, sum.name, d0->name, d1->name);
    MOE_SCHED_STATS_COUNTERS(SUM_FIELD)
#undef SUM_FIELD
    sum.n_ubatches = d0->n_ubatches > d1->n_ubatches ? d0->n_ubatches : d1->n_ubatches;
#define CHECK_FIELD(type, name, dims)                                    \
    if (memcmp(&sum.name, &whole->name, sizeof sum.name) != 0) {         \
        fprintf(stderr, "device sums differ from the context's: %s\n", #name); \
        ++g_failures;                                                    \
    }
    MOE_SCHED_STATS_COUNTERS(CHECK_FIELD)
#undef CHECK_FIELD
    EXPECT(d0->weights_host_bytes + d1->weights_host_bytes == whole->weights_host_bytes);
    EXPECT(d0->weights_device_bytes + d1->weights_device_bytes == whole->weights_device_bytes);
    EXPECT(d0->weights_host_pinned_bytes + d1->weights_host_pinned_bytes == whole->weights_host_pinned_bytes);
    EXPECT(d0->n_layer == whole->n_layer && d1->n_layer == whole->n_layer);
}

static moe_sched_stats device_stats(const moe_context* ctx, int32_t index) {
    moe_sched_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT(moe_context_get_device_stats(ctx, index, &s) == MOE_STATUS_OK);
    return s;
}

int main(void) {
    char path[1024];
    moe_synth_params sp;
    moe_model* model = NULL;
    moe_model_info info;
    moe_context_params p;
    moe_sched_policy pol;
    moe_context* ctx = NULL;
    moe_sched_stats whole, d0, d1;
    moe_device_info di;
    int32_t devices[2] = {1, 0}, n = 0, layers = 0, i;
    int32_t tokens[N_PROMPT];
    uint64_t crossed;

    seed_random("test_c_device_stats");
    snprintf(path, sizeof path, "%s/c_device_stats.gguf", MOE_TEST_TMP_DIR);
    EXPECT(moe_synth_params_init(&sp, "qwen3moe") == MOE_STATUS_OK);
    sp.preset = "tiny";
    sp.seed = g_rng;
    sp.n_layer = 4;
    EXPECT(moe_synth_write(path, &sp) == MOE_STATUS_OK);
    EXPECT(moe_model_load(path, NULL, &model) == MOE_STATUS_OK);
    if (model == NULL) return 1;
    moe_model_info_init(&info);
    EXPECT(moe_model_get_info(model, &info) == MOE_STATUS_OK);

    /* Two emulated devices, listed in reverse, the experts in host RAM and offloaded from 4 tokens. */
    moe_sched_policy_init(&pol);
    EXPECT(moe_sched_policy_parse_offload(&pol, "all=4") == MOE_STATUS_OK);
    pol.expert_split = 0;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.n_ubatch = 16;
    p.n_threads = 2;
    p.device = MOE_DEVICE_EMULATED;
    p.devices = devices;
    p.n_devices = 2;
    p.tensor_overrides = "exps=CPU";
    p.policy = &pol;
    EXPECT(moe_context_create(model, &p, &ctx) == MOE_STATUS_OK);
    if (ctx == NULL) return 1;

    EXPECT(moe_context_get_n_devices(ctx, &n) == MOE_STATUS_OK && n == 2);
    for (i = 0; i < 2; ++i) {
        memset(&di, 0, sizeof di);
        di.struct_size = sizeof di;
        EXPECT(moe_context_get_device_info(ctx, i, &di) == MOE_STATUS_OK);
        EXPECT(di.kind == MOE_DEVICE_EMULATED && di.ordinal == devices[i] && di.n_layers > 0);
        layers += di.n_layers;
    }
    EXPECT(layers == info.n_layer);

    random_tokens(tokens, N_PROMPT, info.n_vocab);
    EXPECT(moe_decode(ctx, tokens, NULL, N_PROMPT, 0) == MOE_STATUS_OK);
    memset(&whole, 0, sizeof whole);
    whole.struct_size = sizeof whole;
    EXPECT(moe_context_get_stats(ctx, &whole) == MOE_STATUS_OK);
    d0 = device_stats(ctx, 0);
    d1 = device_stats(ctx, 1);
    check_sum(&whole, &d0, &d1);
    /* One boundary crossed through host memory: the residual stream out of device 0, into device 1. */
    crossed = (uint64_t)4 * (uint64_t)info.n_embd * N_PROMPT;
    EXPECT(d0.bytes_between_devices == crossed && d1.bytes_between_devices == crossed);
    /* Each device uploaded its own layers' host-resident experts. */
    EXPECT(d0.bytes_weights_full + d0.bytes_weights_experts > 0);
    EXPECT(d1.bytes_weights_full + d1.bytes_weights_experts > 0);
    EXPECT(d0.weights_host_bytes > 0 && d1.weights_host_bytes > 0);

    /* Reset: every device's counters are zero, their placement figures stay. */
    EXPECT(moe_context_reset_stats(ctx) == MOE_STATUS_OK);
    for (i = 0; i < 2; ++i) {
        moe_sched_stats z = device_stats(ctx, i);
        EXPECT(z.n_ubatches == 0 && z.bytes_weights_full == 0 && z.bytes_between_devices == 0);
        EXPECT(z.n_ops_device == 0 && z.seconds_total == 0.0);
        EXPECT(z.weights_host_bytes == (i == 0 ? d0 : d1).weights_host_bytes);
    }

    /* Bad indices and arguments are named. */
    EXPECT_ERROR(moe_context_get_device_stats(ctx, 2, &d0), MOE_STATUS_INVALID_ARGUMENT, "device_index 2");
    EXPECT_ERROR(moe_context_get_device_stats(ctx, -1, &d0), MOE_STATUS_INVALID_ARGUMENT, "device_index -1");
    EXPECT_ERROR(moe_context_get_device_info(ctx, 2, &di), MOE_STATUS_INVALID_ARGUMENT, "device_index 2");
    EXPECT_ERROR(moe_context_get_n_devices(ctx, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_n_devices");
    EXPECT_ERROR(moe_context_get_device_stats(NULL, 0, &d0), MOE_STATUS_INVALID_ARGUMENT, "ctx");

    /* A caller built before n_layers: the field past its struct_size is never written. */
    as_older_caller(&di, sizeof di, offsetof(moe_device_info, n_layers));
    EXPECT(moe_context_get_device_info(ctx, 1, &di) == MOE_STATUS_OK);
    EXPECT(di.ordinal == devices[1]);
    EXPECT(older_caller_tail_untouched(&di, sizeof di, offsetof(moe_device_info, n_layers)));

    moe_context_free(ctx);
    moe_model_free(model);
    remove(path);
    if (g_failures != 0) {
        fprintf(stderr, "test_c_device_stats: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_c_device_stats: all checks passed\n");
    return 0;
}
