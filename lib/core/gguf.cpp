// GGUF parsing and validation: header, metadata, tensor infos, data layout; plus the typed look-ups.
// Getting the file's bytes (mmap / read / borrowed buffer) is in gguf_open.cpp.
//
// Layout (v2 and v3 are identical for little-endian files; v1 used 32-bit counts and is rejected):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count | kv_count x KV | tensor_count x tensor info
//   | padding to general.alignment | tensor data (each tensor at an aligned offset from the data start)
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/gguf.h"
#include "core/gguf_cursor.h"
#include "core/gguf_metadata.h"

namespace moe {
namespace {

constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;
constexpr uint32_t kMaxSupportedVersion = 3;
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;
// Fewest bytes a KV can take: key length, a one-byte key, value type, a one-byte value.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
// Fewest bytes a tensor info can take: name length, a one-byte name, n_dims (0), type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 4 + 8;

// A name or key as it appears in a message: quoted, non-printable bytes escaped, long ones cut.
std::string quoted(std::string_view s) {
    constexpr size_t kMaxShown = 96;
    std::string out = "'";
    for (size_t k = 0; k < s.size() && k < kMaxShown; ++k) {
        const unsigned char ch = static_cast<unsigned char>(s[k]);
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            out += static_cast<char>(ch);
        } else {
            static constexpr char kHex[] = "0123456789abcdef";
            out += "\\x";
            out += kHex[ch >> 4];
            out += kHex[ch & 15];
        }
    }
    if (s.size() > kMaxShown) out += "...(" + std::to_string(s.size()) + " bytes)";
    return out + "'";
}

std::string str(uint64_t v) { return std::to_string(v); }

// How the typed look-ups name a key in their errors.
std::string key_field(std::string_view key) { return "GGUF metadata key " + quoted(key); }

Status check_magic_and_version(GgufCursor& c, uint32_t& version) {
    uint8_t magic[4];
    for (uint8_t& b : magic) MOE_RETURN_IF_ERROR(c.read(b, "header.magic"));
    if (std::memcmp(magic, "GGUF", 4) != 0) {
        std::string shown;
        for (uint8_t b : magic) shown += std::isprint(b) ? static_cast<char>(b) : '?';
        return data_corrupt("header.magic: expected \"GGUF\", found \"" + shown + "\"; not a GGUF file");
    }
    MOE_RETURN_IF_ERROR(c.read(version, "header.version"));
    if (version == 0) return data_corrupt("header.version: 0 is not a GGUF version");
    // A big-endian file read little-endian shows its small version number in the high bytes.
    if ((version & 0xFFFFu) == 0) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", version);
        return unimplemented("header.version: " + std::string(hex) + " looks like a big-endian GGUF file (version " +
                             str(__builtin_bswap32(version)) +
                             " byte-swapped); only little-endian files are supported");
    }
    if (version == 1) {
        return unimplemented("header.version: GGUF version 1 is not supported (it used 32-bit counts); "
                             "only versions 2 and 3 are");
    }
    if (version > kMaxSupportedVersion) {
        return unimplemented("header.version: GGUF version " + str(version) +
                             " is not supported; only versions 2 and 3 are");
    }
    return Status::ok();
}

// Reads the counts and bounds them by the bytes the KVs and tensor infos would need at minimum.
Status read_counts(GgufCursor& c, uint64_t& n_tensors, uint64_t& n_kv) {
    MOE_RETURN_IF_ERROR(c.read(n_tensors, "header.tensor_count"));
    MOE_RETURN_IF_ERROR(c.read(n_kv, "header.kv_count"));
    const uint64_t left = c.remaining();
    if (n_tensors > left / kMinTensorInfoBytes) {
        return data_corrupt("header.tensor_count: " + str(n_tensors) + " tensor infos cannot fit in the " + str(left) +
                            " bytes after the header (each takes at least " + str(kMinTensorInfoBytes) + ")");
    }
    if (n_kv > (left - n_tensors * kMinTensorInfoBytes) / kMinKvBytes) {
        return data_corrupt("header.kv_count: " + str(n_kv) + " key-value pairs (plus " + str(n_tensors) +
                            " tensor infos) cannot fit in the " + str(left) +
                            " bytes after the header (each takes at least " + str(kMinKvBytes) + ")");
    }
    return Status::ok();
}

