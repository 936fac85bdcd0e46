// Parsing of GGUF metadata values (the 13 value types, nested arrays) for the GGUF reader.
// Internal to lib/core.
#pragma once

#include <cstdint>
#include <string>

#include "core/gguf.h"
#include "core/gguf_cursor.h"

namespace moe {

// Arrays may nest, but real files use at most one level; a deeper bound stops recursion bombs.
inline constexpr int kGgufMaxArrayDepth = 8;

// The most metadata values (scalars plus array elements, all KVs together) one file may hold.
// Each value costs ~100 bytes in memory while a uint8 element costs 1 byte of file, so this caps
// what a small malicious file can make us allocate (~1.6 GB). Real files hold ~1M (a 200k-token
// vocabulary: tokens, token types, merges).
inline constexpr uint64_t kGgufMaxMetadataValues = uint64_t{1} << 24;

inline bool gguf_value_type_valid(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

// Fewest bytes one value of type `t` takes in the file (a string: its length; an array: its
// element type and count). Used to bound counts by the bytes left before allocating.
uint64_t gguf_min_encoded_size(GgufValueType t);

// Reads one value of type `type` into `out`. `field` names the value in error messages
// ("metadata[5] 'general.name'"); elements append "[j]" to it while they are read (it is restored).
// `values_left` is the remaining kGgufMaxMetadataValues budget. `depth` counts enclosing arrays.
// REQUIRES: gguf_value_type_valid(type).
Status gguf_read_value(GgufCursor& cursor, GgufValueType type, GgufValue& out, std::string& field, int depth,
                       uint64_t& values_left);

// "uint32", "array of string", ... for messages.
std::string gguf_describe_value_type(const GgufValue& v);

}  // namespace moe
