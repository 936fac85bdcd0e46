// moeinfer-run: text in, text out. Generates from a prompt (or a chat, or an interactive conversation
// with the model's chat template), streaming the text to stdout and the prompt and generation speed to
// stderr. Model, context, placement and policy flags are moeinfer-bench's (tools/bench/args.h).
// Written on the public C API only, like any user of the library.
#include <unistd.h>

#include <cfloat>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/cli.h"
#include "bench/load_report.h"
#include "bench/open.h"
#include "moeinfer/moeinfer.h"

namespace {

using bench::Failure;

constexpr int32_t kDefaultCtx = 4096;

struct RunConfig {
    bench::Config base;  // model, context, placement and policy: moeinfer-bench's flags
    std::string prompt;
    std::string prompt_file;
    std::string system_prompt;
    int32_t n_predict = 128;
    bool chat = false;
    std::string chat_template;  // a built-in renderer's name; empty: the model's template
    bool interactive = false;
    std::vector<std::string> stop;
    moe_sampler_params sampler{};
};

// moeinfer-bench's options that make sense here: the model, the context, placement and policy, progress.
// Its benchmark modes, warm-up and token seed are not (--seed here is the sampler's).
bool shared_option(const bench::Option& o) {
    static const char* const excluded[] = {"--batch-size", "--no-warmup", "--seed", "--output", "--expert-counts"};
    for (const char* e : excluded) {
        if (o.long_name == e) return false;
    }
    return o.group == "Model" || o.group == "Run (both modes)" || o.group == "Output" ||
           o.group.rfind("Placement", 0) == 0 || o.group.rfind("llama.cpp", 0) == 0;
}

std::vector<bench::Option> make_options(RunConfig& c) {
    std::vector<bench::Option> options;
    for (bench::Option& o : bench::make_options(c.base)) {
        if (!shared_option(o)) continue;
        if (o.group == "Run (both modes)") o.group = "Context";
        if (o.group.rfind("llama.cpp", 0) == 0) o.group = "llama.cpp / ik_llama.cpp flags that moeinfer-run refuses, and why";
        if (o.long_name == "--ctx-size") {
            o.help = "KV cache size in tokens (prompt, conversation and generated text)";
            o.default_text = std::to_string(kDefaultCtx);
        }
        options.push_back(std::move(o));
    }
    auto text_flag = [](std::string& field) -> bench::OptionHandler {
        return [&field](const std::string& v) -> std::optional<std::string> {
            field = v;
            return std::nullopt;
        };
    };
    auto float_flag = [](float& field, double min, double max) -> bench::OptionHandler {
        return [&field, min, max](const std::string& v) -> std::optional<std::string> {
            double d = 0;
            if (auto err = bench::parse_double(v, min, max, false, d)) return err;
            field = static_cast<float>(d);
            return std::nullopt;
        };
    };
    auto switch_flag = [](bool& field) -> bench::OptionHandler {
        return [&field](const std::string&) -> std::optional<std::string> {
            field = true;
            return std::nullopt;
        };
    };
    const std::string gen = "Generation";
    const std::string smp = "Sampling (llama.cpp's flags and defaults; --temp 0 is greedy)";
    moe_sampler_params& s = c.sampler;
    std::vector<bench::Option> own = {
        {"-p", "--prompt", "TEXT", "the prompt (with --chat: the first user message)", "", gen, text_flag(c.prompt)},
        {"-f", "--file", "FILE", "read the prompt from FILE", "", gen, text_flag(c.prompt_file)},
        {"-n", "--n-predict", "N", "most tokens to generate per answer; -1: until an end-of-generation token or a full "
                                   "context", "128", gen,
         [&c](const std::string& v) { return bench::parse_int32(v, -1, INT32_MAX, c.n_predict); }},
        {"-r", "--reverse-prompt", "TEXT", "stop where the text contains TEXT (repeatable)", "none", gen,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return "needs a non-empty text";
             c.stop.push_back(v);
             return std::nullopt;
         }},
        {"", "--chat", "", "apply the model's chat template to the prompt as a user message", "", gen,
         switch_flag(c.chat)},
        {"", "--chat-template", "NAME",
         "a built-in template instead of the model's: chatml, qwen3, gpt-oss, deepseek-v3, deepseek-r1, glm4.5 "
         "(implies --chat)", "the model's tokenizer.chat_template", gen, text_flag(c.chat_template)},
        {"-sys", "--system-prompt", "TEXT", "a system message first (implies --chat)", "", gen,
         text_flag(c.system_prompt)},
        {"-i", "--interactive", "",
         "chat: read user messages from stdin, one per line, until end of input; the conversation is kept and its "
         "prefix in the KV cache reused (implies --chat)", "", gen, switch_flag(c.interactive)},
        {"", "--temp", "T", "temperature; <= 0: greedy", "0.8", smp, float_flag(s.temperature, -FLT_MAX, FLT_MAX)},
        {"", "--top-k", "N", "keep the N most likely tokens; 0: off", "40", smp,
         [&s](const std::string& v) { return bench::parse_int32(v, 0, INT32_MAX, s.top_k); }},
        {"", "--top-p", "P", "nucleus sampling mass in (0, 1]; 1: off", "0.95", smp, float_flag(s.top_p, 0.0, 1.0)},
        {"", "--min-p", "P", "keep tokens at least P times as likely as the best; 0: off", "0.05", smp,
         float_flag(s.min_p, 0.0, 1.0)},
        {"", "--repeat-penalty", "X", "repetition penalty; 1: off", "1.0", smp, float_flag(s.repeat_penalty, 0.0, FLT_MAX)},
        {"", "--repeat-last-n", "N", "tokens the penalties look at; 0: off, -1: all", "64", smp,
         [&s](const std::string& v) { return bench::parse_int32(v, -1, INT32_MAX, s.repeat_last_n); }},
        {"", "--presence-penalty", "X", "presence penalty; 0: off", "0", smp,
         float_flag(s.presence_penalty, -FLT_MAX, FLT_MAX)},
        {"", "--frequency-penalty", "X", "frequency penalty; 0: off", "0", smp,
         float_flag(s.frequency_penalty, -FLT_MAX, FLT_MAX)},
        {"", "--seed", "N", "sampler seed; -1: random (the seed used is printed with --verbose)", "-1", smp,
         [&s](const std::string& v) -> std::optional<std::string> {
             long long seed = 0;
             if (auto err = bench::parse_int(v, -1, LLONG_MAX, seed)) return err;
             s.seed = seed < 0 ? MOE_SAMPLER_SEED_RANDOM : static_cast<uint64_t>(seed);
             return std::nullopt;
         }},
    };
    // Ours first: -p, -n and -r mean what llama.cpp's generation tools mean by them.
    own.insert(own.end(), std::make_move_iterator(options.begin()), std::make_move_iterator(options.end()));
    return own;
}

