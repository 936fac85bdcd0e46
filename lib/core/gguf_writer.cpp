#include "core/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

namespace moe {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes a little-endian host");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Bytes of one element of a numeric array element type; 0 for STRING / ARRAY / unknown.
size_t numeric_size(GgufValueType t) {
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
        case GgufValueType::STRING:
        case GgufValueType::ARRAY: return 0;
    }
    return 0;
}

uint64_t tensor_info_bytes(const std::string& name, int n_dims) {
    return 8 + name.size() + 4 + 8 * static_cast<uint64_t>(n_dims) + 4 + 8;
}

}  // namespace

GgufWriter::GgufWriter(size_t buffer_bytes) : buf_(std::max<size_t>(buffer_bytes, 4096)) {}

GgufWriter::~GgufWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void GgufWriter::record_error(Status s) {
    if (error_.is_ok()) error_ = std::move(s);
}

Status GgufWriter::fail(Status s) {
    record_error(s);
    return error_;
}

bool GgufWriter::begin_kv(std::string_view key, GgufValueType type) {
    const std::string k(key);
    if (begun_) {
        record_error(failed_precondition("metadata '" + k + "': added after begin()"));
        return false;
    }
    if (k.empty()) {
        record_error(invalid_argument("metadata key is empty"));
        return false;
    }
    if (k == "general.alignment") {
        // The writer always aligns to kAlignment, which is what readers assume without the key.
        record_error(invalid_argument("metadata 'general.alignment': the writer always uses 32; do not set it"));
        return false;
    }
    if (std::find(keys_.begin(), keys_.end(), k) != keys_.end()) {
        record_error(invalid_argument("metadata '" + k + "': duplicate key"));
        return false;
    }
    keys_.push_back(k);
    put_string(key);
    put(static_cast<uint32_t>(type));
    ++n_kv_;
    return true;
}

void GgufWriter::put_raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    kv_bytes_.insert(kv_bytes_.end(), b, b + n);
}

void GgufWriter::put_string(std::string_view s) {
    put(static_cast<uint64_t>(s.size()));
    put_raw(s.data(), s.size());
}

void GgufWriter::add_uint8(std::string_view key, uint8_t v) {
    if (begin_kv(key, GgufValueType::UINT8)) put(v);
}
void GgufWriter::add_int8(std::string_view key, int8_t v) {
    if (begin_kv(key, GgufValueType::INT8)) put(v);
}
void GgufWriter::add_uint16(std::string_view key, uint16_t v) {
    if (begin_kv(key, GgufValueType::UINT16)) put(v);
}
void GgufWriter::add_int16(std::string_view key, int16_t v) {
    if (begin_kv(key, GgufValueType::INT16)) put(v);
}
void GgufWriter::add_uint32(std::string_view key, uint32_t v) {
    if (begin_kv(key, GgufValueType::UINT32)) put(v);
}
void GgufWriter::add_int32(std::string_view key, int32_t v) {
    if (begin_kv(key, GgufValueType::INT32)) put(v);
}
void GgufWriter::add_uint64(std::string_view key, uint64_t v) {
    if (begin_kv(key, GgufValueType::UINT64)) put(v);
}
void GgufWriter::add_int64(std::string_view key, int64_t v) {
    if (begin_kv(key, GgufValueType::INT64)) put(v);
}
void GgufWriter::add_float32(std::string_view key, float v) {
    if (begin_kv(key, GgufValueType::FLOAT32)) put(v);
}
void GgufWriter::add_float64(std::string_view key, double v) {
    if (begin_kv(key, GgufValueType::FLOAT64)) put(v);
}
void GgufWriter::add_bool(std::string_view key, bool v) {
    if (begin_kv(key, GgufValueType::BOOL)) put(static_cast<uint8_t>(v ? 1 : 0));
}
void GgufWriter::add_string(std::string_view key, std::string_view v) {
    if (begin_kv(key, GgufValueType::STRING)) put_string(v);
}

void GgufWriter::add_string_array(std::string_view key, std::span<const std::string> values) {
    if (!begin_kv(key, GgufValueType::ARRAY)) return;
    put(static_cast<uint32_t>(GgufValueType::STRING));
    put(static_cast<uint64_t>(values.size()));
    for (const std::string& s : values) put_string(s);
}

void GgufWriter::add_array(std::string_view key, GgufValueType elem_type, const void* data, uint64_t n) {
    const size_t elem = numeric_size(elem_type);
    if (elem == 0) {
        record_error(invalid_argument("metadata '" + std::string(key) +
                                      "': add_array takes numeric element types only (use add_string_array for strings)"));
        return;
    }
    if (data == nullptr && n > 0) {
        record_error(invalid_argument("metadata '" + std::string(key) + "': array data is NULL"));
        return;
    }
    if (!begin_kv(key, GgufValueType::ARRAY)) return;
    put(static_cast<uint32_t>(elem_type));
    put(n);
    if (n > 0) put_raw(data, static_cast<size_t>(n) * elem);
}