Status read_metadata(GgufCursor& c, uint64_t n_kv, std::vector<GgufKV>& kvs,
                     std::unordered_map<std::string, size_t>& index) {
    uint64_t values_left = kGgufMaxMetadataValues;
    kvs.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv, 1 << 12)));
    for (uint64_t i = 0; i < n_kv; ++i) {
        const std::string at = "metadata[" + str(i) + "]";
        GgufKV kv;
        MOE_RETURN_IF_ERROR(c.read_string(kv.key, at + ".key"));
        if (kv.key.empty()) return data_corrupt(at + ".key: empty key");
        std::string field = at + " " + quoted(kv.key);
        if (auto it = index.find(kv.key); it != index.end()) {
            return data_corrupt(field + ": duplicate key (first at metadata[" + str(it->second) + "])");
        }
        uint32_t type = 0;
        MOE_RETURN_IF_ERROR(c.read(type, field + ": value type"));
        if (!gguf_value_type_valid(type)) return data_corrupt(field + ": invalid value type " + str(type));
        MOE_RETURN_IF_ERROR(gguf_read_value(c, static_cast<GgufValueType>(type), kv.value, field, 0, values_left));
        index.emplace(kv.key, kvs.size());
        kvs.push_back(std::move(kv));
    }
    return Status::ok();
}

Status read_alignment(const std::vector<GgufKV>& kvs, const std::unordered_map<std::string, size_t>& index,
                      uint64_t& alignment) {
    alignment = kDefaultAlignment;
    auto it = index.find("general.alignment");
    if (it == index.end()) return Status::ok();
    const GgufValue& v = kvs[it->second].value;
    const std::string field = "metadata[" + str(it->second) + "] 'general.alignment'";
    if (v.type != GgufValueType::UINT32) {
        return data_corrupt(field + ": must be a uint32, found " + gguf_describe_value_type(v));
    }
    if (v.u == 0 || (v.u & (v.u - 1)) != 0) {
        return data_corrupt(field + ": " + str(v.u) + " is not a non-zero power of two");
    }
    alignment = v.u;
    return Status::ok();
}

// "tensor_infos[3].ne[1] ('blk.0.attn_q.weight')": the field first, then which tensor.
std::string tensor_field(uint64_t i, const std::string& name, const char* field) {
    return "tensor_infos[" + str(i) + "]." + field + " (" + quoted(name) + ")";
}

