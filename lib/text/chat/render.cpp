// Checks the conversation against what the renderers handle, then hands it to the family's renderer.
#include <string>

#include "text/chat/chat.h"

namespace moe::text::chat {
namespace {

bool role_ok(const Renderer& r, std::string_view role) {
    if (role == "system" || role == "user" || role == "assistant") return true;
    // gpt-oss templates take a leading "developer" message as they take a leading "system" one.
    return r.family == Family::HARMONY && role == "developer";
}

}  // namespace

Status render(const Renderer& r, const std::vector<Message>& messages, const Options& opt, std::string& out) {
    if (messages.empty()) return invalid_argument("the conversation is empty (n_messages is 0)");
    for (size_t i = 0; i < messages.size(); ++i) {
        if (!role_ok(r, messages[i].role)) {
            return invalid_argument("messages[" + std::to_string(i) + "].role is '" + std::string(messages[i].role) +
                                    "': the built-in " + name_of(r) +
                                    " renderer writes system, user and assistant messages" +
                                    (r.family == Family::HARMONY ? std::string(" (and a first developer message)")
                                                                 : std::string()) +
                                    "; tools and tool results need the jinja2 path (moeinfer.chat_template.render)");
        }
    }
    out.clear();
    switch (r.family) {
        case Family::CHATML: render_chatml(messages, opt, out); return Status::ok();
        case Family::QWEN3: render_qwen3(messages, opt, out); return Status::ok();
        case Family::HARMONY: return render_harmony(r, messages, opt, out);
        case Family::DEEPSEEK: render_deepseek(r, messages, opt, out); return Status::ok();
        case Family::GLM45: render_glm45(messages, opt, out); return Status::ok();
    }
    return internal_error("unknown chat template family");
}

}  // namespace moe::text::chat
