// GGUF writer: random files (every metadata value type, string and numeric arrays, every tensor type,
// 1-4 dims, data appended in random pieces) are read back by the independent reader (core/gguf.h)
// and must match value for value and byte for byte. Also: declaration errors, wrong byte counts,
// unwritable paths and a full device (/dev/full) must fail with a named error, never a short file.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/gguf_writer.h"
#include "core/types.h"

namespace {

using moe::GgufFile;
using moe::GgufValue;
using moe::GgufValueType;
using moe::GgufWriter;
using moe::Type;
using VT = GgufValueType;

std::string tmp_path(const std::string& name) { return std::string(MOE_TEST_TMP_DIR) + "/writer_" + name; }

bool file_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

// What the test wrote, to compare with what the reader finds.
struct ExpectedKV {
    std::string key;
    VT type;
    VT elem = VT::UINT8;
    std::vector<uint64_t> u;   // unsigned integers and bools
    std::vector<int64_t> i;    // signed integers
    std::vector<double> f;     // floats
    std::vector<std::string> s;
};

struct ExpectedTensor {
    std::string name;
    Type type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
};

bool is_unsigned(VT t) { return t == VT::UINT8 || t == VT::UINT16 || t == VT::UINT32 || t == VT::UINT64 || t == VT::BOOL; }
bool is_signed(VT t) { return t == VT::INT8 || t == VT::INT16 || t == VT::INT32 || t == VT::INT64; }

// One random numeric value of type t, stored as the test will compare it, and its bytes.
void random_numeric(std::mt19937_64& rng, VT t, ExpectedKV& e, std::vector<uint8_t>& bytes) {
    auto push = [&](const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        bytes.insert(bytes.end(), b, b + n);
    };
    const uint64_t r = rng();
    switch (t) {
        case VT::UINT8: { uint8_t v = static_cast<uint8_t>(r); push(&v, 1); e.u.push_back(v); break; }
        case VT::INT8: { int8_t v = static_cast<int8_t>(r); push(&v, 1); e.i.push_back(v); break; }
        case VT::UINT16: { uint16_t v = static_cast<uint16_t>(r); push(&v, 2); e.u.push_back(v); break; }
        case VT::INT16: { int16_t v = static_cast<int16_t>(r); push(&v, 2); e.i.push_back(v); break; }
        case VT::UINT32: { uint32_t v = static_cast<uint32_t>(r); push(&v, 4); e.u.push_back(v); break; }
        case VT::INT32: { int32_t v = static_cast<int32_t>(r); push(&v, 4); e.i.push_back(v); break; }
        case VT::UINT64: { uint64_t v = r; push(&v, 8); e.u.push_back(v); break; }
        case VT::INT64: { int64_t v = static_cast<int64_t>(r); push(&v, 8); e.i.push_back(v); break; }
        case VT::BOOL: { uint8_t v = r & 1; push(&v, 1); e.u.push_back(v); break; }
        case VT::FLOAT32: {
            float v = std::uniform_real_distribution<float>(-1e6f, 1e6f)(rng);
            push(&v, 4);
            e.f.push_back(v);
            break;
        }
        case VT::FLOAT64: {
            double v = std::uniform_real_distribution<double>(-1e300, 1e300)(rng);
            push(&v, 8);
            e.f.push_back(v);
            break;
        }
        default: FAIL("not numeric");
    }
}

std::string random_string(std::mt19937_64& rng) {
    std::string s(rng() % 40, '\0');  // empty strings too
    for (char& ch : s) ch = static_cast<char>(1 + rng() % 255);
    return s;
}

void check_value(const GgufValue& v, const ExpectedKV& e, size_t idx, VT t) {
    if (is_unsigned(t)) {
        CHECK(v.u == e.u[idx]);
    } else if (is_signed(t)) {
        CHECK(v.i == e.i[idx]);
    } else if (t == VT::FLOAT32 || t == VT::FLOAT64) {
        CHECK(v.f == e.f[idx]);  // exact: the bytes are copied, not converted
    } else {
        CHECK(v.s == e.s[idx]);
    }
}

const VT kNumeric[] = {VT::UINT8, VT::INT8, VT::UINT16, VT::INT16, VT::UINT32, VT::INT32,
                       VT::FLOAT32, VT::BOOL, VT::UINT64, VT::INT64, VT::FLOAT64};
const Type kTypes[] = {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::MXFP4};

}  // namespace

