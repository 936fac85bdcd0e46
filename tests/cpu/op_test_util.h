// Test-only helpers for the CPU op tests: tensors with their own host memory, strided views, seeded
// random fills. Shapes and strides are set here (not with set_shape) so that I32 tensors work too.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "core/types.h"

namespace moe::test {

inline size_t bytes_per_row(Type type, int64_t n) {
    if (type == Type::I32) return static_cast<size_t>(n) * 4;
    return static_cast<size_t>(row_bytes(type, n));
}

// Owns tensors and their memory; tensors keep stable addresses.
class TensorPool {
public:
    // A contiguous tensor; memory is filled with a 0xA5 pattern (not zero) until written.
    Tensor* make(Type type, std::initializer_list<int64_t> ne) {
        Tensor& t = tensors_.emplace_back();
        t.type = type;
        int d = 0;
        for (int64_t n : ne) t.ne[d++] = n;
        t.nb[0] = type == Type::I32 ? 4 : static_cast<size_t>(traits(type).block_bytes);
        t.nb[1] = bytes_per_row(type, t.ne[0]);
        for (int i = 2; i < 4; ++i) t.nb[i] = t.nb[i - 1] * static_cast<size_t>(t.ne[i - 1]);
        auto& mem = memory_.emplace_back(t.nb[3] * static_cast<size_t>(t.ne[3]) + 64, 0xA5);
        t.data = mem.data();
        return &t;
    }
    // A view of `src` at byte `offset` with its own shape and strides nb[1..3] (nb[0] from src).
    Tensor* view(Tensor* src, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset) {
        Tensor& t = tensors_.emplace_back();
        t.type = src->type;
        int d = 0;
        for (int64_t n : ne) t.ne[d++] = n;
        t.nb[0] = src->nb[0];
        d = 1;
        for (size_t s : nb) t.nb[d++] = s;
        t.data = static_cast<uint8_t*>(src->data) + offset;
        t.view_src = src;
        t.view_offset = offset;
        return &t;
    }
    // A node: dst of `op` with the given sources.
    Tensor* node(Op op, Type type, std::initializer_list<int64_t> ne, std::initializer_list<Tensor*> srcs) {
        Tensor* t = make(type, ne);
        t->op = op;
        int i = 0;
        for (Tensor* s : srcs) t->src[i++] = s;
        return t;
    }

private:
    std::deque<Tensor> tensors_;
    std::deque<std::vector<uint8_t>> memory_;
};

// Seeded from Catch's --rng-seed so that a failure can be replayed.
inline std::mt19937_64 make_rng(uint64_t salt) {
    return std::mt19937_64(Catch::rngSeed() * 0x9E3779B97F4A7C15ull + salt);
}

template <typename T>
T* elem(const Tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    return reinterpret_cast<T*>(t.row(i1, i2, i3) + static_cast<size_t>(i0) * t.nb[0]);
}

inline void fill_uniform(Tensor& t, std::mt19937_64& rng, float lo, float hi) {
    REQUIRE((t.type == Type::F32 || t.type == Type::F16));
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
            for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
                for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) {
                    const float v = u(rng);
                    if (t.type == Type::F32) {
                        *elem<float>(t, i0, i1, i2, i3) = v;
                    } else {
                        *elem<uint16_t>(t, i0, i1, i2, i3) = fp32_to_fp16(v);
                    }
                }
}

// The first values of row (0, 0) of an F32 or F16 tensor: NaN, both zeros, F16 subnormals and the smallest
// normal, a value halfway between two F16s (ties to even), and F16's largest (conversion edge cases).
inline void set_float_edge_values(Tensor& t) {
    REQUIRE((t.type == Type::F32 || t.type == Type::F16));
    const float edge[] = {std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 6.0e-8f, -3.0e-5f, 6.1035156e-5f,
                          1.0f + 0x1p-11f, 65504.0f};
    REQUIRE(t.ne[0] >= static_cast<int64_t>(std::size(edge)));
    for (size_t i = 0; i < std::size(edge); ++i) {
        if (t.type == Type::F32) {
            *elem<float>(t, static_cast<int64_t>(i)) = edge[i];
        } else {
            *elem<uint16_t>(t, static_cast<int64_t>(i)) = fp32_to_fp16(edge[i]);
        }
    }
}

// Element value of an F32 or F16 tensor as double.
inline double value(const Tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    if (t.type == Type::F16) return fp16_to_fp32(*elem<uint16_t>(t, i0, i1, i2, i3));
    return *elem<float>(t, i0, i1, i2, i3);
}

}  // namespace moe::test
