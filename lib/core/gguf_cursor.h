// A bounds-checked little-endian reader over a byte buffer, used by the GGUF parser.
//
// Every read checks the bytes left first, so a malformed file can never make the parser read past
// the end of its buffer. Failures return a Status naming the field being read; the caller supplies
// that name. Internal to lib/core.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/status.h"

namespace moe {

// GGUF stores everything little-endian; we read it with memcpy, which is only right on such a host.
static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

class GgufCursor {
public:
    GgufCursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t size() const { return size_; }
    uint64_t remaining() const { return size_ - pos_; }

    // Reads a fixed-size little-endian scalar (integer or IEEE float). `field` names it in errors.
    template <typename T>
    Status read(T& out, const std::string& field) {
        if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
        std::memcpy(&out, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return Status::ok();
    }

    // A GGUF string: u64 length, then that many bytes (no terminator; any bytes, UTF-8 not checked).
    // The length is checked against the bytes left before anything is allocated.
    Status read_string(std::string& out, const std::string& field) {
        uint64_t len = 0;
        // Checked here rather than through read() so the common path builds no message string.
        if (remaining() < sizeof len) return truncated(field + ": string length", sizeof len);
        std::memcpy(&len, data_ + pos_, sizeof len);
        pos_ += sizeof len;
        if (len > remaining()) {
            return data_corrupt(field + ": string length " + std::to_string(len) + " exceeds the " +
                                std::to_string(remaining()) + " bytes left in the file (at offset " +
                                std::to_string(pos_) + ")");
        }
        out.assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return Status::ok();
    }

private:
    Status truncated(const std::string& field, size_t need) const {
        return data_corrupt(field + ": file truncated (needs " + std::to_string(need) + " bytes at offset " +
                            std::to_string(pos_) + ", file has " + std::to_string(size_) + ")");
    }

    const uint8_t* data_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

}  // namespace moe
