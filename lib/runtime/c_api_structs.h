// The struct_size rule of the C API in one place: the library reads and writes only the fields inside
// the caller's struct_size, so older callers with shorter structs keep working.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace moe {

// The caller's struct read over `defaults` (fields past its struct_size keep their defaults).
// REQUIRES: the caller checked that caller.struct_size covers the fields it must have.
template <typename T>
T read_sized(const T& caller, T defaults) {
    std::memcpy(&defaults, &caller, std::min<size_t>(caller.struct_size, sizeof(T)));
    defaults.struct_size = sizeof(T);
    return defaults;
}

// Writes `full` into the fields inside out->struct_size; out->struct_size stays the caller's.
template <typename T>
void write_sized(const T& full, T* out) {
    const auto size = out->struct_size;
    std::memcpy(out, &full, std::min<size_t>(size, sizeof(T)));
    out->struct_size = size;
}

}  // namespace moe
