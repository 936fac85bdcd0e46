// GGUF metadata values: the 13 value types, nested arrays, and the bounds that keep a malformed
// file from making us allocate more than it could possibly encode.
#include "core/gguf_metadata.h"

#include <algorithm>
#include <limits>
#include <type_traits>

namespace moe {

const char* gguf_value_type_name(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: return "uint8";
        case GgufValueType::INT8: return "int8";
        case GgufValueType::UINT16: return "uint16";
        case GgufValueType::INT16: return "int16";
        case GgufValueType::UINT32: return "uint32";
        case GgufValueType::INT32: return "int32";
        case GgufValueType::FLOAT32: return "float32";
        case GgufValueType::BOOL: return "bool";
        case GgufValueType::STRING: return "string";
        case GgufValueType::ARRAY: return "array";
        case GgufValueType::UINT64: return "uint64";
        case GgufValueType::INT64: return "int64";
        case GgufValueType::FLOAT64: return "float64";
    }
    return "invalid";
}

bool GgufValue::is_integer() const {
    switch (type) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::BOOL: return true;
        default: return false;
    }
}

uint64_t gguf_min_encoded_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL: return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16: return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32: return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64: return 8;
        case GgufValueType::STRING: return 8;     // u64 length, possibly no bytes
        case GgufValueType::ARRAY: return 4 + 8;  // element type and count, possibly no elements
    }
    return 1;
}

std::string gguf_describe_value_type(const GgufValue& v) {
    if (v.type != GgufValueType::ARRAY) return gguf_value_type_name(v.type);
    return std::string("array of ") + gguf_value_type_name(v.array_type);
}

namespace {

// Unsigned values land in both `u` and (when they fit) `i`; signed ones only in `i`.
template <typename T>
Status read_integer(GgufCursor& c, GgufValue& out, const std::string& field) {
    T x{};
    MOE_RETURN_IF_ERROR(c.read(x, field));
    if constexpr (std::is_signed_v<T>) {
        out.i = static_cast<int64_t>(x);
    } else {
        out.u = static_cast<uint64_t>(x);
        // uint64 values above INT64_MAX are only in `u`; get_int rejects them.
        out.i = out.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(out.u) : 0;
    }
    return Status::ok();
}

Status read_array(GgufCursor& c, GgufValue& out, std::string& field, int depth, uint64_t& values_left) {
    if (depth >= kGgufMaxArrayDepth) {
        return data_corrupt(field + ": arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth) + " levels");
    }
    uint32_t elem_type = 0;
    MOE_RETURN_IF_ERROR(c.read(elem_type, field + ": array element type"));
    if (!gguf_value_type_valid(elem_type)) {
        return data_corrupt(field + ": invalid array element type " + std::to_string(elem_type));
    }
    out.array_type = static_cast<GgufValueType>(elem_type);
    uint64_t count = 0;
    MOE_RETURN_IF_ERROR(c.read(count, field + ": array count"));
    // Bound the count by what the file can hold before allocating anything for it.
    const uint64_t min_size = gguf_min_encoded_size(out.array_type);
    if (count > c.remaining() / min_size) {
        return data_corrupt(field + ": array count " + std::to_string(count) + " of " +
                            gguf_value_type_name(out.array_type) + " needs at least " + std::to_string(min_size) +
                            " bytes each but only " + std::to_string(c.remaining()) + " bytes are left in the file");
    }
    if (count > values_left) {
        return resource_exhausted(field + ": array count " + std::to_string(count) + " exceeds the reader's limit of " +
                                  std::to_string(kGgufMaxMetadataValues) + " metadata values per file");
    }
    // Grow as elements are actually parsed rather than trusting the count for one big allocation.
    out.array.reserve(static_cast<size_t>(std::min<uint64_t>(count, 1 << 16)));
    const size_t base_len = field.size();
    for (uint64_t j = 0; j < count; ++j) {
        field += '[';
        field += std::to_string(j);
        field += ']';
        GgufValue& elem = out.array.emplace_back();
        MOE_RETURN_IF_ERROR(gguf_read_value(c, out.array_type, elem, field, depth + 1, values_left));
        field.resize(base_len);
    }
    return Status::ok();
}

}  // namespace

Status gguf_read_value(GgufCursor& c, GgufValueType type, GgufValue& out, std::string& field, int depth,
                       uint64_t& values_left) {
    if (values_left == 0) {
        return resource_exhausted(field + ": the file holds more than the reader's limit of " +
                                  std::to_string(kGgufMaxMetadataValues) + " metadata values");
    }
    --values_left;
    out.type = type;
    switch (type) {
        case GgufValueType::UINT8: return read_integer<uint8_t>(c, out, field);
        case GgufValueType::INT8: return read_integer<int8_t>(c, out, field);
        case GgufValueType::UINT16: return read_integer<uint16_t>(c, out, field);
        case GgufValueType::INT16: return read_integer<int16_t>(c, out, field);
        case GgufValueType::UINT32: return read_integer<uint32_t>(c, out, field);
        case GgufValueType::INT32: return read_integer<int32_t>(c, out, field);
        case GgufValueType::UINT64: return read_integer<uint64_t>(c, out, field);
        case GgufValueType::INT64: return read_integer<int64_t>(c, out, field);
        case GgufValueType::BOOL: {
            // One byte; like ggml, any non-zero byte is true.
            uint8_t b = 0;
            MOE_RETURN_IF_ERROR(c.read(b, field));
            out.i = b != 0 ? 1 : 0;
            out.u = static_cast<uint64_t>(out.i);
            return Status::ok();
        }
        case GgufValueType::FLOAT32: {
            float x = 0;
            MOE_RETURN_IF_ERROR(c.read(x, field));
            out.f = x;
            return Status::ok();
        }
        case GgufValueType::FLOAT64: return c.read(out.f, field);
        case GgufValueType::STRING: return c.read_string(out.s, field);
        case GgufValueType::ARRAY: return read_array(c, out, field, depth, values_left);
    }
    return internal_error(field + ": gguf_read_value called with invalid type");
}

}  // namespace moe
