/* C99 test of the chat template API: the buffer convention (sizing with capacity 0, nothing written
 * when the buffer is too small, exact fit), every argument error naming what is wrong, detection and
 * the name override. Output is checked on fresh random conversations against ChatML assembled here
 * independently (the plain format needs no template logic); the other families are compared with
 * jinja2 on their real templates in tests/python/test_chat_template.py. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moeinfer/moeinfer.h"

#include "c_check.h"

static const char* const kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static unsigned long long g_rng_state;

static unsigned next_rand(void) {
    g_rng_state ^= g_rng_state >> 12;
    g_rng_state ^= g_rng_state << 25;
    g_rng_state ^= g_rng_state >> 27;
    return (unsigned)((g_rng_state * 2685821657736338717ULL) >> 40);
}

#define MAX_MSG 8
#define MAX_CONTENT 24
#define MAX_OUT (MAX_MSG * (MAX_CONTENT + 64) + 64)

static void random_content(char* s) {
    static const char* const kPieces[] = {"a", "b", " ", "\n", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x99\x82", "<"};
    size_t n = next_rand() % 5, i, k = 0;
    for (i = 0; i < n; ++i) {
        const char* p = kPieces[next_rand() % 8];
        memcpy(s + k, p, strlen(p));
        k += strlen(p);
    }
    s[k] = '\0';
}

static void test_chatml_random(void) {
    static const char* const kRoles[] = {"system", "user", "assistant"};
    char contents[MAX_MSG][MAX_CONTENT + 1], want[MAX_OUT], got[MAX_OUT];
    moe_chat_message msgs[MAX_MSG];
    int round;
    for (round = 0; round < 300; ++round) {
        int64_t n = 1 + next_rand() % MAX_MSG, i, n_out = -1;
        int32_t agp = (int32_t)(next_rand() % 2);
        size_t k = 0;
        for (i = 0; i < n; ++i) {
            random_content(contents[i]);
            msgs[i].role = kRoles[next_rand() % 3];
            msgs[i].content = contents[i];
            msgs[i].reasoning = next_rand() % 4 == 0 ? "ignored by ChatML" : NULL;
            k += (size_t)sprintf(want + k, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
        }
        if (agp) k += (size_t)sprintf(want + k, "<|im_start|>assistant\n");
        /* sizing, too small (nothing written), exact fit */
        EXPECT(moe_chat_apply_template(NULL, kChatml, msgs, n, agp, NULL, NULL, 0, &n_out) == MOE_STATUS_OK);
        EXPECT(n_out == (int64_t)k);
        memset(got, 'Z', sizeof(got));
        EXPECT(moe_chat_apply_template(NULL, kChatml, msgs, n, agp, NULL, got, n_out - 1, &n_out) == MOE_STATUS_OK);
        EXPECT(n_out == (int64_t)k && got[0] == 'Z');
        EXPECT(moe_chat_apply_template(NULL, kChatml, msgs, n, agp, NULL, got, n_out, &n_out) == MOE_STATUS_OK);
        EXPECT(n_out == (int64_t)k && memcmp(got, want, k) == 0 && got[k] == 'Z');
    }
}