void print_help(const std::vector<bench::Option>& options) {
    std::printf(
        "usage: moeinfer-run -m MODEL.gguf -p PROMPT [options]\n"
        "       moeinfer-run -m MODEL.gguf --chat -p MESSAGE [options]\n"
        "       moeinfer-run -m MODEL.gguf -i [options]          # chat, messages from stdin\n"
        "\n"
        "Generates text: the answer goes to stdout as it is generated (ending with a newline), the prompt and\n"
        "generation speed to stderr at the end. Without --chat the prompt is tokenized as it is (with the BOS\n"
        "token the model asks for); with --chat it becomes a user message in the chat template.\n");
    bench::print_options(stdout, options);
    std::printf(
        "\nexamples:\n"
        "  moeinfer-run -m model.gguf -p \"The capital of France is\" -n 32 --temp 0\n"
        "  moeinfer-run -m model.gguf --chat -p \"Hello\" -ot exps=CPU\n"
        "  moeinfer-run --synthetic qwen3moe:preset=tiny -i --chat-template chatml   # random weights: noise\n"
        "\nexit status: 0 on success, 1 when the library fails (its message is printed), 2 on bad arguments.\n");
}

std::optional<std::string> finish(RunConfig& c) {
    bench::Config& b = c.base;
    if (!c.chat_template.empty() || !c.system_prompt.empty() || c.interactive) c.chat = true;
    if (!c.prompt.empty() && !c.prompt_file.empty()) return "give either -p or -f, not both";
    if (!c.prompt_file.empty()) {
        std::ifstream in(c.prompt_file, std::ios::binary);
        if (!in) return "-f: cannot read '" + c.prompt_file + "'";
        std::ostringstream text;
        text << in.rdbuf();
        c.prompt = text.str();
    }
    if (c.prompt.empty() && !c.interactive) return "no prompt: give -p TEXT, -f FILE or -i";
    if (c.base.n_ctx == 0) c.base.n_ctx = kDefaultCtx;
    if (b.device == MOE_DEVICE_CPU) {
        for (const std::string& f : bench::device_only_flags()) {
            if (b.given.count(f) > 0) return f + " applies to --device cuda or emulated (a CPU context places nothing)";
        }
    }
    if (!b.model_path.empty() && b.synthetic) return "give either a model path or --synthetic, not both";
    if (b.model_path.empty() && !b.synthetic) return "no model: give a GGUF path (-m PATH) or --synthetic SPEC";
    if (b.synthetic_dir.empty()) {
        const char* tmp = std::getenv("TMPDIR");
        b.synthetic_dir = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
    }
    return std::nullopt;
}