void GgufWriter::add_tensor(std::string_view name, Type type, std::span<const int64_t> ne) {
    const std::string nm(name);
    const std::string what = "tensor '" + nm + "'";
    if (begun_) return record_error(failed_precondition(what + ": added after begin()"));
    if (nm.empty()) return record_error(invalid_argument("tensor name is empty"));
    if (nm.size() > kMaxTensorName) {
        return record_error(invalid_argument(what + ": name is " + std::to_string(nm.size()) + " bytes (at most " +
                                             std::to_string(kMaxTensorName) + ")"));
    }
    const TypeTraits* tt = type_traits(static_cast<int32_t>(type));
    if (tt == nullptr) {
        return record_error(
            invalid_argument(what + ": unsupported type id " + std::to_string(static_cast<int32_t>(type))));
    }
    if (ne.empty() || ne.size() > 4) {
        return record_error(invalid_argument(what + ": " + std::to_string(ne.size()) + " dimensions (1 to 4 allowed)"));
    }
    for (const TensorDecl& t : tensors_) {
        if (t.name == nm) return record_error(invalid_argument(what + ": duplicate tensor name"));
    }
    TensorDecl d{nm, type, static_cast<int>(ne.size()), {1, 1, 1, 1}, 0, 0};
    uint64_t rows = 1;
    for (size_t i = 0; i < ne.size(); ++i) {
        if (ne[i] <= 0) {
            return record_error(invalid_argument(what + ": ne[" + std::to_string(i) + "] = " + std::to_string(ne[i]) +
                                                 " (must be > 0)"));
        }
        d.ne[i] = ne[i];
        if (i > 0 && __builtin_mul_overflow(rows, static_cast<uint64_t>(ne[i]), &rows)) {
            return record_error(invalid_argument(what + ": element count overflows"));
        }
    }
    if (ne[0] % tt->block_size != 0) {
        return record_error(invalid_argument(what + ": ne[0] = " + std::to_string(ne[0]) + " is not a multiple of " +
                                             tt->name + "'s block size " + std::to_string(tt->block_size)));
    }
    const uint64_t row = row_bytes(type, ne[0]);
    if (__builtin_mul_overflow(row, rows, &d.n_bytes) || d.n_bytes > (uint64_t{1} << 62)) {
        return record_error(invalid_argument(what + ": byte size overflows"));
    }
    d.offset = data_bytes_;
    data_bytes_ = align_up(data_bytes_ + d.n_bytes, kAlignment);
    tensors_.push_back(std::move(d));
}

uint64_t GgufWriter::file_size() const {
    if (begun_) return total_bytes_;  // kv_bytes_ is released by begin()
    uint64_t head = 4 + 4 + 8 + 8 + kv_bytes_.size();
    for (const TensorDecl& t : tensors_) head += tensor_info_bytes(t.name, t.n_dims);
    return align_up(head, kAlignment) + data_bytes_;
}

Status GgufWriter::io_failure(const char* what, int err) {
    return fail(io_error(std::string(what) + " '" + path_ + "': " + std::strerror(err) + " (after " +
                         std::to_string(on_disk_) + " bytes)"));
}

Status GgufWriter::write_all(const uint8_t* p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return io_failure("writing", errno);
        }
        if (w == 0) return io_failure("writing", ENOSPC);  // no progress: treat as a full device
        p += w;
        n -= static_cast<size_t>(w);
        on_disk_ += static_cast<uint64_t>(w);
    }
    return Status::ok();
}

Status GgufWriter::flush() {
    MOE_RETURN_IF_ERROR(write_all(buf_.data(), buf_used_));
    buf_used_ = 0;
    return Status::ok();
}

Status GgufWriter::write_bytes(const void* data, size_t n) {
    const auto* src = static_cast<const uint8_t*>(data);
    if (buf_used_ == 0 && n >= buf_.size()) {
        // Large appends go straight to the file: no copy through the buffer.
        written_ += n;
        return write_all(src, n);
    }
    while (n > 0) {
        const size_t take = std::min(n, buf_.size() - buf_used_);
        std::memcpy(buf_.data() + buf_used_, src, take);
        buf_used_ += take;
        written_ += take;
        src += take;
        n -= take;
        if (buf_used_ == buf_.size()) MOE_RETURN_IF_ERROR(flush());
    }
    return Status::ok();
}