// Reads the tensor infos' structure (names, shapes, raw type ids, offsets). Types and data
// placement are checked afterwards, once the data section's start is known.
Status read_tensor_infos(GgufCursor& c, uint64_t n_tensors, std::vector<GgufTensorInfo>& tensors,
                         std::vector<uint32_t>& type_ids, std::unordered_map<std::string, size_t>& index) {
    tensors.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, 1 << 12)));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensorInfo t;
        MOE_RETURN_IF_ERROR(c.read_string(t.name, "tensor_infos[" + str(i) + "].name"));
        if (t.name.empty()) return data_corrupt("tensor_infos[" + str(i) + "].name: empty tensor name");
        if (auto it = index.find(t.name); it != index.end()) {
            return data_corrupt(tensor_field(i, t.name, "name") + ": duplicate tensor name (first at tensor_infos[" +
                                str(it->second) + "])");
        }
        uint32_t n_dims = 0;
        MOE_RETURN_IF_ERROR(c.read(n_dims, tensor_field(i, t.name, "n_dims")));
        if (n_dims > kMaxDims) {
            return data_corrupt(tensor_field(i, t.name, "n_dims") + ": " + str(n_dims) + " dimensions, at most " +
                                str(kMaxDims) + " are allowed");
        }
        t.n_dims = static_cast<int32_t>(n_dims);
        // ne are stored as u64 but used as int64 (ggml's int64_t ne[4]); zero is allowed (an empty tensor).
        // The product of the non-zero dims must fit in int64, so that no partial product of an empty
        // tensor's shape (rows = ne[1]*ne[2]*ne[3], ...) overflows either.
        uint64_t n_elements = 1;
        bool overflow = false;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const std::string field = "tensor_infos[" + str(i) + "].ne[" + str(d) + "] (" + quoted(t.name) + ")";
            uint64_t ne = 0;
            MOE_RETURN_IF_ERROR(c.read(ne, field));
            if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                return data_corrupt(field + ": " + str(ne) + " is negative as an int64 (" +
                                    std::to_string(static_cast<int64_t>(ne)) + ")");
            }
            t.ne[d] = static_cast<int64_t>(ne);
            if (ne != 0) overflow = overflow || __builtin_mul_overflow(n_elements, ne, &n_elements);
        }
        if (overflow || n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return data_corrupt(tensor_field(i, t.name, "ne") + ": the element count of shape [" + str(t.ne[0]) + ", " +
                                str(t.ne[1]) + ", " + str(t.ne[2]) + ", " + str(t.ne[3]) + "] overflows int64");
        }
        uint32_t type_id = 0;
        MOE_RETURN_IF_ERROR(c.read(type_id, tensor_field(i, t.name, "type")));
        MOE_RETURN_IF_ERROR(c.read(t.offset, tensor_field(i, t.name, "offset")));
        index.emplace(t.name, tensors.size());
        tensors.push_back(std::move(t));
        type_ids.push_back(type_id);
    }
    return Status::ok();
}

// Type, size, alignment and bounds of one tensor's data; fills type, n_bytes and file_offset.
Status place_tensor(uint64_t i, uint32_t type_id, uint64_t alignment, uint64_t data_offset, uint64_t file_size,
                    GgufTensorInfo& t) {
    const bool fits_int32 = type_id <= static_cast<uint32_t>(std::numeric_limits<int32_t>::max());
    const TypeTraits* tt = fits_int32 ? type_traits(static_cast<int32_t>(type_id)) : nullptr;
    // Every GGUF type is known (sizes and names), runnable or not: backends refuse what they cannot
    // compute when a context is created. An unknown id is a type removed from ggml or one newer than us.
    if (tt == nullptr) {
        return unimplemented(tensor_field(i, t.name, "type") + ": unsupported type id " + str(type_id) +
                             " (not a GGUF type known to this build)");
    }
    t.type = tt->type;
    if (t.ne[0] % tt->block_size != 0) {
        return data_corrupt(tensor_field(i, t.name, "ne[0]") + ": " + str(t.ne[0]) + " is not a multiple of the " +
                            tt->name + " block size " + str(tt->block_size));
    }
    uint64_t n_bytes = static_cast<uint64_t>(t.ne[0] / tt->block_size);
    bool overflow = __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(tt->block_bytes), &n_bytes);
    for (int d = 1; d < 4; ++d) {
        overflow = overflow || __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(t.ne[d]), &n_bytes);
    }
    if (overflow) return data_corrupt(tensor_field(i, t.name, "ne") + ": the size in bytes overflows uint64");
    t.n_bytes = n_bytes;
    if (t.offset % alignment != 0) {
        return data_corrupt(tensor_field(i, t.name, "offset") + ": " + str(t.offset) +
                            " is not a multiple of the alignment " + str(alignment));
    }
    // Even an empty tensor must start inside the file (tensor_data() points there). data_offset may
    // itself lie past the end (missing padding), and offsets are arbitrary u64: compare without overflow.
    if (data_offset > file_size || t.offset > file_size - data_offset || n_bytes > file_size - data_offset - t.offset) {
        uint64_t at = 0;
        const std::string where = __builtin_add_overflow(data_offset, t.offset, &at)
                                      ? "offset " + str(t.offset) + " of the data section at " + str(data_offset)
                                      : "file offset " + str(at);
        return data_corrupt(tensor_field(i, t.name, "offset") + ": data (" + str(n_bytes) + " bytes at " + where +
                            ") ends past the end of the file (" + str(file_size) + " bytes)");
    }
    t.file_offset = data_offset + t.offset;
    return Status::ok();
}

