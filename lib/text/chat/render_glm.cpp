// GLM-4.5, as tests/python/reference/chat_templates/glm-4.5.jinja renders plain messages.
#include "text/chat/chat.h"
#include "text/chat/pystr.h"

namespace moe::text::chat {

void render_glm45(const std::vector<Message>& messages, const Options& opt, std::string& out) {
    out.append("[gMASK]<sop>");
    size_t last_user = messages.size();  // none
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role == "user") last_user = i;
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        const Message& m = messages[i];
        if (m.role == "user") {
            out.append("<|user|>\n").append(m.content);
            if (opt.enable_thinking == 0 && !m.content.ends_with("/nothink")) out.append("/nothink");
        } else if (m.role == "assistant") {
            std::string_view content = m.content;
            std::string_view reasoning;
            if (m.has_reasoning) {
                reasoning = m.reasoning;
            } else if (contains(content, "</think>")) {
                reasoning = py_rstrip_char(py_split_first(content, "</think>"), '\n');
                reasoning = py_lstrip_char(py_split_last(reasoning, "<think>"), '\n');
                content = py_lstrip_char(py_split_last(content, "</think>"), '\n');
            }
            out.append("<|assistant|>");
            // Reasoning of turns before the last user message is dropped (an empty think block stays).
            const bool after_last_user = last_user == messages.size() || i > last_user;
            if (after_last_user && !reasoning.empty()) {
                out.append("\n<think>").append(py_strip(reasoning)).append("</think>");
            } else {
                out.append("\n<think></think>");
            }
            const std::string_view visible = py_strip(content);
            if (!visible.empty()) out.append("\n").append(visible);
        } else {
            out.append("<|system|>\n").append(m.content);
        }
    }
    if (opt.add_generation_prompt) {
        out.append("<|assistant|>");
        if (opt.enable_thinking == 0) out.append("\n<think></think>");
    }
}

}  // namespace moe::text::chat
