// GGUF writer: streams a GGUF v3 file (little-endian) of any size in constant memory.
//
// Use:
//   GgufWriter w;
//   w.add_string("general.architecture", "qwen3moe");   // metadata, any GGUF value type
//   w.add_tensor("token_embd.weight", Type::F16, {2048, 151936});
//   MOE_RETURN_IF_ERROR(w.begin(path));                  // header, metadata, tensor infos
//   for each tensor, in declaration order:
//       MOE_RETURN_IF_ERROR(w.append(bytes, n));         // any number of times per tensor
//   MOE_RETURN_IF_ERROR(w.finish());                     // checks everything was written, closes
//
// Errors of the declaration calls (duplicate key or tensor name, bad shape, call after begin) are
// remembered and returned by begin(), so declarations need no error check each. After any error the
// writer refuses further work; the partial file is left for the caller to remove (the writer never
// deletes files: the path may be a device such as /dev/full).
//
// Thread safety: none; one thread drives a writer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf.h"  // GgufValueType only: the writer is independent of the reader
#include "core/status.h"
#include "core/types.h"

namespace moe {

class GgufWriter {
public:
    static constexpr uint32_t kVersion = 3;
    static constexpr uint64_t kAlignment = 32;                 // general.alignment's default
    static constexpr size_t kDefaultBufferBytes = size_t{8} << 20;
    static constexpr size_t kMaxTensorName = 63;               // ggml's GGML_MAX_NAME minus the NUL

    explicit GgufWriter(size_t buffer_bytes = kDefaultBufferBytes);
    ~GgufWriter();  // closes the file if still open (no flush of a file that was not finished)
    GgufWriter(const GgufWriter&) = delete;
    GgufWriter& operator=(const GgufWriter&) = delete;

    // ---- metadata (before begin) ----
    void add_uint8(std::string_view key, uint8_t v);
    void add_int8(std::string_view key, int8_t v);
    void add_uint16(std::string_view key, uint16_t v);
    void add_int16(std::string_view key, int16_t v);
    void add_uint32(std::string_view key, uint32_t v);
    void add_int32(std::string_view key, int32_t v);
    void add_uint64(std::string_view key, uint64_t v);
    void add_int64(std::string_view key, int64_t v);
    void add_float32(std::string_view key, float v);
    void add_float64(std::string_view key, double v);
    void add_bool(std::string_view key, bool v);
    void add_string(std::string_view key, std::string_view v);
    void add_string_array(std::string_view key, std::span<const std::string> values);
    // A numeric (or bool) array: `n` elements of `elem_type`, read from `data` in host order.
    // REQUIRES: elem_type is not STRING or ARRAY (recorded as an error otherwise).
    void add_array(std::string_view key, GgufValueType elem_type, const void* data, uint64_t n);
    void add_float32_array(std::string_view key, std::span<const float> v) {
        add_array(key, GgufValueType::FLOAT32, v.data(), v.size());
    }
    void add_int32_array(std::string_view key, std::span<const int32_t> v) {
        add_array(key, GgufValueType::INT32, v.data(), v.size());
    }
    void add_uint32_array(std::string_view key, std::span<const uint32_t> v) {
        add_array(key, GgufValueType::UINT32, v.data(), v.size());
    }

    // ---- tensors (before begin) ----
    // ne[0] is the fastest dimension; 1 to 4 dims, each > 0, ne[0] a multiple of the type's block.
    void add_tensor(std::string_view name, Type type, std::span<const int64_t> ne);
    void add_tensor(std::string_view name, Type type, std::initializer_list<int64_t> ne) {
        add_tensor(name, type, std::span<const int64_t>(ne.begin(), ne.size()));
    }

    size_t n_kv() const { return n_kv_; }
    size_t n_tensors() const { return tensors_.size(); }
    // Bytes of tensor i's data (without padding). REQUIRES: i < n_tensors().
    uint64_t tensor_bytes(size_t i) const { return tensors_[i].n_bytes; }
    // Size the file will have once finished (header, metadata, infos, data and padding).
    uint64_t file_size() const;
    // Bytes written to the file so far (buffered bytes included).
    uint64_t bytes_written() const { return written_; }

    // ---- writing ----
    // Creates (or truncates) `path` and writes header, metadata and tensor infos.
    Status begin(const std::string& path);
    // Appends bytes of the current tensor. An append may not cross into the next tensor; once a
    // tensor is complete the writer pads to the alignment and moves to the next.
    Status append(const void* data, size_t n);
    // Index of the tensor the next append() belongs to (n_tensors() once all are written).
    size_t current_tensor() const { return cur_; }
    // Checks every tensor was written in full, flushes and closes. The file is complete only when
    // this returns OK (a full disk or a failing close() shows up here at the latest).
    Status finish();

private:
    struct TensorDecl {
        std::string name;
        Type type;
        int n_dims;
        int64_t ne[4];
        uint64_t n_bytes;
        uint64_t offset;  // relative to the data section
    };

    bool begin_kv(std::string_view key, GgufValueType type);  // false (error recorded) if refused
    void put_raw(const void* p, size_t n);
    template <typename T>
    void put(T v) { put_raw(&v, sizeof v); }
    void put_string(std::string_view s);
    void record_error(Status s);

    Status write_bytes(const void* data, size_t n);  // through the buffer (or around it, if large)
    Status write_all(const uint8_t* p, size_t n);     // to the file, retrying short writes
    Status write_zeros(size_t n);
    Status flush();
    Status fail(Status s);  // records s (if first) and returns it
    Status io_failure(const char* what, int err);

    std::vector<uint8_t> kv_bytes_;  // serialised metadata, in order of addition
    size_t n_kv_ = 0;
    std::vector<std::string> keys_;  // for duplicate detection (small: tens of keys)
    std::vector<TensorDecl> tensors_;
    uint64_t data_bytes_ = 0;        // data section size, padding included
    uint64_t total_bytes_ = 0;       // the file's size, fixed by begin()

    Status error_;                   // first error; sticky
    std::string path_;
    int fd_ = -1;
    bool begun_ = false;
    bool finished_ = false;
    std::vector<uint8_t> buf_;
    size_t buf_used_ = 0;
    uint64_t written_ = 0;           // bytes accepted (in the file or the buffer)
    uint64_t on_disk_ = 0;           // bytes the OS has taken
    size_t cur_ = 0;                 // current tensor
    uint64_t cur_done_ = 0;          // bytes of the current tensor appended so far
};

}  // namespace moe