TEST_CASE("GgufWriter: random files read back by the GGUF reader", "[synth][gguf_writer]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (int file = 0; file < 6; ++file) {
        // A small buffer in some files makes appends cross buffer boundaries and bypass the buffer.
        GgufWriter w(file % 2 == 0 ? 4096 : GgufWriter::kDefaultBufferBytes);
        std::vector<ExpectedKV> kvs;
        const int n_kv = 1 + static_cast<int>(rng() % 30);
        for (int k = 0; k < n_kv; ++k) {
            ExpectedKV e;
            e.key = "test.key" + std::to_string(k);
            const int kind = static_cast<int>(rng() % 14);
            if (kind < 11) {  // scalar numeric
                e.type = kNumeric[kind];
                std::vector<uint8_t> bytes;
                random_numeric(rng, e.type, e, bytes);
                switch (e.type) {
                    case VT::UINT8: w.add_uint8(e.key, bytes[0]); break;
                    case VT::INT8: w.add_int8(e.key, static_cast<int8_t>(e.i[0])); break;
                    case VT::UINT16: w.add_uint16(e.key, static_cast<uint16_t>(e.u[0])); break;
                    case VT::INT16: w.add_int16(e.key, static_cast<int16_t>(e.i[0])); break;
                    case VT::UINT32: w.add_uint32(e.key, static_cast<uint32_t>(e.u[0])); break;
                    case VT::INT32: w.add_int32(e.key, static_cast<int32_t>(e.i[0])); break;
                    case VT::UINT64: w.add_uint64(e.key, e.u[0]); break;
                    case VT::INT64: w.add_int64(e.key, e.i[0]); break;
                    case VT::FLOAT32: w.add_float32(e.key, static_cast<float>(e.f[0])); break;
                    case VT::FLOAT64: w.add_float64(e.key, e.f[0]); break;
                    case VT::BOOL: w.add_bool(e.key, e.u[0] != 0); break;
                    default: FAIL("unexpected type");
                }
            } else if (kind == 11) {
                e.type = VT::STRING;
                e.s.push_back(random_string(rng));
                w.add_string(e.key, e.s[0]);
            } else if (kind == 12) {
                e.type = VT::ARRAY;
                e.elem = VT::STRING;
                const size_t n = rng() % 50;
                for (size_t j = 0; j < n; ++j) e.s.push_back(random_string(rng));
                w.add_string_array(e.key, e.s);
            } else {
                e.type = VT::ARRAY;
                e.elem = kNumeric[rng() % 11];
                const size_t n = rng() % 100;
                std::vector<uint8_t> bytes;
                for (size_t j = 0; j < n; ++j) random_numeric(rng, e.elem, e, bytes);
                w.add_array(e.key, e.elem, bytes.data(), n);
            }
            kvs.push_back(std::move(e));
        }

        std::vector<ExpectedTensor> tensors;
        const int n_tensors = static_cast<int>(rng() % 8);  // files without tensors too
        for (int t = 0; t < n_tensors; ++t) {
            ExpectedTensor et;
            et.name = std::string("t").append(std::to_string(t)).append(".weight");  // (GCC 12 false -Wrestrict)
            et.type = kTypes[rng() % 6];
            const auto& tt = moe::traits(et.type);
            et.ne.push_back(tt.block_size * static_cast<int64_t>(1 + rng() % 6));
            const size_t n_dims = 1 + rng() % 4;
            for (size_t d = 1; d < n_dims; ++d) et.ne.push_back(static_cast<int64_t>(1 + rng() % 5));
            uint64_t rows = 1;
            for (size_t d = 1; d < et.ne.size(); ++d) rows *= static_cast<uint64_t>(et.ne[d]);
            et.data.resize(moe::row_bytes(et.type, et.ne[0]) * rows);
            for (uint8_t& b : et.data) b = static_cast<uint8_t>(rng());
            w.add_tensor(et.name, et.type, et.ne);
            tensors.push_back(std::move(et));
        }
        REQUIRE(w.n_kv() == kvs.size());
        REQUIRE(w.n_tensors() == tensors.size());

        const std::string path = tmp_path("random_" + std::to_string(file) + ".gguf");
        const uint64_t expected_size = w.file_size();
        REQUIRE(w.begin(path).is_ok());
        for (const ExpectedTensor& et : tensors) {
            REQUIRE(w.current_tensor() == static_cast<size_t>(&et - tensors.data()));
            size_t off = 0;
            while (off < et.data.size()) {  // random pieces, empty ones included
                const size_t n = std::min(et.data.size() - off, static_cast<size_t>(rng() % 300));
                const moe::Status s = w.append(et.data.data() + off, n);
                REQUIRE(s.is_ok());
                off += n;
            }
        }
        const moe::Status fs = w.finish();
        INFO(fs.message());
        REQUIRE(fs.is_ok());
        REQUIRE(w.bytes_written() == expected_size);

        for (bool use_mmap : {true, false}) {
            auto opened = GgufFile::open(path, use_mmap);
            INFO(opened.status().message());
            REQUIRE(opened.is_ok());
            const GgufFile& f = **opened;
            CHECK(f.version() == 3);
            CHECK(f.alignment() == 32);
            CHECK(f.file_size() == expected_size);
            REQUIRE(f.metadata().size() == kvs.size());
            for (size_t k = 0; k < kvs.size(); ++k) {
                const ExpectedKV& e = kvs[k];
                const GgufValue& v = f.metadata()[k].value;
                INFO("key " << e.key);
                CHECK(f.metadata()[k].key == e.key);
                REQUIRE(v.type == e.type);
                if (e.type != VT::ARRAY) {
                    check_value(v, e, 0, e.type);
                    continue;
                }
                REQUIRE(v.array_type == e.elem);
                const size_t n = std::max({e.u.size(), e.i.size(), e.f.size(), e.s.size()});
                REQUIRE(v.array.size() == n);
                for (size_t j = 0; j < n; ++j) check_value(v.array[j], e, j, e.elem);
            }
            REQUIRE(f.tensors().size() == tensors.size());
            for (size_t t = 0; t < tensors.size(); ++t) {
                const auto& ti = f.tensors()[t];
                const ExpectedTensor& et = tensors[t];
                INFO("tensor " << et.name);
                CHECK(ti.name == et.name);
                CHECK(ti.type == et.type);
                REQUIRE(ti.n_dims == static_cast<int>(et.ne.size()));
                for (size_t d = 0; d < et.ne.size(); ++d) CHECK(ti.ne[d] == et.ne[d]);
                CHECK(ti.file_offset % 32 == 0);
                REQUIRE(ti.n_bytes == et.data.size());
                CHECK(std::memcmp(f.tensor_data(ti), et.data.data(), et.data.size()) == 0);
            }
        }
    }
}

