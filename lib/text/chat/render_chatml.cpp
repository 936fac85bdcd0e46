// ChatML and Qwen3 (ChatML with <think> reasoning), as tests/python/reference/chat_templates/qwen3.jinja
// renders plain messages.
#include "text/chat/chat.h"
#include "text/chat/pystr.h"

namespace moe::text::chat {
namespace {

void turn(std::string& out, std::string_view role, std::string_view content) {
    out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
}

// The index of the last user message that is not a tool response (Qwen3's last_query_index); the
// last index when there is none.
size_t last_query_index(const std::vector<Message>& messages) {
    for (size_t i = messages.size(); i-- > 0;) {
        const Message& m = messages[i];
        if (m.role == "user" && !(m.content.starts_with("<tool_response>") && m.content.ends_with("</tool_response>"))) {
            return i;
        }
    }
    return messages.size() - 1;
}

}  // namespace

void render_chatml(const std::vector<Message>& messages, const Options& opt, std::string& out) {
    for (const Message& m : messages) turn(out, m.role, m.content);
    if (opt.add_generation_prompt) out.append("<|im_start|>assistant\n");
}

void render_qwen3(const std::vector<Message>& messages, const Options& opt, std::string& out) {
    if (messages[0].role == "system") turn(out, "system", messages[0].content);
    const size_t last_query = last_query_index(messages);
    for (size_t i = 0; i < messages.size(); ++i) {
        const Message& m = messages[i];
        if (m.role == "user" || (m.role == "system" && i > 0)) {
            turn(out, m.role, m.content);
            continue;
        }
        if (m.role != "assistant") continue;
        std::string_view content = m.content;
        std::string_view reasoning;
        if (m.has_reasoning) {
            reasoning = m.reasoning;
        } else if (contains(m.content, "</think>")) {
            content = py_lstrip_char(py_split_last(m.content, "</think>"), '\n');
            reasoning = py_split_first(m.content, "</think>");
            reasoning = py_lstrip_char(py_split_last(py_rstrip_char(reasoning, '\n'), "<think>"), '\n');
        }
        out.append("<|im_start|>assistant\n");
        // Reasoning is kept only after the last user query, and written for the last turn even when empty.
        const bool last = i + 1 == messages.size();
        if (i > last_query && (last || !reasoning.empty())) {
            out.append("<think>\n").append(py_strip_char(reasoning, '\n')).append("\n</think>\n\n");
            out.append(py_lstrip_char(content, '\n'));
        } else {
            out.append(content);
        }
        out.append("<|im_end|>\n");
    }
    if (opt.add_generation_prompt) {
        out.append("<|im_start|>assistant\n");
        if (opt.enable_thinking == 0) out.append("<think>\n\n</think>\n\n");
    }
}

}  // namespace moe::text::chat