Status GgufWriter::write_zeros(size_t n) {
    static constexpr uint8_t kZeros[64] = {};
    while (n > 0) {
        const size_t take = std::min(n, sizeof kZeros);
        MOE_RETURN_IF_ERROR(write_bytes(kZeros, take));
        n -= take;
    }
    return Status::ok();
}

Status GgufWriter::begin(const std::string& path) {
    if (!error_.is_ok()) return error_;
    if (begun_) return fail(failed_precondition("begin: called twice (file '" + path_ + "')"));
    if (path.empty()) return fail(invalid_argument("begin: path is empty"));
    path_ = path;
    total_bytes_ = file_size();
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return fail(io_error("creating '" + path + "': " + std::strerror(errno)));
    begun_ = true;

    auto put32 = [&](uint32_t v) { return write_bytes(&v, sizeof v); };
    auto put64 = [&](uint64_t v) { return write_bytes(&v, sizeof v); };
    MOE_RETURN_IF_ERROR(put32(kMagic));
    MOE_RETURN_IF_ERROR(put32(kVersion));
    MOE_RETURN_IF_ERROR(put64(tensors_.size()));
    MOE_RETURN_IF_ERROR(put64(n_kv_));
    MOE_RETURN_IF_ERROR(write_bytes(kv_bytes_.data(), kv_bytes_.size()));
    for (const TensorDecl& t : tensors_) {
        MOE_RETURN_IF_ERROR(put64(t.name.size()));
        MOE_RETURN_IF_ERROR(write_bytes(t.name.data(), t.name.size()));
        MOE_RETURN_IF_ERROR(put32(static_cast<uint32_t>(t.n_dims)));
        for (int d = 0; d < t.n_dims; ++d) MOE_RETURN_IF_ERROR(put64(static_cast<uint64_t>(t.ne[d])));
        MOE_RETURN_IF_ERROR(put32(static_cast<uint32_t>(t.type)));
        MOE_RETURN_IF_ERROR(put64(t.offset));
    }
    MOE_RETURN_IF_ERROR(write_zeros(static_cast<size_t>(align_up(written_, kAlignment) - written_)));
    // The metadata is in the file (or the buffer) now; free the serialised copy (a 200k-token
    // vocabulary is several MB).
    std::vector<uint8_t>().swap(kv_bytes_);
    cur_ = 0;
    cur_done_ = 0;
    return Status::ok();
}

Status GgufWriter::append(const void* data, size_t n) {
    if (!error_.is_ok()) return error_;
    if (!begun_) return fail(failed_precondition("append: begin() was not called"));
    if (finished_) return fail(failed_precondition("append: the file '" + path_ + "' is already finished"));
    if (n == 0) return Status::ok();
    if (data == nullptr) return fail(invalid_argument("append: data is NULL"));
    if (cur_ >= tensors_.size()) {
        return fail(invalid_argument("append: " + std::to_string(n) + " bytes past the end: all " +
                                     std::to_string(tensors_.size()) + " tensors are complete"));
    }
    const TensorDecl& t = tensors_[cur_];
    if (n > t.n_bytes - cur_done_) {
        return fail(invalid_argument("append: " + std::to_string(n) + " bytes for tensor '" + t.name + "', but only " +
                                     std::to_string(t.n_bytes - cur_done_) + " of its " + std::to_string(t.n_bytes) +
                                     " bytes remain"));
    }
    MOE_RETURN_IF_ERROR(write_bytes(data, n));
    cur_done_ += n;
    if (cur_done_ == t.n_bytes) {
        // Pad so the next tensor starts at its declared (aligned) offset.
        MOE_RETURN_IF_ERROR(write_zeros(static_cast<size_t>(align_up(t.n_bytes, kAlignment) - t.n_bytes)));
        ++cur_;
        cur_done_ = 0;
    }
    return Status::ok();
}

Status GgufWriter::finish() {
    if (!error_.is_ok()) return error_;
    if (!begun_) return fail(failed_precondition("finish: begin() was not called"));
    if (finished_) return fail(failed_precondition("finish: called twice"));
    if (cur_ < tensors_.size()) {
        const TensorDecl& t = tensors_[cur_];
        return fail(failed_precondition("finish: tensor '" + t.name + "' (" + std::to_string(cur_ + 1) + " of " +
                                        std::to_string(tensors_.size()) + ") has " + std::to_string(cur_done_) +
                                        " of its " + std::to_string(t.n_bytes) + " bytes"));
    }
    MOE_RETURN_IF_ERROR(flush());
    MOE_ASSERT(written_ == total_bytes_);
    const int fd = fd_;
    fd_ = -1;
    // close() can report a deferred write error (e.g. on network file systems): check it.
    if (::close(fd) != 0) return io_failure("closing", errno);
    finished_ = true;
    return Status::ok();
}

}  // namespace moe