static void test_detect_and_override(void) {
    const char* name = NULL;
    moe_chat_params p;
    moe_chat_message m = {"user", "hi", NULL};
    char out[1024];
    int64_t n = 0;
    EXPECT(moe_chat_template_detect(kChatml, &name) == MOE_STATUS_OK && strcmp(name, "chatml") == 0);
    EXPECT(moe_chat_template_detect("{{ messages }}<|im_start|>{% if enable_thinking %}</think>{% endif %}last_query_index",
                                    &name) == MOE_STATUS_OK &&
           strcmp(name, "qwen3") == 0);
    EXPECT_ERROR(moe_chat_template_detect("{{ bos_token }}[INST]", &name), MOE_STATUS_UNIMPLEMENTED, "glm4.5");
    EXPECT_ERROR(moe_chat_template_detect("", &name), MOE_STATUS_UNIMPLEMENTED, "empty");
    EXPECT_ERROR(moe_chat_template_detect(NULL, &name), MOE_STATUS_INVALID_ARGUMENT, "template_text");
    EXPECT_ERROR(moe_chat_template_detect(kChatml, NULL), MOE_STATUS_INVALID_ARGUMENT, "out_name");
    EXPECT_ERROR(moe_chat_apply_template(NULL, "[INST]", &m, 1, 1, NULL, out, sizeof(out), &n), MOE_STATUS_UNIMPLEMENTED,
                 "template_name");

    moe_chat_params_init(&p);
    EXPECT(p.struct_size == sizeof(p) && p.enable_thinking == -1 && p.template_name == NULL && p.date == NULL);
    p.template_name = "glm4.5";
    p.enable_thinking = 0;
    EXPECT(moe_chat_apply_template(NULL, "[INST]", &m, 1, 1, &p, out, sizeof(out), &n) == MOE_STATUS_OK);
    EXPECT(n == (int64_t)strlen("[gMASK]<sop><|user|>\nhi/nothink<|assistant|>\n<think></think>") &&
           memcmp(out, "[gMASK]<sop><|user|>\nhi/nothink<|assistant|>\n<think></think>", (size_t)n) == 0);
    /* without a model and without bos_token, DeepSeek's BOS text */
    p.template_name = "deepseek-r1";
    EXPECT(moe_chat_apply_template(NULL, NULL, &m, 1, 1, &p, out, sizeof(out), &n) == MOE_STATUS_OK);
    EXPECT(strncmp(out, "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 25) == 0);
    p.bos_token = "";
    EXPECT(moe_chat_apply_template(NULL, NULL, &m, 1, 0, &p, out, sizeof(out), &n) == MOE_STATUS_OK);
    EXPECT(n == 14 && memcmp(out, "<\xEF\xBD\x9CUser\xEF\xBD\x9C>hi", 14) == 0);
    /* gpt-oss: the date and reasoning effort given */
    p.template_name = "gpt-oss";
    p.date = "2031-02-03";
    p.reasoning_effort = "high";
    EXPECT(moe_chat_apply_template(NULL, NULL, &m, 1, 1, &p, out, sizeof(out), &n) == MOE_STATUS_OK);
    out[n < (int64_t)sizeof(out) ? n : (int64_t)sizeof(out) - 1] = '\0';
    EXPECT(strstr(out, "Current date: 2031-02-03\n\nReasoning: high\n\n") != NULL);
    p.template_name = "llama3";
    EXPECT_ERROR(moe_chat_apply_template(NULL, NULL, &m, 1, 1, &p, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "llama3");
}

static void test_argument_errors(void) {
    moe_chat_message m[2] = {{"user", "a", NULL}, {"tool", "b", NULL}};
    moe_chat_params p;
    char out[64];
    int64_t n = 0;
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 1, 1, NULL, out, sizeof(out), NULL), MOE_STATUS_INVALID_ARGUMENT,
                 "out_n");
    EXPECT_ERROR(moe_chat_apply_template(NULL, NULL, m, 1, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "template_text");
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 0, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "empty");
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, -1, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "n_messages");
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, NULL, 1, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "messages");
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 1, 1, NULL, NULL, 8, &n), MOE_STATUS_INVALID_ARGUMENT, "buf");
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 1, 1, NULL, out, -1, &n), MOE_STATUS_INVALID_ARGUMENT,
                 "capacity");
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 2, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "messages[1].role is 'tool'");
    m[1].role = NULL;
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 2, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "messages[1].role");
    m[1].role = "user";
    m[1].content = NULL;
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 2, 1, NULL, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "messages[1].content");
    moe_chat_params_init(&p);
    p.enable_thinking = 2;
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 1, 1, &p, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "enable_thinking");
    p.struct_size = 0;
    EXPECT_ERROR(moe_chat_apply_template(NULL, kChatml, m, 1, 1, &p, out, sizeof(out), &n), MOE_STATUS_INVALID_ARGUMENT,
                 "struct_size");
    /* an older caller's shorter struct: the fields past it keep their defaults */
    moe_chat_params_init(&p);
    p.struct_size = (uint32_t)(offsetof(moe_chat_params, template_name) + sizeof(p.template_name));
    p.enable_thinking = 0; /* outside the struct: not read */
    p.template_name = "glm4.5";
    EXPECT(moe_chat_apply_template(NULL, NULL, m, 1, 1, &p, out, sizeof(out), &n) == MOE_STATUS_OK);
    EXPECT(n == (int64_t)strlen("[gMASK]<sop><|user|>\na<|assistant|>"));
    moe_chat_params_init(NULL); /* a no-op */
}

int main(void) {
    g_rng_state = (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ULL | 1ULL;
    printf("seed state %llu\n", g_rng_state);
    test_chatml_random();
    test_detect_and_override();
    test_argument_errors();
    if (g_failures != 0) {
        fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