struct SamplerDeleter {
    void operator()(moe_sampler* s) const { moe_sampler_free(s); }
};

int print_piece(const char* text, size_t len, void*) {
    std::fwrite(text, 1, len, stdout);
    std::fflush(stdout);
    return 1;
}

struct Collect {
    std::string text;
};

int print_and_collect(const char* text, size_t len, void* user) {
    static_cast<Collect*>(user)->text.append(text, len);
    return print_piece(text, len, nullptr);
}

std::optional<Failure> tokenize(const moe_model* model, const std::string& text, bool add_special,
                                std::vector<int32_t>& out) {
    int64_t n = 0;
    if (moe_tokenize(model, text.data(), text.size(), add_special, 1, nullptr, 0, &n) != MOE_STATUS_OK) {
        return bench::library_error("cannot tokenize the prompt");
    }
    out.resize(static_cast<size_t>(n));
    if (moe_tokenize(model, text.data(), text.size(), add_special, 1, out.data(), n, &n) != MOE_STATUS_OK) {
        return bench::library_error("cannot tokenize the prompt");
    }
    return std::nullopt;
}

std::optional<Failure> render_chat(const moe_model* model, const RunConfig& c,
                                   const std::vector<std::pair<std::string, std::string>>& turns, std::string& out) {
    std::vector<moe_chat_message> messages;
    for (const auto& [role, content] : turns) messages.push_back({role.c_str(), content.c_str(), nullptr});
    moe_chat_params cp;
    moe_chat_params_init(&cp);
    if (!c.chat_template.empty()) cp.template_name = c.chat_template.c_str();
    int64_t n = 0;
    const auto n_messages = static_cast<int64_t>(messages.size());
    if (moe_chat_apply_template(model, nullptr, messages.data(), n_messages, 1, &cp, nullptr, 0, &n) != MOE_STATUS_OK) {
        return bench::library_error("cannot apply the chat template (--chat-template NAME picks a built-in one)");
    }
    out.resize(static_cast<size_t>(n));
    if (moe_chat_apply_template(model, nullptr, messages.data(), n_messages, 1, &cp, out.data(), n, &n) != MOE_STATUS_OK) {
        return bench::library_error("cannot apply the chat template");
    }
    return std::nullopt;
}

const char* stop_reason_name(int32_t r) {
    switch (r) {
        case MOE_STOP_EOG: return "end of generation";
        case MOE_STOP_STRING: return "stop string";
        case MOE_STOP_CALLBACK: return "stopped";
        case MOE_STOP_CONTEXT_FULL: return "context full";
        default: return "max tokens";
    }
}

void print_speed(const moe_generate_result& r) {
    auto rate = [](int32_t n, double s) { return s > 0 ? n / s : 0.0; };
    std::fprintf(stderr,
                 "moeinfer-run: prompt %d tokens (%d reused) in %.3f s, %.2f t/s | generation %d tokens in %.3f s, "
                 "%.2f t/s | %s\n",
                 r.n_prompt_decoded + r.n_prompt_reused, r.n_prompt_reused, r.t_prompt_s,
                 rate(r.n_prompt_decoded, r.t_prompt_s), r.n_generated, r.t_gen_s, rate(r.n_generated, r.t_gen_s),
                 stop_reason_name(r.stop_reason));
}

