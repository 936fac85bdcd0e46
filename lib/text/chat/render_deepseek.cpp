// DeepSeek-V3 / R1, as tests/python/reference/chat_templates/deepseek-v3.jinja and deepseek-r1.jinja
// (and their earlier revisions, by the variant flags) render plain messages.
#include "text/chat/chat.h"
#include "text/chat/pystr.h"

namespace moe::text::chat {

void render_deepseek(const Renderer& r, const std::vector<Message>& messages, const Options& opt, std::string& out) {
    std::string system;
    bool first_system = true;
    for (const Message& m : messages) {
        if (m.role != "system") continue;
        if (!r.deepseek_join_systems) {
            system.assign(m.content);
        } else {
            if (!first_system) system.append("\n\n");
            system.append(m.content);
        }
        first_system = false;
    }
    out.append(opt.bos_token).append(system);
    for (const Message& m : messages) {
        if (m.role == "user") {
            out.append("<\xEF\xBD\x9CUser\xEF\xBD\x9C>").append(m.content);
        } else if (m.role == "assistant") {
            std::string_view content = m.content;
            if (r.deepseek_strip_think && contains(content, "</think>")) content = py_split_last(content, "</think>");
            out.append("<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>").append(content);
            out.append("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
        }
    }
    if (opt.add_generation_prompt) {
        out.append("<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>");
        if (r.deepseek_gen_think) out.append("<think>\n");
    }
}

}  // namespace moe::text::chat
