// C API: chat templates (the built-in renderers of lib/text/chat over the model's
// tokenizer.chat_template or a given template text).
#include <cstddef>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/model.h"
#include "text/chat/chat.h"
#include "text/detokenize.h"

// Released layouts: fields are only ever appended.
static_assert(offsetof(moe_chat_message, role) == 0);
static_assert(offsetof(moe_chat_message, content) == sizeof(void*));
static_assert(offsetof(moe_chat_message, reasoning) == 2 * sizeof(void*));
static_assert(offsetof(moe_chat_params, struct_size) == 0);
static_assert(offsetof(moe_chat_params, template_name) == 8);
static_assert(offsetof(moe_chat_params, enable_thinking) == 16);
static_assert(offsetof(moe_chat_params, reasoning_effort) == 24);
static_assert(offsetof(moe_chat_params, model_identity) == 32);
static_assert(offsetof(moe_chat_params, date) == 40);
static_assert(offsetof(moe_chat_params, bos_token) == 48);

namespace {

namespace chat = moe::text::chat;

constexpr const char* kDeepSeekBos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";

moe::StatusOr<std::string> model_template(const moe_model* model) {
    if (model == nullptr) return moe::invalid_argument("model and template_text are both NULL");
    const moe::GgufValue* v = model->file->find("tokenizer.chat_template");
    if (v == nullptr) {
        return moe::not_found("the model has no tokenizer.chat_template (pass the template text, or a template_name)");
    }
    if (v->type != moe::GgufValueType::STRING) {
        return moe::invalid_argument(std::string("metadata 'tokenizer.chat_template' is a ") +
                                     moe::gguf_value_type_name(v->type) + ", not a string");
    }
    return v->s;
}

// strftime_now("%Y-%m-%d") of the templates: today in local time.
std::string today() {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[32];
    const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%d", &local);
    return std::string(buf, n);
}

std::string bos_text(const moe_model* model) {
    if (model == nullptr) return kDeepSeekBos;
    if (model->vocab == nullptr || !model->vocab->valid(model->vocab->bos())) return "";
    std::string piece;
    moe::text::token_to_piece(*model->vocab, model->vocab->bos(), true, piece);
    return piece;
}

moe::Status read_messages(const moe_chat_message* messages, int64_t n, std::vector<chat::Message>& out) {
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const moe_chat_message& m = messages[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (m.role == nullptr) return moe::invalid_argument(at + ".role is NULL");
        if (m.content == nullptr) return moe::invalid_argument(at + ".content is NULL (use \"\" for none)");
        chat::Message c;
        c.role = m.role;
        c.content = m.content;
        c.has_reasoning = m.reasoning != nullptr;
        if (c.has_reasoning) c.reasoning = m.reasoning;
        out.push_back(c);
    }
    return moe::Status::ok();
}

}  // namespace

extern "C" {

MOE_API void moe_chat_params_init(moe_chat_params* params) {
    if (params == nullptr) return;
    std::memset(params, 0, sizeof(*params));
    params->struct_size = sizeof(*params);
    params->enable_thinking = -1;
}

MOE_API moe_status moe_chat_apply_template(const moe_model* model, const char* template_text,
                                           const moe_chat_message* messages, int64_t n_messages,
                                           int32_t add_generation_prompt, const moe_chat_params* params, char* buf,
                                           int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(n_messages >= 0, "n_messages is negative");
    MOE_CHECK_ARG(messages != nullptr || n_messages == 0, "messages is NULL with n_messages > 0");
    MOE_CHECK_ARG(capacity >= 0, "capacity is negative");
    MOE_CHECK_ARG(buf != nullptr || capacity == 0, "buf is NULL with capacity > 0");
    moe_chat_params defaults;
    moe_chat_params_init(&defaults);
    moe_chat_params p = defaults;
    if (params != nullptr) {
        MOE_CHECK_ARG(params->struct_size >= sizeof(uint32_t), "params->struct_size is 0 (call moe_chat_params_init first)");
        p = moe::read_sized(*params, defaults);
    }
    MOE_CHECK_ARG(p.enable_thinking >= -1 && p.enable_thinking <= 1,
                  "params->enable_thinking is " + std::to_string(p.enable_thinking) + " (-1, 0 or 1)");

    chat::Renderer renderer;
    if (p.template_name != nullptr) {
        MOE_API_ASSIGN(renderer, chat::by_name(p.template_name));
    } else if (template_text != nullptr) {
        MOE_API_ASSIGN(renderer, chat::detect(template_text));
    } else {
        MOE_API_ASSIGN(const std::string text, model_template(model));
        MOE_API_ASSIGN(renderer, chat::detect(text));
    }

    std::vector<chat::Message> msgs;
    MOE_RETURN_API(read_messages(messages, n_messages, msgs));
    chat::Options opt;
    opt.add_generation_prompt = add_generation_prompt != 0;
    opt.enable_thinking = p.enable_thinking;
    opt.has_reasoning_effort = p.reasoning_effort != nullptr;
    if (opt.has_reasoning_effort) opt.reasoning_effort = p.reasoning_effort;
    opt.has_model_identity = p.model_identity != nullptr;
    if (opt.has_model_identity) opt.model_identity = p.model_identity;
    opt.date = p.date != nullptr ? std::string(p.date) : today();
    opt.bos_token = p.bos_token != nullptr ? std::string(p.bos_token) : bos_text(model);

    std::string out;
    MOE_RETURN_API(chat::render(renderer, msgs, opt, out));
    *out_n = static_cast<int64_t>(out.size());
    if (static_cast<uint64_t>(capacity) >= out.size() && !out.empty()) std::memcpy(buf, out.data(), out.size());
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_chat_template_detect(const char* template_text, const char** out_name) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(template_text != nullptr, "template_text is NULL");
    MOE_CHECK_ARG(out_name != nullptr, "out_name is NULL");
    MOE_API_ASSIGN(const chat::Renderer r, chat::detect(template_text));
    *out_name = chat::name_of(r);
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
