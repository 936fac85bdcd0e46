// GGUF reader: random valid files (v2 and v3, every metadata type, nested arrays, every supported
// tensor type, random alignment and data placement) are written by a test-only byte builder and
// read back through from_memory, open(use_mmap=true) and open(use_mmap=false); every value, shape,
// offset and data byte must match. Also: every truncation and random byte mutations of a valid file
// fail cleanly, file-system errors, typed look-ups.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/gguf.h"

namespace {

using moe::GgufFile;
using moe::GgufValue;
using moe::GgufValueType;
using VT = GgufValueType;

// ---- a tiny GGUF byte builder (test-only; independent of the library's writer) ----

class Bytes {
public:
    template <typename T>
    void put(T v) {
        uint8_t b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));
        buf.insert(buf.end(), b, b + sizeof(T));
    }
    void str(const std::string& s) {
        put<uint64_t>(s.size());
        buf.insert(buf.end(), s.begin(), s.end());
    }
    void pad_to(uint64_t alignment) {
        while (buf.size() % alignment != 0) buf.push_back(0);
    }
    std::vector<uint8_t> buf;
};

// The encoding of a value (without its type tag), as the spec lays it out.
void put_value(Bytes& b, const GgufValue& v) {
    switch (v.type) {
        case VT::UINT8: b.put<uint8_t>(static_cast<uint8_t>(v.u)); break;
        case VT::INT8: b.put<int8_t>(static_cast<int8_t>(v.i)); break;
        case VT::UINT16: b.put<uint16_t>(static_cast<uint16_t>(v.u)); break;
        case VT::INT16: b.put<int16_t>(static_cast<int16_t>(v.i)); break;
        case VT::UINT32: b.put<uint32_t>(static_cast<uint32_t>(v.u)); break;
        case VT::INT32: b.put<int32_t>(static_cast<int32_t>(v.i)); break;
        case VT::UINT64: b.put<uint64_t>(v.u); break;
        case VT::INT64: b.put<int64_t>(v.i); break;
        case VT::FLOAT32: b.put<float>(static_cast<float>(v.f)); break;
        case VT::FLOAT64: b.put<double>(v.f); break;
        case VT::BOOL: b.put<uint8_t>(v.i ? 1 : 0); break;
        case VT::STRING: b.str(v.s); break;
        case VT::ARRAY:
            b.put<uint32_t>(static_cast<uint32_t>(v.array_type));
            b.put<uint64_t>(v.array.size());
            for (const GgufValue& e : v.array) put_value(b, e);
            break;
    }
}

// ---- random metadata with the values the reader must give back ----

struct Rng {
    std::mt19937_64 gen;
    uint64_t bits() { return gen(); }
    int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
};

std::string random_string(Rng& r, int max_len) {
    std::string s(static_cast<size_t>(r.range(0, max_len)), '\0');
    for (char& c : s) c = static_cast<char>(r.range(0, 255));  // any bytes: UTF-8 is not checked
    return s;
}

// Unsigned values are expected in `u` and, when they fit, in `i`; signed ones in `i`.
GgufValue random_value(Rng& r, VT type, int depth) {
    GgufValue v;
    v.type = type;
    auto set_unsigned = [&](uint64_t x) {
        v.u = x;
        v.i = x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(x) : 0;
    };
    switch (type) {
        case VT::UINT8: set_unsigned(r.bits() & 0xff); break;
        case VT::UINT16: set_unsigned(r.bits() & 0xffff); break;
        case VT::UINT32: set_unsigned(r.bits() & 0xffffffff); break;
        case VT::UINT64: set_unsigned(r.bits() | (r.range(0, 1) ? (uint64_t{1} << 63) : 0)); break;
        case VT::INT8: v.i = static_cast<int8_t>(r.bits()); break;
        case VT::INT16: v.i = static_cast<int16_t>(r.bits()); break;
        case VT::INT32: v.i = static_cast<int32_t>(r.bits()); break;
        case VT::INT64: v.i = static_cast<int64_t>(r.bits()); break;
        case VT::BOOL: v.i = r.range(0, 1); v.u = static_cast<uint64_t>(v.i); break;
        // Random mantissas and exponents that the type represents exactly.
        case VT::FLOAT32:
            v.f = static_cast<float>(std::ldexp(r.range(-1000000, 1000000), static_cast<int>(r.range(-40, 40))));
            break;
        case VT::FLOAT64:
            v.f = std::ldexp(static_cast<double>(r.range(-(int64_t{1} << 52), int64_t{1} << 52)),
                             static_cast<int>(r.range(-300, 300)));
            break;
        case VT::STRING: v.s = random_string(r, 40); break;
        case VT::ARRAY: {
            v.array_type = static_cast<VT>(r.range(0, depth >= 2 ? 8 : 12));
            if (v.array_type == VT::ARRAY && depth >= 2) v.array_type = VT::STRING;
            const int64_t n = r.range(0, 20);
            for (int64_t k = 0; k < n; ++k) v.array.push_back(random_value(r, v.array_type, depth + 1));
            break;
        }
    }
    return v;
}