TEST_CASE("GgufWriter: declaration errors are named and returned by begin", "[synth][gguf_writer]") {
    struct Case {
        const char* what;
        void (*declare)(GgufWriter&);
        moe_status code;
        const char* message;
    };
    const Case cases[] = {
        {"duplicate key", [](GgufWriter& w) { w.add_uint32("a.b", 1); w.add_string("a.b", "x"); },
         MOE_STATUS_INVALID_ARGUMENT, "'a.b': duplicate key"},
        {"empty key", [](GgufWriter& w) { w.add_bool("", true); }, MOE_STATUS_INVALID_ARGUMENT, "key is empty"},
        {"alignment", [](GgufWriter& w) { w.add_uint32("general.alignment", 64); }, MOE_STATUS_INVALID_ARGUMENT,
         "general.alignment"},
        {"string via add_array", [](GgufWriter& w) { w.add_array("k", VT::STRING, "x", 1); },
         MOE_STATUS_INVALID_ARGUMENT, "numeric element types only"},
        {"duplicate tensor", [](GgufWriter& w) { w.add_tensor("t", Type::F32, {4}); w.add_tensor("t", Type::F16, {2}); },
         MOE_STATUS_INVALID_ARGUMENT, "'t': duplicate tensor name"},
        {"partial block", [](GgufWriter& w) { w.add_tensor("q", Type::Q8_0, {48, 2}); }, MOE_STATUS_INVALID_ARGUMENT,
         "ne[0] = 48 is not a multiple of q8_0's block size 32"},
        {"zero dim", [](GgufWriter& w) { w.add_tensor("z", Type::F32, {4, 0}); }, MOE_STATUS_INVALID_ARGUMENT,
         "ne[1] = 0"},
        {"five dims", [](GgufWriter& w) { w.add_tensor("f", Type::F32, {1, 1, 1, 1, 1}); },
         MOE_STATUS_INVALID_ARGUMENT, "5 dimensions"},
        {"long name", [](GgufWriter& w) { w.add_tensor(std::string(64, 'n'), Type::F32, {1}); },
         MOE_STATUS_INVALID_ARGUMENT, "name is 64 bytes (at most 63)"},
        {"internal type", [](GgufWriter& w) { w.add_tensor("i", static_cast<Type>(77), {1}); },
         MOE_STATUS_INVALID_ARGUMENT, "unsupported type id 77"},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        GgufWriter w;
        c.declare(w);
        const std::string path = tmp_path("declared.gguf");
        const moe::Status s = w.begin(path);
        CHECK(s.code() == c.code);
        CHECK_THAT(s.message(), Catch::Contains(c.message));
        CHECK(w.finish().code() == c.code);  // sticky
    }

    GgufWriter late;
    REQUIRE(late.begin(tmp_path("late.gguf")).is_ok());
    late.add_uint8("late.key", 1);
    const moe::Status s = late.finish();
    CHECK(s.code() == MOE_STATUS_FAILED_PRECONDITION);
    CHECK_THAT(s.message(), Catch::Contains("'late.key': added after begin()"));
}

