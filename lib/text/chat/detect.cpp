// Which built-in renderer a template text asks for, by the markers each family's templates carry,
// and the renderers by name.
#include <array>
#include <string>

#include "text/chat/chat.h"
#include "text/chat/pystr.h"

namespace moe::text::chat {
namespace {

struct Named {
    const char* name;
    Renderer renderer;
};

Renderer make(Family f) {
    Renderer r;
    r.family = f;
    return r;
}

Renderer deepseek(bool r1) {
    Renderer r = make(Family::DEEPSEEK);
    r.deepseek_join_systems = true;
    r.deepseek_strip_think = r1;
    r.deepseek_gen_think = r1;
    return r;
}

const std::array<Named, 6>& table() {
    static const std::array<Named, 6> t = {{
        {"chatml", make(Family::CHATML)},
        {"qwen3", make(Family::QWEN3)},
        {"gpt-oss", make(Family::HARMONY)},
        {"deepseek-v3", deepseek(false)},
        {"deepseek-r1", deepseek(true)},
        {"glm4.5", make(Family::GLM45)},
    }};
    return t;
}

// The developer message of the later gpt-oss revision ends its instructions with a blank line:
// `{{- developer_message }}` is followed by `{{- "\n\n" }}` (escaped or with real newlines).
bool harmony_blank_after_instructions(std::string_view t) {
    const size_t p = t.find("developer_message }}");
    if (p == std::string_view::npos) return false;
    std::string_view rest = t.substr(p + 20);
    while (!rest.empty() && (rest[0] == ' ' || rest[0] == '\n' || rest[0] == '\r' || rest[0] == '\t')) {
        rest.remove_prefix(1);
    }
    return rest.starts_with("{{- \"\\n\\n\" }}") || rest.starts_with("{{- \"\n\n\" }}");
}

Status unknown(const std::string& why) {
    return unimplemented("no built-in renderer for this chat template (" + why + "); the built-in families are " +
                         names() +
                         ": choose one by name (moe_chat_params.template_name; in Python render_builtin(name=) or "
                         "apply_chat_template(engine=\"c\", template_name=)) or render the template with jinja2 "
                         "(moeinfer.chat_template.render, the Python default)");
}

}  // namespace

const char* names() { return "chatml, qwen3, gpt-oss, deepseek-v3, deepseek-r1, glm4.5"; }

StatusOr<Renderer> by_name(std::string_view name) {
    for (const Named& n : table()) {
        if (name == n.name) return n.renderer;
    }
    return invalid_argument("unknown chat template name '" + std::string(name) + "' (known: " + names() + ")");
}

const char* name_of(const Renderer& r) {
    switch (r.family) {
        case Family::CHATML: return "chatml";
        case Family::QWEN3: return "qwen3";
        case Family::HARMONY: return "gpt-oss";
        case Family::DEEPSEEK: return r.deepseek_gen_think ? "deepseek-r1" : "deepseek-v3";
        case Family::GLM45: return "glm4.5";
    }
    return "chatml";
}

StatusOr<Renderer> detect(std::string_view t) {
    if (t.empty()) return unknown("the template is empty");
    if (contains(t, "<|start|>") && contains(t, "<|channel|>") && contains(t, "<|message|>")) {
        Renderer r = make(Family::HARMONY);
        r.harmony_release = !harmony_blank_after_instructions(t);
        // Both known revisions agree that the tool channel line follows the channel list; the release
        // writes it always (one literal), the revision only with tools (its own literal, after a newline).
        const bool line_always = contains(t, "\"Calls to these tools");
        if (r.harmony_release != line_always) return unknown("a gpt-oss template of an unknown revision");
        return r;
    }
    if (contains(t, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>") && contains(t, "<\xEF\xBD\x9C" "User\xEF\xBD\x9C>")) {
        Renderer r = make(Family::DEEPSEEK);
        r.deepseek_join_systems = contains(t, "is_first_sp");
        r.deepseek_strip_think = contains(t, "split('</think>')[-1]");
        r.deepseek_gen_think = contains(t, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\\n");
        return r;
    }
    if (contains(t, "[gMASK]<sop>") && contains(t, "<|assistant|>")) {
        // GLM-4.5's thinking markup; the earlier GLM-4 chat templates render differently.
        if (contains(t, "<think></think>") && contains(t, "last_user_index")) return make(Family::GLM45);
        return unknown("a [gMASK]<sop> template without GLM-4.5's thinking markup (GLM-4 or older)");
    }
    if (contains(t, "<|im_start|>")) {
        if (contains(t, "enable_thinking") && contains(t, "last_query_index") && contains(t, "</think>")) {
            return make(Family::QWEN3);
        }
        // Plain ChatML only: a template that handles reasoning or writes a default system prompt of its
        // own would render differently from it.
        if (contains(t, "think")) return unknown("a ChatML template with reasoning markup other than Qwen3's");
        if (contains(t, "You are")) return unknown("a ChatML template with a default system prompt of its own");
        return make(Family::CHATML);
    }
    return unknown("none of the families' markers <|im_start|>, <|start|> with <|channel|>, <\xEF\xBD\x9C" "Assistant"
                   "\xEF\xBD\x9C>, [gMASK]<sop> occurs in it");
}

}  // namespace moe::text::chat