void check_value(const GgufValue& want, const GgufValue& got, const std::string& where) {
    INFO(where);
    REQUIRE(got.type == want.type);
    switch (want.type) {
        case VT::UINT8: case VT::UINT16: case VT::UINT32: case VT::UINT64: case VT::BOOL:
            CHECK(got.u == want.u);
            CHECK(got.i == want.i);
            break;
        case VT::INT8: case VT::INT16: case VT::INT32: case VT::INT64: CHECK(got.i == want.i); break;
        case VT::FLOAT32: case VT::FLOAT64: CHECK(got.f == want.f); break;  // exact: both are representable
        case VT::STRING: CHECK(got.s == want.s); break;
        case VT::ARRAY:
            REQUIRE(got.array_type == want.array_type);
            REQUIRE(got.array.size() == want.array.size());
            for (size_t k = 0; k < want.array.size(); ++k) {
                check_value(want.array[k], got.array[k], where + "[" + std::to_string(k) + "]");
            }
            break;
    }
}

// ---- random tensors ----

// Block sizes and bytes per block of every GGUF type, runnable or not: gguf-py's GGML_QUANT_SIZES
// (independent of types.cpp), except Q8_1: 36 bytes as ggml's block_q8_1 (gguf-py's 40 is out of date).
struct TypeRef {
    int32_t id;
    int64_t block;
    int64_t bytes;
};
constexpr TypeRef kTypes[] = {
    {0, 1, 4},      {1, 1, 2},      {2, 32, 18},    {3, 32, 20},    {6, 32, 22},    {7, 32, 24},    {8, 32, 34},
    {9, 32, 36},    {10, 256, 84},  {11, 256, 110}, {12, 256, 144}, {13, 256, 176}, {14, 256, 210}, {15, 256, 292},
    {16, 256, 66},  {17, 256, 74},  {18, 256, 98},  {19, 256, 50},  {20, 32, 18},   {21, 256, 110}, {22, 256, 82},
    {23, 256, 136}, {24, 1, 1},     {25, 1, 2},     {26, 1, 4},     {27, 1, 8},     {28, 1, 8},     {29, 256, 56},
    {30, 1, 2},     {34, 256, 54},  {35, 256, 66},  {39, 32, 17},   {40, 64, 36},   {41, 128, 18},
};

struct TensorSpec {
    std::string name;
    TypeRef type;
    int n_dims;
    int64_t ne[4];
    uint64_t offset;
    uint64_t n_bytes;
    std::vector<uint8_t> data;
};

struct Model {
    uint32_t version = 3;
    uint64_t alignment = 32;
    std::vector<std::pair<std::string, GgufValue>> kvs;
    std::vector<TensorSpec> tensors;
    uint64_t data_offset = 0;
    std::vector<uint8_t> file;
};

