// Built-in chat template renderers: the prompt text a model's own jinja chat template would give for
// plain system / user / assistant messages, written in C++ for the families moeinfer runs, chosen
// from the template text. Each renderer reproduces what jinja2 (as Hugging Face runs it) renders from
// the real template, byte for byte; tests/python/test_chat_template.py holds them to that.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moe::text::chat {

enum class Family { CHATML, QWEN3, HARMONY, DEEPSEEK, GLM45 };

// A family and the variant flags its known template revisions differ by.
struct Renderer {
    Family family = Family::CHATML;
    // HARMONY: the release text (tool channel line always written; no blank line after the
    // developer instructions) rather than the later revision.
    bool harmony_release = false;
    // DEEPSEEK: several system messages joined by a blank line (else the last one only); the text
    // after the last "</think>" of earlier assistant turns only; "<think>\n" opens the generation.
    bool deepseek_join_systems = false;
    bool deepseek_strip_think = false;
    bool deepseek_gen_think = false;
};

struct Message {
    std::string_view role;     // "system", "user", "assistant" ("developer" too for HARMONY)
    std::string_view content;
    bool has_reasoning = false;  // the template sees reasoning_content / thinking only when set
    std::string_view reasoning;
};

struct Options {
    bool add_generation_prompt = true;
    int enable_thinking = -1;          // -1: undefined in the template, else false / true
    bool has_reasoning_effort = false;  // HARMONY: "Reasoning: " (template default "medium")
    std::string reasoning_effort;
    bool has_model_identity = false;  // HARMONY: the system message's first line
    std::string model_identity;
    std::string date;       // HARMONY: "Current date: " (strftime_now("%Y-%m-%d")); REQUIRES: set
    std::string bos_token;  // DEEPSEEK: the text of {{ bos_token }} ("" when the model has none)
};

// The renderer for a template text, from the markers each family's templates carry; UNIMPLEMENTED,
// naming the known families and how to choose one, when none matches.
StatusOr<Renderer> detect(std::string_view template_text);

// The renderer named "chatml", "qwen3", "gpt-oss", "deepseek-v3", "deepseek-r1" or "glm4.5"
// (see names()); INVALID_ARGUMENT listing them for another name.
StatusOr<Renderer> by_name(std::string_view name);

// The names by_name() takes, comma-separated, for messages and help texts.
const char* names();

// The canonical name of a renderer (one of names()).
const char* name_of(const Renderer& r);

// Renders `messages` into `out` (replacing it). INVALID_ARGUMENT for an empty conversation, a role
// the renderer does not handle (naming it and its index) or content the template itself refuses.
Status render(const Renderer& r, const std::vector<Message>& messages, const Options& opt, std::string& out);

// Renderers of each family (REQUIRES: roles already checked by render()).
void render_chatml(const std::vector<Message>& messages, const Options& opt, std::string& out);
void render_qwen3(const std::vector<Message>& messages, const Options& opt, std::string& out);
Status render_harmony(const Renderer& r, const std::vector<Message>& messages, const Options& opt, std::string& out);
void render_deepseek(const Renderer& r, const std::vector<Message>& messages, const Options& opt, std::string& out);
void render_glm45(const std::vector<Message>& messages, const Options& opt, std::string& out);

}  // namespace moe::text::chat
