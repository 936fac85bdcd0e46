// The C API over the element types and quantisation formats of core/types.h.
#include <string>

#include "core/types.h"
#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"

namespace moe {
namespace {

// The traits of `type`, or the UNIMPLEMENTED status that names the id. Every GGUF type is a moe_type.
StatusOr<const TypeTraits*> find_type(int32_t type) {
    const TypeTraits* t = type_traits(type);
    if (t == nullptr) return unimplemented("unknown tensor type id " + std::to_string(type));
    return t;
}

// UNIMPLEMENTED naming the type when it has no conversion in the direction `fn` (nullptr) goes.
template <typename Fn>
Status check_conversion(const TypeTraits& t, Fn fn, const char* what) {
    if (fn != nullptr) return Status::ok();
    return unimplemented(std::string("type ") + t.name + ": this build cannot " + what + " it");
}

// Checks (type, n) and that `size_given` bytes hold the row; returns the traits. `what` names the
// size argument in the message ("dst_size: 10 bytes given, 34 needed").
StatusOr<const TypeTraits*> check_row(int32_t type, int64_t n, uint64_t size_given, const char* what) {
    MOE_ASSIGN_OR_RETURN(const TypeTraits* t, find_type(type));
    MOE_ASSIGN_OR_RETURN(const uint64_t needed, checked_row_bytes(type, n));
    if (size_given < needed) {
        return invalid_argument(std::string(what) + ": " + std::to_string(size_given) + " bytes given, " +
                                std::to_string(needed) + " needed");
    }
    return t;
}

}  // namespace
}  // namespace moe

extern "C" {

// No MOE_API_BEGIN/END here: it returns a pointer, not a status, cannot throw, and NULL is the
// documented answer for unknown ids (like moe_status_string).
MOE_API const char* moe_type_name(int32_t type) {
    const moe::TypeTraits* t = moe::type_traits(type);
    return t != nullptr ? t->name : nullptr;
}

MOE_API moe_status moe_type_from_name(const char* name, int32_t* out_type) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(name != nullptr, "name: must not be NULL");
    MOE_CHECK_ARG(out_type != nullptr, "out_type: must not be NULL");
    const moe::TypeTraits* t = moe::type_traits_by_name(name);
    if (t == nullptr) return moe::api_return(moe::not_found(std::string("name: unknown type name '") + name + "'"));
    *out_type = static_cast<int32_t>(t->type);
    return moe::api_return(moe::Status::ok());
    MOE_API_END
}

MOE_API moe_status moe_type_capabilities(int32_t type, uint32_t* out_flags) {
    MOE_API_BEGIN
    auto t = moe::find_type(type);
    if (!t.is_ok()) return moe::api_return(t.status());
    MOE_CHECK_ARG(out_flags != nullptr, "out_flags: must not be NULL");
    *out_flags = ((*t)->from_float != nullptr ? MOE_TYPE_CAN_QUANTIZE : 0u) |
                 ((*t)->to_float != nullptr ? MOE_TYPE_CAN_DEQUANTIZE : 0u);
    return moe::api_return(moe::Status::ok());
    MOE_API_END
}

MOE_API moe_status moe_type_block_info(int32_t type, int64_t* out_block_size, int64_t* out_block_bytes) {
    MOE_API_BEGIN
    auto t = moe::find_type(type);
    if (!t.is_ok()) return moe::api_return(t.status());
    MOE_CHECK_ARG(out_block_size != nullptr, "out_block_size: must not be NULL");
    MOE_CHECK_ARG(out_block_bytes != nullptr, "out_block_bytes: must not be NULL");
    *out_block_size = (*t)->block_size;
    *out_block_bytes = (*t)->block_bytes;
    return moe::api_return(moe::Status::ok());
    MOE_API_END
}

MOE_API moe_status moe_type_row_bytes(int32_t type, int64_t n, uint64_t* out_bytes) {
    MOE_API_BEGIN
    auto t = moe::find_type(type);
    if (!t.is_ok()) return moe::api_return(t.status());
    auto bytes = moe::checked_row_bytes(type, n);
    if (!bytes.is_ok()) return moe::api_return(bytes.status());
    MOE_CHECK_ARG(out_bytes != nullptr, "out_bytes: must not be NULL");
    *out_bytes = *bytes;
    return moe::api_return(moe::Status::ok());
    MOE_API_END
}

MOE_API moe_status moe_quantize(int32_t type, const float* src, int64_t n, void* dst, uint64_t dst_size) {
    MOE_API_BEGIN
    auto t = moe::check_row(type, n, dst_size, "dst_size");
    if (!t.is_ok()) return moe::api_return(t.status());
    if (auto s = moe::check_conversion(**t, (*t)->from_float, "quantize to"); !s.is_ok()) return moe::api_return(s);
    MOE_CHECK_ARG(src != nullptr, "src: must not be NULL");
    MOE_CHECK_ARG(dst != nullptr, "dst: must not be NULL");
    (*t)->from_float(src, dst, n);
    return moe::api_return(moe::Status::ok());
    MOE_API_END
}

MOE_API moe_status moe_dequantize(int32_t type, const void* src, uint64_t src_size, int64_t n, float* dst) {
    MOE_API_BEGIN
    auto t = moe::check_row(type, n, src_size, "src_size");
    if (!t.is_ok()) return moe::api_return(t.status());
    if (auto s = moe::check_conversion(**t, (*t)->to_float, "dequantize"); !s.is_ok()) return moe::api_return(s);
    MOE_CHECK_ARG(src != nullptr, "src: must not be NULL");
    MOE_CHECK_ARG(dst != nullptr, "dst: must not be NULL");
    (*t)->to_float(src, dst, n);
    return moe::api_return(moe::Status::ok());
    MOE_API_END
}

}  // extern "C"