Model random_model(uint64_t seed, uint32_t version) {
    Rng r{std::mt19937_64(seed)};
    Model m;
    m.version = version;
    static constexpr uint64_t kAlignments[] = {1, 8, 16, 32, 64, 256};
    m.alignment = kAlignments[r.range(0, 5)];
    const bool write_alignment_key = m.alignment != 32 || r.range(0, 1);

    // Metadata: every type at least once, then random ones; keys are unique.
    if (write_alignment_key) {
        GgufValue a;
        a.type = VT::UINT32;
        a.u = m.alignment;
        a.i = static_cast<int64_t>(m.alignment);
        m.kvs.emplace_back("general.alignment", a);
    }
    const int n_random = static_cast<int>(r.range(0, 12));
    for (int k = 0; k < 13 + n_random; ++k) {
        const VT t = k < 13 ? static_cast<VT>(k) : static_cast<VT>(r.range(0, 12));
        m.kvs.emplace_back("test.key" + std::to_string(k) + "." + moe::gguf_value_type_name(t), random_value(r, t, 0));
    }
    std::shuffle(m.kvs.begin(), m.kvs.end(), r.gen);

    // Tensors: random type and shape (sometimes empty), data placed in a random order with gaps.
    const int n_tensors = static_cast<int>(r.range(1, 8));
    for (int k = 0; k < n_tensors; ++k) {
        TensorSpec t;
        t.name = "blk." + std::to_string(k) + ".w" + random_string(r, 6);
        t.type = kTypes[r.range(0, static_cast<int64_t>(std::size(kTypes)) - 1)];
        t.n_dims = static_cast<int>(r.range(0, 4));
        for (int64_t& d : t.ne) d = 1;
        for (int d = 0; d < t.n_dims; ++d) t.ne[d] = r.range(1, 5);
        if (t.n_dims > 0) t.ne[0] *= t.type.block;
        if (t.n_dims == 0 && t.type.block != 1) t.type = kTypes[0];  // a scalar cannot hold a block
        if (t.n_dims > 1 && r.range(0, 9) == 0) t.ne[t.n_dims - 1] = 0;  // an empty tensor
        t.n_bytes = static_cast<uint64_t>(t.ne[0] / t.type.block * t.type.bytes * t.ne[1] * t.ne[2] * t.ne[3]);
        t.data.resize(t.n_bytes);
        for (uint8_t& b : t.data) b = static_cast<uint8_t>(r.bits());
        m.tensors.push_back(std::move(t));
    }
    std::vector<size_t> order(m.tensors.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), r.gen);
    uint64_t off = 0;
    for (size_t k : order) {
        off += static_cast<uint64_t>(r.range(0, 2)) * m.alignment;  // a gap
        m.tensors[k].offset = off;
        off += (m.tensors[k].n_bytes + m.alignment - 1) / m.alignment * m.alignment;
    }
    // The file ends right after the last tensor's bytes, unpadded, when that tensor is not empty.
    uint64_t data_size = 0;
    for (const TensorSpec& t : m.tensors) data_size = std::max(data_size, t.offset + t.n_bytes);

    Bytes b;
    b.buf = {'G', 'G', 'U', 'F'};
    b.put<uint32_t>(version);
    b.put<uint64_t>(m.tensors.size());
    b.put<uint64_t>(m.kvs.size());
    for (const auto& [key, v] : m.kvs) {
        b.str(key);
        b.put<uint32_t>(static_cast<uint32_t>(v.type));
        put_value(b, v);
    }
    for (const TensorSpec& t : m.tensors) {
        b.str(t.name);
        b.put<uint32_t>(static_cast<uint32_t>(t.n_dims));
        for (int d = 0; d < t.n_dims; ++d) b.put<uint64_t>(static_cast<uint64_t>(t.ne[d]));
        b.put<uint32_t>(static_cast<uint32_t>(t.type.id));
        b.put<uint64_t>(t.offset);
    }
    b.pad_to(m.alignment);
    m.data_offset = b.buf.size();
    b.buf.resize(m.data_offset + data_size, 0xAB);  // gaps hold a filler byte, not zeros
    for (const TensorSpec& t : m.tensors) {
        std::copy(t.data.begin(), t.data.end(), b.buf.begin() + static_cast<std::ptrdiff_t>(m.data_offset + t.offset));
    }
    m.file = std::move(b.buf);
    return m;
}