TEST_CASE("GgufWriter: wrong byte counts are refused", "[synth][gguf_writer]") {
    std::vector<uint8_t> data(1000, 0x5A);
    auto make = [](GgufWriter& w, const std::string& path) {
        w.add_tensor("a.weight", Type::F32, {10});   // 40 bytes
        w.add_tensor("b.weight", Type::Q8_0, {64});  // 68 bytes
        REQUIRE(w.begin(path).is_ok());
    };
    SECTION("too many bytes for a tensor") {
        GgufWriter w;
        make(w, tmp_path("counts1.gguf"));
        REQUIRE(w.append(data.data(), 30).is_ok());
        const moe::Status s = w.append(data.data(), 11);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(s.message(), Catch::Contains("11 bytes for tensor 'a.weight', but only 10 of its 40 bytes remain"));
        CHECK(w.append(data.data(), 10).code() == MOE_STATUS_INVALID_ARGUMENT);  // sticky
        CHECK(w.finish().code() == MOE_STATUS_INVALID_ARGUMENT);
    }
    SECTION("finish before the last tensor is complete") {
        GgufWriter w;
        make(w, tmp_path("counts2.gguf"));
        REQUIRE(w.append(data.data(), 40).is_ok());
        REQUIRE(w.append(data.data(), 67).is_ok());
        const moe::Status s = w.finish();
        CHECK(s.code() == MOE_STATUS_FAILED_PRECONDITION);
        CHECK_THAT(s.message(), Catch::Contains("tensor 'b.weight' (2 of 2) has 67 of its 68 bytes"));
    }
    SECTION("bytes after the last tensor") {
        GgufWriter w;
        make(w, tmp_path("counts3.gguf"));
        REQUIRE(w.append(data.data(), 40).is_ok());
        REQUIRE(w.append(data.data(), 68).is_ok());
        const moe::Status s = w.append(data.data(), 1);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(s.message(), Catch::Contains("all 2 tensors are complete"));
    }
    SECTION("append before begin, finish twice") {
        GgufWriter w;
        CHECK(w.append(data.data(), 1).code() == MOE_STATUS_FAILED_PRECONDITION);
        GgufWriter v;
        REQUIRE(v.begin(tmp_path("counts4.gguf")).is_ok());
        REQUIRE(v.finish().is_ok());
        CHECK(v.finish().code() == MOE_STATUS_FAILED_PRECONDITION);
    }
}

TEST_CASE("GgufWriter: I/O errors name the path and the cause", "[synth][gguf_writer]") {
    SECTION("a directory that does not exist") {
        GgufWriter w;
        const std::string path = tmp_path("no_such_dir/x.gguf");
        const moe::Status s = w.begin(path);
        CHECK(s.code() == MOE_STATUS_IO_ERROR);
        CHECK_THAT(s.message(), Catch::Contains(path) && Catch::Contains("No such file or directory"));
    }
    SECTION("a path that is a directory") {
        GgufWriter w;
        const moe::Status s = w.begin(MOE_TEST_TMP_DIR);
        CHECK(s.code() == MOE_STATUS_IO_ERROR);
        CHECK_THAT(s.message(), Catch::Contains(MOE_TEST_TMP_DIR));
    }
    if (!file_exists("/dev/full")) {
        WARN("/dev/full is missing: the full-device checks did not run");
        return;
    }
    SECTION("a full device, seen by append") {
        GgufWriter w(4096);
        w.add_tensor("big.weight", Type::F32, {1 << 16});
        REQUIRE(w.begin("/dev/full").is_ok());  // the header fits in the buffer
        std::vector<uint8_t> data(size_t{4} << 16, 1);
        const moe::Status s = w.append(data.data(), data.size());
        CHECK(s.code() == MOE_STATUS_IO_ERROR);
        CHECK_THAT(s.message(), Catch::Contains("/dev/full") && Catch::Contains("No space left on device"));
        CHECK(w.finish().code() == MOE_STATUS_IO_ERROR);
    }
    SECTION("a full device, seen by finish") {
        GgufWriter w;
        w.add_string("general.name", "small");
        w.add_tensor("small.weight", Type::F32, {8});
        REQUIRE(w.begin("/dev/full").is_ok());
        std::vector<float> data(8, 1.0f);
        REQUIRE(w.append(data.data(), 32).is_ok());  // still buffered
        const moe::Status s = w.finish();
        CHECK(s.code() == MOE_STATUS_IO_ERROR);
        CHECK_THAT(s.message(), Catch::Contains("No space left on device"));
    }
}