std::optional<Failure> run(RunConfig& c) {
    bench::Config& b = c.base;
    const bool live = b.progress.value_or(isatty(STDERR_FILENO) != 0);
    bench::Opened opened;
    if (auto f = bench::open_model_and_context(b, live, "moeinfer-run", opened)) return f;
    moe_model* const model = opened.model.get();
    moe_context* const ctx = opened.ctx.get();
    if (b.verbose) {
        moe_sched_stats stats{};
        stats.struct_size = sizeof stats;
        if (moe_context_get_stats(ctx, &stats) != MOE_STATUS_OK) return bench::library_error("moe_context_get_stats");
        bench::print_load_report(opened.load_times, opened.info.n_bytes, stats);
    }
    moe_sampler* raw_sampler = nullptr;
    if (moe_sampler_create(&c.sampler, opened.info.n_vocab, &raw_sampler) != MOE_STATUS_OK) {
        return bench::library_error("bad sampling flags");
    }
    const std::unique_ptr<moe_sampler, SamplerDeleter> sampler(raw_sampler);
    if (b.verbose) {
        uint64_t seed = 0;
        moe_sampler_get_seed(sampler.get(), &seed);
        std::fprintf(stderr, "moeinfer-run: sampler seed %llu\n", static_cast<unsigned long long>(seed));
    }

    std::vector<const char*> stops;
    for (const std::string& s : c.stop) stops.push_back(s.c_str());
    moe_generate_params gp;
    moe_generate_params_init(&gp);
    gp.max_tokens = c.n_predict < 0 ? INT32_MAX : c.n_predict;
    gp.stop = stops.data();
    gp.n_stop = static_cast<int32_t>(stops.size());

    // One turn: the text to generate after, streamed, with the speed line.
    auto generate = [&](const std::string& text, bool add_special, Collect* answer) -> std::optional<Failure> {
        std::vector<int32_t> ids;
        if (auto f = tokenize(model, text, add_special, ids)) return f;
        if (ids.empty()) return Failure{2, "the prompt has no tokens"};
        gp.on_piece = answer != nullptr ? &print_and_collect : &print_piece;
        gp.user_data = answer;
        moe_generate_result r;
        moe_generate_result_init(&r);
        if (moe_generate(ctx, ids.data(), static_cast<int32_t>(ids.size()), sampler.get(), &gp, &r) != MOE_STATUS_OK) {
            return bench::library_error("generation failed");
        }
        std::fputc('\n', stdout);
        std::fflush(stdout);
        print_speed(r);
        return std::nullopt;
    };

    if (!c.chat) return generate(c.prompt, true, nullptr);

    std::vector<std::pair<std::string, std::string>> turns;
    if (!c.system_prompt.empty()) turns.emplace_back("system", c.system_prompt);
    auto turn = [&](const std::string& user) -> std::optional<Failure> {
        turns.emplace_back("user", user);
        std::string text;
        if (auto f = render_chat(model, c, turns, text)) return f;
        Collect answer;
        if (auto f = generate(text, false, &answer)) return f;
        turns.emplace_back("assistant", answer.text);
        return std::nullopt;
    };
    if (!c.prompt.empty()) {
        if (auto f = turn(c.prompt)) return f;
    }
    if (!c.interactive) return std::nullopt;
    const bool prompt_user = isatty(STDIN_FILENO) != 0;
    std::string line;
    while (true) {
        if (prompt_user) std::fputs("> ", stderr);
        if (!std::getline(std::cin, line)) break;
        if (line.empty()) continue;
        if (auto f = turn(line)) return f;
    }
    return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
    RunConfig cfg;
    moe_sampler_params_init(&cfg.sampler);
    const std::vector<bench::Option> options = make_options(cfg);
    auto positional = [](const std::string& arg) -> std::optional<std::string> {
        return "unexpected argument '" + arg + "' (give the model with -m and the prompt with -p)";
    };
    std::optional<std::string> err = bench::parse_command_line(argc, argv, options, positional, cfg.base.given);
    if (!err && cfg.base.help) {
        print_help(options);
        return 0;
    }
    if (!err) err = finish(cfg);
    if (err) {
        std::fprintf(stderr, "moeinfer-run: %s (see --help)\n", err->c_str());
        return 2;
    }
    if (std::optional<Failure> f = run(cfg)) {
        std::fflush(stdout);
        std::fprintf(stderr, "moeinfer-run: %s\n", f->message.c_str());
        return f->exit_code;
    }
    return 0;
}
