// GGUF reader: parses and validates a GGUF v2/v3 file (little-endian) and maps its tensor data.
//
// Every count, length, offset, dimension, type and size is validated against the file before use.
// A malformed file gives MOE_STATUS_DATA_CORRUPT (or UNIMPLEMENTED for a valid but unsupported
// tensor type / version) with the offending field named in the message, e.g.
//   "tensor_infos[3].offset: data of 'blk.0.ffn_up_exps.weight' (4096 bytes at 128) ends past the end of the file (2048 bytes)".
// It never crashes and never reads out of bounds (fuzzed: tests/fuzz/fuzz_gguf.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace moe {

// GGUF metadata value types (numbers as in the spec).
enum class GgufValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

const char* gguf_value_type_name(GgufValueType t);

// One metadata value. Arrays hold elements of a single type (nested arrays allowed).
struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    // Scalars: integers (and bool) in `i` (uint64 values above INT64_MAX are stored in `u`),
    // floats in `f`, strings in `s`. Unsigned values and bool are also in `u`.
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0.0;
    std::string s;
    // Arrays: element type and elements.
    GgufValueType array_type = GgufValueType::UINT8;
    std::vector<GgufValue> array;

    bool is_integer() const;  // any integer type or bool
    bool is_float() const { return type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64; }
};

struct GgufKV {
    std::string key;
    GgufValue value;
};

struct GgufTensorInfo {
    std::string name;
    Type type = Type::F32;
    int32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] fastest
    uint64_t offset = 0;           // relative to the start of the data section, as stored
    uint64_t file_offset = 0;      // absolute offset in the file
    uint64_t n_bytes = 0;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// Where the parsed bytes come from: a mapped file, a read-into-memory file, or a caller's buffer.
class GgufFile {
public:
    // Opens and validates `path`. use_mmap=false reads the whole file into memory instead, calling
    // progress(fraction read) between chunks; an error from it stops the read and is returned.
    static StatusOr<std::unique_ptr<GgufFile>> open(const std::string& path, bool use_mmap = true,
                                                    const std::function<Status(double)>& progress = {});
    // Parses a caller-owned buffer (borrowed; must outlive the GgufFile). Used by tests and the fuzzer.
    static StatusOr<std::unique_ptr<GgufFile>> from_memory(const void* data, size_t size);

    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
    uint64_t file_size() const { return size_; }
    // Whether the bytes are the file mapped read-only (open with use_mmap), not memory of our own.
    bool is_mapped() const { return mapping_ != nullptr; }
    // Replaces the mapped file pages of [begin, end) (page-aligned, inside the mapping) by private
    // anonymous memory holding the same bytes, at the same addresses, so readers never see a change.
    // Why: the NVIDIA driver page-locks a read-only FILE mapping pathologically slowly (an 11 GB
    // model's host-resident experts had not been locked after 5 minutes of system time on the H200
    // machine, 2026-11-26), while anonymous memory locks at memory speed. The bytes are read from the
    // file (pread: no page faults on the mapping) by n_threads threads (>= 1) in pieces, and the file
    // pages of a piece, if resident, are dropped once it is read, so the process holds at most
    // n_threads pieces twice (a piece is 1% of the file / n_threads: whole 2 MiB from 2 MiB up, at
    // most 16 MiB; whole pages, at least 16, below).
    // `copied`, if set, grows by each piece's bytes as it is read (from any of the threads),
    // so that another thread can report progress. Ranges already replaced are skipped; thread-safe
    // (calls are serialised). No-op (OK) for a file that is not mapped.
    Status make_anonymous(uintptr_t begin, uintptr_t end, int n_threads = 1, std::atomic<uint64_t>* copied = nullptr);

    const std::vector<GgufKV>& metadata() const { return kvs_; }
    const GgufValue* find(std::string_view key) const;  // nullptr when absent

    // Typed look-ups with named errors: NOT_FOUND when absent, DATA_CORRUPT on a type mismatch.
    StatusOr<int64_t> get_int(std::string_view key) const;
    StatusOr<double> get_float(std::string_view key) const;  // accepts integer values too
    StatusOr<std::string> get_string(std::string_view key) const;

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent
    int64_t tensor_index(std::string_view name) const;               // -1 when absent

    // Pointer to the tensor's bytes (n_bytes of them), inside the mapped/loaded file.
    const uint8_t* tensor_data(const GgufTensorInfo& t) const { return base_ + t.file_offset; }

private:
    GgufFile() = default;
    Status parse();
    Status replace_range(uintptr_t begin, uintptr_t end, int n_threads, std::atomic<uint64_t>* copied);

    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    void* mapping_ = nullptr;       // mmap'd region (munmap in the destructor)
    int fd_ = -1;                   // the mapped file, open for make_anonymous's reads (closed in the destructor)
    std::mutex anonymous_mutex_;    // guards anonymous_
    std::vector<std::pair<uintptr_t, uintptr_t>> anonymous_;  // ranges make_anonymous replaced, sorted
    std::vector<uint8_t> owned_;    // the file's bytes when not mapped

    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<GgufKV> kvs_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace moe
