// Copies a GGUF file with edits: metadata keys replaced, added or removed, tensors dropped or added.
// For tests that need a model that is valid except for one thing (a bad hyper-parameter, a missing
// or extra layer): start from a synthetic model and change only that.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/gguf.h"
#include "core/gguf_writer.h"

namespace moe::test {

// A metadata value to write; std::monostate removes the key.
using GgufEditValue = std::variant<std::monostate, uint32_t, int32_t, uint64_t, float, double, std::string>;

struct GgufEdit {
    std::map<std::string, GgufEditValue> metadata;          // replaced in place, or appended when absent
    std::function<bool(const std::string&)> drop_tensor;    // tensors to leave out (none when empty)
    std::vector<std::pair<std::string, int64_t>> add_f32;   // appended 1-D F32 tensors of ones: name, length
    struct Tensor {
        std::string name;
        std::vector<int64_t> ne;  // GGUF order
        std::vector<float> data;  // the product of ne values
    };
    std::vector<Tensor> add_tensors;  // appended F32 tensors with their values, after add_f32
};

namespace detail {

inline void put_edit_value(GgufWriter& w, const std::string& key, const GgufEditValue& v) {
    if (const auto* x = std::get_if<uint32_t>(&v)) w.add_uint32(key, *x);
    if (const auto* x = std::get_if<int32_t>(&v)) w.add_int32(key, *x);
    if (const auto* x = std::get_if<uint64_t>(&v)) w.add_uint64(key, *x);
    if (const auto* x = std::get_if<float>(&v)) w.add_float32(key, *x);
    if (const auto* x = std::get_if<double>(&v)) w.add_float64(key, *x);
    if (const auto* x = std::get_if<std::string>(&v)) w.add_string(key, *x);
}

// Appends element `e` of a numeric array of type t, as the file stored it.
inline void put_numeric(std::vector<uint8_t>& out, GgufValueType t, const GgufValue& e) {
    auto push = [&out](auto x) {
        const size_t at = out.size();
        out.resize(at + sizeof x);
        std::memcpy(out.data() + at, &x, sizeof x);
    };
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::BOOL: return push(static_cast<uint8_t>(e.u));
        case GgufValueType::INT8: return push(static_cast<int8_t>(e.i));
        case GgufValueType::UINT16: return push(static_cast<uint16_t>(e.u));
        case GgufValueType::INT16: return push(static_cast<int16_t>(e.i));
        case GgufValueType::UINT32: return push(static_cast<uint32_t>(e.u));
        case GgufValueType::INT32: return push(static_cast<int32_t>(e.i));
        case GgufValueType::UINT64: return push(e.u);
        case GgufValueType::INT64: return push(e.i);
        case GgufValueType::FLOAT32: return push(static_cast<float>(e.f));
        case GgufValueType::FLOAT64: return push(e.f);
        case GgufValueType::STRING:
        case GgufValueType::ARRAY: break;
    }
    FAIL("gguf_edit: element type " << gguf_value_type_name(t) << " is not numeric");
}

// Writes an existing value unchanged (scalars, string arrays and numeric arrays).
inline void copy_value(GgufWriter& w, const std::string& key, const GgufValue& v) {
    switch (v.type) {
        case GgufValueType::UINT8: return w.add_uint8(key, static_cast<uint8_t>(v.u));
        case GgufValueType::INT8: return w.add_int8(key, static_cast<int8_t>(v.i));
        case GgufValueType::UINT16: return w.add_uint16(key, static_cast<uint16_t>(v.u));
        case GgufValueType::INT16: return w.add_int16(key, static_cast<int16_t>(v.i));
        case GgufValueType::UINT32: return w.add_uint32(key, static_cast<uint32_t>(v.u));
        case GgufValueType::INT32: return w.add_int32(key, static_cast<int32_t>(v.i));
        case GgufValueType::UINT64: return w.add_uint64(key, v.u);
        case GgufValueType::INT64: return w.add_int64(key, v.i);
        case GgufValueType::FLOAT32: return w.add_float32(key, static_cast<float>(v.f));
        case GgufValueType::FLOAT64: return w.add_float64(key, v.f);
        case GgufValueType::BOOL: return w.add_bool(key, v.u != 0);
        case GgufValueType::STRING: return w.add_string(key, v.s);
        case GgufValueType::ARRAY: break;
    }
    if (v.array_type == GgufValueType::STRING) {
        std::vector<std::string> s;
        for (const GgufValue& e : v.array) s.push_back(e.s);
        return w.add_string_array(key, s);
    }
    std::vector<uint8_t> bytes;
    for (const GgufValue& e : v.array) put_numeric(bytes, v.array_type, e);
    w.add_array(key, v.array_type, bytes.data(), v.array.size());
}

}  // namespace detail

// Writes `src` with `edit` applied to `dst`; REQUIREs success.
inline void write_edited_gguf(const std::string& src, const std::string& dst, const GgufEdit& edit) {
    StatusOr<std::unique_ptr<GgufFile>> in = GgufFile::open(src);
    REQUIRE(in.is_ok());
    const GgufFile& f = **in;
    GgufWriter w;
    std::map<std::string, GgufEditValue> pending = edit.metadata;
    for (const GgufKV& kv : f.metadata()) {
        auto it = pending.find(kv.key);
        if (it == pending.end()) {
            detail::copy_value(w, kv.key, kv.value);
        } else {
            detail::put_edit_value(w, kv.key, it->second);
            pending.erase(it);
        }
    }
    for (const auto& [key, value] : pending) detail::put_edit_value(w, key, value);

    std::vector<const GgufTensorInfo*> kept;
    for (const GgufTensorInfo& t : f.tensors()) {
        if (edit.drop_tensor && edit.drop_tensor(t.name)) continue;
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne, static_cast<size_t>(t.n_dims)));
        kept.push_back(&t);
    }
    for (const auto& [name, n] : edit.add_f32) w.add_tensor(name, Type::F32, {n});
    for (const GgufEdit::Tensor& t : edit.add_tensors) w.add_tensor(t.name, Type::F32, t.ne);
    const Status begun = w.begin(dst);
    INFO(begun.message());
    REQUIRE(begun.is_ok());
    for (const GgufTensorInfo* t : kept) REQUIRE(w.append(f.tensor_data(*t), t->n_bytes).is_ok());
    for (const auto& [name, n] : edit.add_f32) {
        const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
        REQUIRE(w.append(ones.data(), ones.size() * sizeof(float)).is_ok());
    }
    for (const GgufEdit::Tensor& t : edit.add_tensors) REQUIRE(w.append(t.data.data(), t.data.size() * sizeof(float)).is_ok());
    REQUIRE(w.finish().is_ok());
}

}  // namespace moe::test
