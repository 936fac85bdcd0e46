// moeinfer._moeinfer.chat_render_builtin / chat_template_detect: the C library's built-in chat
// template renderers (moeinfer.h, "Chat templates"). moeinfer/chat_template.py is the Python face.
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"

namespace moeinfer_py {

using namespace pybind11::literals;

namespace {

// The C API takes NUL-terminated strings: a NUL inside would cut the text silently.
const std::string& no_nul(const std::string& s, const std::string& what) {
    if (s.find('\0') != std::string::npos) throw py::value_error(what + " contains a NUL character");
    return s;
}

using MessageTuple = std::tuple<std::string, std::string, std::optional<std::string>>;

std::string render_builtin(const std::vector<MessageTuple>& messages, const std::optional<std::string>& template_text,
                           const moeinfer::Model* model, bool add_generation_prompt,
                           const std::optional<std::string>& template_name, std::optional<bool> enable_thinking,
                           const std::optional<std::string>& reasoning_effort,
                           const std::optional<std::string>& model_identity, const std::optional<std::string>& date,
                           const std::optional<std::string>& bos_token) {
    std::vector<moe_chat_message> msgs;
    msgs.reserve(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
        const auto& [role, content, reasoning] = messages[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        moe_chat_message m{};
        m.role = no_nul(role, at + "['role']").c_str();
        m.content = no_nul(content, at + "['content']").c_str();
        m.reasoning = reasoning ? no_nul(*reasoning, at + " reasoning").c_str() : nullptr;
        msgs.push_back(m);
    }
    moe_chat_params p = moeinfer::chat_params();
    auto opt = [](const std::optional<std::string>& s, const char* what) {
        return s ? no_nul(*s, what).c_str() : nullptr;
    };
    p.template_name = opt(template_name, "template_name");
    p.enable_thinking = enable_thinking ? (*enable_thinking ? 1 : 0) : -1;
    p.reasoning_effort = opt(reasoning_effort, "reasoning_effort");
    p.model_identity = opt(model_identity, "model_identity");
    p.date = opt(date, "date");
    p.bos_token = opt(bos_token, "bos_token");
    const char* text = opt(template_text, "template");
    try {
        py::gil_scoped_release release;
        return moeinfer::chat_apply_template(model, text, msgs, add_generation_prompt, p);
    } catch (const moeinfer::Error& e) {
        // The one NOT_FOUND here is the missing metadata key (not a file).
        if (e.status() == MOE_STATUS_NOT_FOUND) throw py::key_error(e.what());
        throw;
    }
}

}  // namespace

void bind_chat(py::module_& m) {
    m.def("chat_render_builtin", &render_builtin, "messages"_a, "template"_a, "model"_a, "add_generation_prompt"_a,
          "template_name"_a, "enable_thinking"_a, "reasoning_effort"_a, "model_identity"_a, "date"_a, "bos_token"_a,
          "The C renderer (moe_chat_apply_template); use moeinfer.chat_template.render_builtin.");
    m.def("chat_template_detect", &moeinfer::chat_template_detect, "template"_a,
          "The built-in renderer's name for a template text; NotImplementedError when none matches.");
}

}  // namespace moeinfer_py
