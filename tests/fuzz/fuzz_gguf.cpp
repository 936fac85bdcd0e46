// libFuzzer target for the GGUF reader: any input must parse or fail with a named error, never crash
// or read out of bounds (built with ASan + UBSan; see tests/fuzz/CMakeLists.txt and scripts/fuzz.sh).
// On success every metadata value and every tensor byte is touched, and the layout invariants the
// rest of the library relies on are asserted.
#include <cstddef>
#include <cstdint>

#include "core/gguf.h"

namespace {

uint64_t touch_value(const moe::GgufValue& v) {
    uint64_t h = static_cast<uint64_t>(v.type) ^ static_cast<uint64_t>(v.i) ^ v.u ^ static_cast<uint64_t>(v.f != 0.0);
    for (char c : v.s) h = h * 31 + static_cast<unsigned char>(c);
    for (const moe::GgufValue& e : v.array) {
        MOE_ASSERT(e.type == v.array_type);
        h = h * 131 + touch_value(e);
    }
    return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parsed = moe::GgufFile::from_memory(data, size);
    if (!parsed.is_ok()) {
        const moe_status code = parsed.status().code();
        MOE_ASSERT(code == MOE_STATUS_DATA_CORRUPT || code == MOE_STATUS_UNIMPLEMENTED ||
                   code == MOE_STATUS_RESOURCE_EXHAUSTED);
        MOE_ASSERT(!parsed.status().message().empty());
        return 0;
    }
    const moe::GgufFile& f = *parsed.value();
    uint64_t h = 0;
    for (const moe::GgufKV& kv : f.metadata()) {
        MOE_ASSERT(f.find(kv.key) == &kv.value);
        h += touch_value(kv.value);
        // The typed look-ups must answer (value or named error) for every key.
        auto i = f.get_int(kv.key);
        auto x = f.get_float(kv.key);
        auto s = f.get_string(kv.key);
        h += i.is_ok() + x.is_ok() + s.is_ok();
    }
    MOE_ASSERT(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
    for (const moe::GgufTensorInfo& t : f.tensors()) {
        MOE_ASSERT(t.file_offset <= size && t.n_bytes <= size - t.file_offset);
        MOE_ASSERT(t.file_offset % f.alignment() == 0);
        MOE_ASSERT(t.n_dims >= 0 && t.n_dims <= 4 && t.n_elements() >= 0);
        MOE_ASSERT(t.n_bytes == moe::row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(t.ne[1] * t.ne[2] * t.ne[3]));
        MOE_ASSERT(f.find_tensor(t.name) == &t);
        const uint8_t* p = f.tensor_data(t);
        for (uint64_t k = 0; k < t.n_bytes; ++k) h += p[k];
    }
    volatile uint64_t sink = h;  // keep the reads
    (void)sink;
    return 0;
}