void check_model(const Model& m, const GgufFile& f) {
    CHECK(f.version() == m.version);
    CHECK(f.alignment() == m.alignment);
    CHECK(f.data_offset() == m.data_offset);
    CHECK(f.file_size() == m.file.size());
    REQUIRE(f.metadata().size() == m.kvs.size());
    for (size_t k = 0; k < m.kvs.size(); ++k) {
        CHECK(f.metadata()[k].key == m.kvs[k].first);
        check_value(m.kvs[k].second, f.metadata()[k].value, "metadata " + m.kvs[k].first);
        const GgufValue* found = f.find(m.kvs[k].first);
        CHECK(found == &f.metadata()[k].value);
    }
    REQUIRE(f.tensors().size() == m.tensors.size());
    for (size_t k = 0; k < m.tensors.size(); ++k) {
        const TensorSpec& want = m.tensors[k];
        const moe::GgufTensorInfo& got = f.tensors()[k];
        INFO("tensor " << k);
        CHECK(got.name == want.name);
        CHECK(static_cast<int32_t>(got.type) == want.type.id);
        CHECK(got.n_dims == want.n_dims);
        for (int d = 0; d < 4; ++d) CHECK(got.ne[d] == want.ne[d]);
        CHECK(got.offset == want.offset);
        CHECK(got.file_offset == m.data_offset + want.offset);
        CHECK(got.file_offset % m.alignment == 0);
        CHECK(got.n_bytes == want.n_bytes);
        // std::equal, not memcmp: an empty tensor's data() is null, which memcmp may not be given even for 0 bytes.
        REQUIRE(want.data.size() == want.n_bytes);
        CHECK(std::equal(want.data.begin(), want.data.end(), f.tensor_data(got)));
        CHECK(f.find_tensor(want.name) == &got);
        CHECK(f.tensor_index(want.name) == static_cast<int64_t>(k));
    }
    CHECK(f.find("no.such.key") == nullptr);
    CHECK(f.find_tensor("no.such.tensor") == nullptr);
    CHECK(f.tensor_index("no.such.tensor") == -1);
}

std::string tmp_path(const std::string& name) { return std::string(MOE_TEST_TMP_DIR) + "/" + name; }

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

}  // namespace

TEST_CASE("gguf: random valid v2 and v3 files read back exactly from memory and from disk", "[gguf]") {
    for (uint32_t version : {2u, 3u}) {
        for (uint64_t seed = 1; seed <= 25; ++seed) {
            const Model m = random_model(seed * 7919 + version, version);
            INFO("version " << version << " seed " << seed << " alignment " << m.alignment);
            auto mem = GgufFile::from_memory(m.file.data(), m.file.size());
            REQUIRE(mem.is_ok());
            check_model(m, **mem);

            const std::string path =
                tmp_path("test_gguf_v" + std::to_string(version) + "_" + std::to_string(seed) + ".gguf");
            write_file(path, m.file);
            for (bool use_mmap : {true, false}) {
                INFO("use_mmap " << use_mmap);
                auto f = GgufFile::open(path, use_mmap);
                REQUIRE(f.is_ok());
                check_model(m, **f);
            }
            std::remove(path.c_str());
        }
    }
}

TEST_CASE("gguf: every truncation of a valid file is DATA_CORRUPT", "[gguf]") {
    // A file whose last byte belongs to a tensor, so that no strict prefix is a valid file.
    Model m;
    for (uint64_t seed = 424242;; ++seed) {
        m = random_model(seed, 3);
        bool ends_in_tensor = false;
        for (const TensorSpec& t : m.tensors) {
            ends_in_tensor |= t.n_bytes > 0 && m.data_offset + t.offset + t.n_bytes == m.file.size();
        }
        if (ends_in_tensor) break;
    }
    for (size_t len = 0; len < m.file.size(); ++len) {
        std::vector<uint8_t> prefix(m.file.begin(), m.file.begin() + static_cast<std::ptrdiff_t>(len));
        auto f = GgufFile::from_memory(prefix.data(), prefix.size());
        INFO("length " << len);
        REQUIRE_FALSE(f.is_ok());
        CHECK(f.status().code() == MOE_STATUS_DATA_CORRUPT);
        CHECK_FALSE(f.status().message().empty());
    }
}

TEST_CASE("gguf: random byte mutations never crash and always explain a failure", "[gguf]") {
    const Model m = random_model(99, 3);
    std::mt19937_64 gen(12345);
    int n_ok = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::vector<uint8_t> bytes = m.file;
        const int n_flips = 1 + static_cast<int>(gen() % 4);
        for (int k = 0; k < n_flips; ++k) {
            // Mostly in the header/metadata/infos, where the structure lives.
            const size_t pos = gen() % std::min<size_t>(bytes.size(), m.data_offset + 8);
            bytes[pos] = static_cast<uint8_t>(gen());
        }
        auto f = GgufFile::from_memory(bytes.data(), bytes.size());
        if (f.is_ok()) {
            ++n_ok;
            for (const auto& t : (*f)->tensors()) {
                REQUIRE(t.file_offset + t.n_bytes <= bytes.size());
            }
        } else {
            const moe_status c = f.status().code();
            CHECK((c == MOE_STATUS_DATA_CORRUPT || c == MOE_STATUS_UNIMPLEMENTED));
            CHECK_FALSE(f.status().message().empty());
        }
    }
    CHECK(n_ok < 3000);
}

