// gpt-oss (OpenAI harmony), as tests/python/reference/chat_templates/gpt-oss-20b.jinja (the release
// text) and gpt-oss-120b.jinja (the later revision) render plain messages.
#include "text/chat/chat.h"
#include "text/chat/pystr.h"

namespace moe::text::chat {
namespace {

constexpr const char* kDefaultIdentity = "You are ChatGPT, a large language model trained by OpenAI.";

Status check_channels(std::string_view text, const char* field) {
    if (contains(text, "<|channel|>analysis<|message|>") || contains(text, "<|channel|>final<|message|>")) {
        // The template's own raise_exception text.
        return invalid_argument(std::string("You have passed a message containing <|channel|> tags in the ") + field +
                                " field. Instead of doing this, you should pass analysis messages (the string between "
                                "'<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string "
                                "between '<|message|>' and '<|end|>') in the 'content' field.");
    }
    return Status::ok();
}

}  // namespace

Status render_harmony(const Renderer& r, const std::vector<Message>& messages, const Options& opt, std::string& out) {
    out.append("<|start|>system<|message|>");
    out.append(opt.has_model_identity ? opt.model_identity : std::string(kDefaultIdentity)).append("\n");
    out.append("Knowledge cutoff: 2024-06\n");
    out.append("Current date: ").append(opt.date).append("\n\n");
    out.append("Reasoning: ").append(opt.has_reasoning_effort ? opt.reasoning_effort : std::string("medium"));
    out.append("\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (r.harmony_release) out.append("\nCalls to these tools must go to the commentary channel: 'functions'.");
    out.append("<|end|>");

    size_t first = 0;
    std::string_view developer;
    if (messages[0].role == "developer" || messages[0].role == "system") {
        developer = messages[0].content;
        first = 1;
    }
    if (!developer.empty()) {
        out.append("<|start|>developer<|message|># Instructions\n\n").append(developer);
        if (!r.harmony_release) out.append("\n\n");
        out.append("<|end|>");
    }
    for (size_t i = first; i < messages.size(); ++i) {
        const Message& m = messages[i];
        if (m.role == "user") {
            out.append("<|start|>user<|message|>").append(m.content).append("<|end|>");
        } else if (m.role == "assistant") {
            MOE_RETURN_IF_ERROR(check_channels(m.content, "content"));
            if (m.has_reasoning) MOE_RETURN_IF_ERROR(check_channels(m.reasoning, "thinking"));
            // Reasoning is written only for a last assistant turn that ends the text (training data).
            if (i + 1 == messages.size() && !opt.add_generation_prompt) {
                if (m.has_reasoning) {
                    out.append("<|start|>assistant<|channel|>analysis<|message|>").append(m.reasoning).append("<|end|>");
                }
                out.append("<|start|>assistant<|channel|>final<|message|>").append(m.content).append("<|return|>");
            } else {
                out.append("<|start|>assistant<|channel|>final<|message|>").append(m.content).append("<|end|>");
            }
        }
        // A later system or developer message: the templates write nothing for it.
    }
    if (opt.add_generation_prompt) out.append("<|start|>assistant");
    return Status::ok();
}

}  // namespace moe::text::chat
