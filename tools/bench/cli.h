// A small table-driven command-line parser for moeinfer-bench.
//
// Each flag is one row of a table (names, value name, help, default, handler), so a new flag is one
// new row: the parser, the help text and the "flag given twice" bookkeeping need no other change.
// Flags are matched whole ("-ub" is one flag, not "-u -b"), as in llama.cpp's tools, and accept
// their value either as the next argument or after '=' ("--threads 8", "--threads=8").
#ifndef MOEINFER_TOOLS_BENCH_CLI_H
#define MOEINFER_TOOLS_BENCH_CLI_H

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moeinfer/moeinfer.h"

namespace bench {

// A failure that ends the program: code 2 for bad input (usage), 1 for a library error.
struct Failure {
    int exit_code;
    std::string message;
};

inline Failure usage_error(std::string message) { return Failure{2, std::move(message)}; }

// For a failed moe_ call: `what` plus the library's own message. Call it right after the call,
// before any other moe_ call replaces moe_last_error().
inline Failure library_error(const std::string& what) {
    const char* detail = moe_last_error();
    return Failure{1, what + (detail != nullptr && detail[0] != '\0' ? ": " + std::string(detail) : std::string())};
}

// Handlers get the flag's value ("" for switches) and return an error message, or nothing.
using OptionHandler = std::function<std::optional<std::string>(const std::string& value)>;

struct Option {
    std::string short_name;    // "-t", "-ub"; empty when the flag has no short form
    std::string long_name;     // "--threads"; every option has one (it identifies the option)
    std::string value_name;    // "N", "LIST"; empty for a switch
    std::string help;          // one sentence or two; wrapped when printed
    std::string default_text;  // printed as "(default: ...)"; empty prints nothing
    std::string group;         // help section the option is listed under
    OptionHandler apply;
};

// Long names of the options the user gave, to tell "left at its default" from "asked for".
using GivenSet = std::set<std::string>;

// Parses argv against `options`; non-flag arguments go to `positional`. Returns an error message
// naming the offending argument. `given` receives the long names of the options seen.
inline std::optional<std::string> parse_command_line(int argc, char** argv, const std::vector<Option>& options,
                                                     const std::function<std::optional<std::string>(const std::string&)>& positional,
                                                     GivenSet& given) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg.size() < 2 || arg[0] != '-') {
            if (auto err = positional(arg)) return err;
            continue;
        }
        std::string name = arg;
        std::optional<std::string> inline_value;
        if (arg.rfind("--", 0) == 0) {
            const size_t eq = arg.find('=');
            if (eq != std::string::npos) {
                name = arg.substr(0, eq);
                inline_value = arg.substr(eq + 1);
            }
        }
        const Option* opt = nullptr;
        for (const Option& o : options) {
            if (name == o.long_name || (!o.short_name.empty() && name == o.short_name)) {
                opt = &o;
                break;
            }
        }
        if (opt == nullptr) return "unknown option '" + name + "'";  // main() adds "(see --help)" to every error
        std::string value;
        if (opt->value_name.empty()) {
            if (inline_value) return "option " + opt->long_name + " takes no value";
        } else if (inline_value) {
            value = *inline_value;
        } else {
            if (i + 1 >= argc) return "option " + name + " needs a value (" + opt->value_name + ")";
            value = argv[++i];
        }
        if (auto err = opt->apply(value)) return name + ": " + *err;
        given.insert(opt->long_name);
    }
    return std::nullopt;
}

// Prints `text` wrapped at `width` columns, continuation lines indented by `indent`.
inline void print_wrapped(FILE* out, const std::string& text, size_t first_col, size_t indent, size_t width) {
    size_t col = first_col;
    size_t pos = 0;
    bool first_word = true;
    while (pos < text.size()) {
        size_t end = text.find(' ', pos);
        if (end == std::string::npos) end = text.size();
        const std::string word = text.substr(pos, end - pos);
        pos = end + 1;
        if (word.empty()) continue;
        if (!first_word && col + 1 + word.size() > width) {
            std::fprintf(out, "\n%*s", static_cast<int>(indent), "");
            col = indent;
        } else if (!first_word) {
            std::fputc(' ', out);
            ++col;
        }
        std::fputs(word.c_str(), out);
        col += word.size();
        first_word = false;
    }
    std::fputc('\n', out);
}

// Prints the options grouped by section, in table order, each with its default.
inline void print_options(FILE* out, const std::vector<Option>& options) {
    constexpr size_t kHelpCol = 30;
    constexpr size_t kWidth = 100;
    std::vector<std::string> groups;
    for (const Option& o : options) {
        bool seen = false;
        for (const std::string& g : groups) seen = seen || g == o.group;
        if (!seen) groups.push_back(o.group);
    }
    for (const std::string& g : groups) {
        std::fprintf(out, "\n%s:\n", g.c_str());
        for (const Option& o : options) {
            if (o.group != g) continue;
            std::string names = "  " + (o.short_name.empty() ? std::string("    ") : o.short_name + ", ") + o.long_name;
            if (!o.value_name.empty()) names += " " + o.value_name;
            std::string help = o.help;
            if (!o.default_text.empty()) help += " (default: " + o.default_text + ")";
            if (names.size() + 2 > kHelpCol) {
                std::fprintf(out, "%s\n%*s", names.c_str(), static_cast<int>(kHelpCol), "");
            } else {
                std::fprintf(out, "%-*s", static_cast<int>(kHelpCol), names.c_str());
            }
            print_wrapped(out, help, kHelpCol, kHelpCol, kWidth);
        }
    }
}