// Tensors may not share bytes. Empty tensors occupy nothing, so they overlap nothing.
Status check_no_overlap(const std::vector<GgufTensorInfo>& tensors) {
    std::vector<size_t> order;
    for (size_t k = 0; k < tensors.size(); ++k) {
        if (tensors[k].n_bytes > 0) order.push_back(k);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const uint64_t oa = tensors[a].file_offset, ob = tensors[b].file_offset;
        return oa != ob ? oa < ob : a < b;
    });
    // With starts sorted, any overlap shows up between neighbours.
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensorInfo& prev = tensors[order[k - 1]];
        const GgufTensorInfo& cur = tensors[order[k]];
        if (cur.file_offset < prev.file_offset + prev.n_bytes) {
            auto span = [](const GgufTensorInfo& t) {
                return "file bytes " + str(t.file_offset) + ".." + str(t.file_offset + t.n_bytes);
            };
            return data_corrupt(tensor_field(order[k], cur.name, "offset") + ": data (" + span(cur) +
                                ") overlaps tensor_infos[" + str(order[k - 1]) + "] " + quoted(prev.name) + " (" +
                                span(prev) + ")");
        }
    }
    return Status::ok();
}

}  // namespace

Status GgufFile::parse() {
    if (size_ < kHeaderBytes) {
        return data_corrupt("file too small for a GGUF header (" + str(size_) + " bytes, need " + str(kHeaderBytes) +
                            ")");
    }
    GgufCursor c(base_, size_);
    MOE_RETURN_IF_ERROR(check_magic_and_version(c, version_));
    uint64_t n_tensors = 0, n_kv = 0;
    MOE_RETURN_IF_ERROR(read_counts(c, n_tensors, n_kv));
    MOE_RETURN_IF_ERROR(read_metadata(c, n_kv, kvs_, kv_index_));
    MOE_RETURN_IF_ERROR(read_alignment(kvs_, kv_index_, alignment_));
    std::vector<uint32_t> type_ids;
    MOE_RETURN_IF_ERROR(read_tensor_infos(c, n_tensors, tensors_, type_ids, tensor_index_));
    // The data section starts at the aligned end of the tensor infos (pos <= size_ < 2^64 - 2^32: no overflow).
    data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        MOE_RETURN_IF_ERROR(place_tensor(i, type_ids[i], alignment_, data_offset_, size_, tensors_[i]));
    }
    return check_no_overlap(tensors_);
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

StatusOr<int64_t> GgufFile::get_int(std::string_view key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return not_found(key_field(key) + " not found");
    if (!v->is_integer()) {
        return data_corrupt(key_field(key) + ": expected an integer, found " + gguf_describe_value_type(*v));
    }
    if (v->type == GgufValueType::UINT64 && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return data_corrupt(key_field(key) + ": uint64 value " + str(v->u) + " does not fit in an int64");
    }
    return v->i;
}

StatusOr<double> GgufFile::get_float(std::string_view key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return not_found(key_field(key) + " not found");
    if (v->is_float()) return v->f;
    if (v->type == GgufValueType::UINT64) return static_cast<double>(v->u);
    if (v->is_integer()) return static_cast<double>(v->i);
    return data_corrupt(key_field(key) + ": expected a number, found " + gguf_describe_value_type(*v));
}

StatusOr<std::string> GgufFile::get_string(std::string_view key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return not_found(key_field(key) + " not found");
    if (v->type != GgufValueType::STRING) {
        return data_corrupt(key_field(key) + ": expected a string, found " + gguf_describe_value_type(*v));
    }
    return v->s;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    const int64_t i = tensor_index(name);
    return i < 0 ? nullptr : &tensors_[static_cast<size_t>(i)];
}

int64_t GgufFile::tensor_index(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? -1 : static_cast<int64_t>(it->second);
}

}  // namespace moe