TEST_CASE("gguf: open() reports file-system errors", "[gguf]") {
    auto missing = GgufFile::open(tmp_path("does_not_exist.gguf"));
    REQUIRE_FALSE(missing.is_ok());
    CHECK(missing.status().code() == MOE_STATUS_NOT_FOUND);
    CHECK_THAT(missing.status().message(), Catch::Contains("does_not_exist.gguf"));

    for (bool use_mmap : {true, false}) {
        auto dir = GgufFile::open(MOE_TEST_TMP_DIR, use_mmap);
        REQUIRE_FALSE(dir.is_ok());
        CHECK(dir.status().code() == MOE_STATUS_IO_ERROR);

        const std::string empty = tmp_path("test_gguf_empty.gguf");
        write_file(empty, {});
        auto e = GgufFile::open(empty, use_mmap);
        REQUIRE_FALSE(e.is_ok());
        CHECK(e.status().code() == MOE_STATUS_DATA_CORRUPT);
        CHECK_THAT(e.status().message(), Catch::Contains("file too small for a GGUF header"));
        std::remove(empty.c_str());
    }

    auto null_buf = GgufFile::from_memory(nullptr, 10);
    REQUIRE_FALSE(null_buf.is_ok());
    CHECK(null_buf.status().code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("gguf: typed metadata look-ups", "[gguf]") {
    Bytes b;
    b.buf = {'G', 'G', 'U', 'F'};
    b.put<uint32_t>(3);
    b.put<uint64_t>(0);
    b.put<uint64_t>(6);
    b.str("a.u32"); b.put<uint32_t>(4); b.put<uint32_t>(4000000000u);
    b.str("a.i8"); b.put<uint32_t>(1); b.put<int8_t>(-7);
    b.str("a.f32"); b.put<uint32_t>(6); b.put<float>(0.25f);
    b.str("a.big"); b.put<uint32_t>(10); b.put<uint64_t>(~uint64_t{0});
    b.str("a.name"); b.put<uint32_t>(8); b.str("qwen3moe");
    b.str("a.arr"); b.put<uint32_t>(9); b.put<uint32_t>(5); b.put<uint64_t>(2); b.put<int32_t>(1); b.put<int32_t>(-2);
    auto fo = GgufFile::from_memory(b.buf.data(), b.buf.size());
    REQUIRE(fo.is_ok());
    const GgufFile& f = **fo;

    CHECK(f.get_int("a.u32").value() == 4000000000LL);
    CHECK(f.get_int("a.i8").value() == -7);
    CHECK(f.get_float("a.f32").value() == 0.25);
    CHECK(f.get_float("a.i8").value() == -7.0);  // integers are accepted as floats
    CHECK(f.get_float("a.big").value() == 18446744073709551615.0);
    CHECK(f.get_string("a.name").value() == "qwen3moe");
    CHECK(f.find("a.big")->u == ~uint64_t{0});
    const GgufValue* arr = f.find("a.arr");
    REQUIRE(arr != nullptr);
    REQUIRE(arr->array.size() == 2);
    CHECK(arr->array[1].i == -2);

    CHECK(f.get_int("a.missing").status().code() == MOE_STATUS_NOT_FOUND);
    CHECK(f.get_float("a.missing").status().code() == MOE_STATUS_NOT_FOUND);
    CHECK(f.get_string("a.missing").status().code() == MOE_STATUS_NOT_FOUND);
    CHECK(f.get_int("a.f32").status().code() == MOE_STATUS_DATA_CORRUPT);
    CHECK_THAT(f.get_int("a.f32").status().message(), Catch::Contains("'a.f32'") && Catch::Contains("float32"));
    CHECK(f.get_int("a.big").status().code() == MOE_STATUS_DATA_CORRUPT);
    CHECK(f.get_string("a.u32").status().code() == MOE_STATUS_DATA_CORRUPT);
    CHECK_THAT(f.get_float("a.arr").status().message(), Catch::Contains("array of int32"));
    CHECK(f.alignment() == 32);
    CHECK(f.tensors().empty());
}
