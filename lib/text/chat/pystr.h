// Python str methods the chat templates call, on UTF-8 text, with Python's semantics: strip() with
// no argument removes what str.isspace() calls whitespace (Unicode White_Space plus the ASCII
// separators U+001C..U+001F), split(sep)[0] / [-1] are the text before the first / after the last
// occurrence. Bytes that are not valid UTF-8 are never whitespace.
#pragma once

#include <string_view>

namespace moe::text::chat {

std::string_view py_strip(std::string_view s);
std::string_view py_lstrip_char(std::string_view s, char c);
std::string_view py_rstrip_char(std::string_view s, char c);
inline std::string_view py_strip_char(std::string_view s, char c) { return py_rstrip_char(py_lstrip_char(s, c), c); }

// s.split(sep)[0] and s.split(sep)[-1] (s itself when sep does not occur). REQUIRES: !sep.empty().
std::string_view py_split_first(std::string_view s, std::string_view sep);
std::string_view py_split_last(std::string_view s, std::string_view sep);

inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

}  // namespace moe::text::chat