// ---- value parsers: each returns an error message naming what was expected ----

// A whole decimal integer in [min, max].
inline std::optional<std::string> parse_int(const std::string& text, long long min, long long max, long long& out) {
    if (text.empty()) return "expected an integer, got an empty value";
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0') return "expected an integer, got '" + text + "'";
    if (errno == ERANGE || v < min || v > max) {
        return "value " + text + " out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    }
    out = v;
    return std::nullopt;
}

inline std::optional<std::string> parse_int32(const std::string& text, int32_t min, int32_t max, int32_t& out) {
    long long v = 0;
    if (auto err = parse_int(text, min, max, v)) return err;
    out = static_cast<int32_t>(v);
    return std::nullopt;
}

// "512" or "512,1024,2048": comma-separated integers in [min, max].
inline std::optional<std::string> parse_int_list(const std::string& text, int32_t min, int32_t max,
                                                 std::vector<int32_t>& out) {
    std::vector<int32_t> values;
    size_t pos = 0;
    while (true) {
        const size_t comma = text.find(',', pos);
        const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        int32_t v = 0;
        if (auto err = parse_int32(item, min, max, v)) return "in list '" + text + "': " + *err;
        values.push_back(v);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    out = std::move(values);
    return std::nullopt;
}

// A finite decimal number in [min, max) (max excluded when max_exclusive).
inline std::optional<std::string> parse_double(const std::string& text, double min, double max, bool max_exclusive,
                                               double& out) {
    if (text.empty()) return "expected a number, got an empty value";
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || errno == ERANGE || !(v == v)) {
        return "expected a number, got '" + text + "'";
    }
    if (v < min || v > max || (max_exclusive && v == max)) {
        char range[96];
        std::snprintf(range, sizeof range, "[%g, %g%c", min, max, max_exclusive ? ')' : ']');
        return "value " + text + " out of range " + range;
    }
    out = v;
    return std::nullopt;
}

// A byte count: a non-negative number with an optional unit ("4000000", "8G", "1.5GiB", "512MiB"). K, M,
// G, T (also KB, MB, GB, TB) are powers of 1000; KiB, MiB, GiB, TiB powers of 1024; B is 1. Units are
// case-insensitive; a fractional value is rounded to the nearest byte.
inline std::optional<std::string> parse_size(const std::string& text, uint64_t& out) {
    struct Unit {
        const char* name;
        uint64_t bytes;
    };
    static const Unit units[] = {{"", 1},
                                 {"b", 1},
                                 {"k", 1000ull},
                                 {"kb", 1000ull},
                                 {"m", 1000000ull},
                                 {"mb", 1000000ull},
                                 {"g", 1000000000ull},
                                 {"gb", 1000000000ull},
                                 {"t", 1000000000000ull},
                                 {"tb", 1000000000000ull},
                                 {"kib", 1ull << 10},
                                 {"mib", 1ull << 20},
                                 {"gib", 1ull << 30},
                                 {"tib", 1ull << 40}};
    const std::string expected = "expected a byte count such as 4000000, 512MiB, 1.5GiB or 8G, got '" + text + "'";
    size_t digits = 0;
    size_t dots = 0;
    while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
        dots += text[digits] == '.' ? 1 : 0;
        ++digits;
    }
    const std::string number = text.substr(0, digits);
    if (number.empty() || number == "." || dots > 1) return expected;
    std::string unit = text.substr(digits);
    for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const Unit* u = nullptr;
    for (const Unit& candidate : units) {
        if (unit == candidate.name) u = &candidate;
    }
    if (u == nullptr) return "unknown unit '" + text.substr(digits) + "' in '" + text + "' (B, K, M, G, T, KiB, MiB, GiB, TiB)";
    const std::string too_large = "value " + text + " exceeds 2^64 - 1 bytes";
    if (dots == 0) {
        errno = 0;
        const unsigned long long v = std::strtoull(number.c_str(), nullptr, 10);
        uint64_t bytes = 0;
        if (errno == ERANGE || __builtin_mul_overflow(static_cast<uint64_t>(v), u->bytes, &bytes)) return too_large;
        out = bytes;
        return std::nullopt;
    }
    const long double v = std::strtold(number.c_str(), nullptr) * static_cast<long double>(u->bytes);
    if (!(v < 18446744073709551615.0L)) return too_large;
    out = static_cast<uint64_t>(v + 0.5L);
    return std::nullopt;
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_CLI_H
