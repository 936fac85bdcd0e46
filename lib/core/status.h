// Status and StatusOr: how recoverable failures travel inside the library.
//
// Recoverable failures (bad file, bad argument, device OOM, unsupported op) are returned as Status;
// the C API turns them into a moe_status plus the thread-local message. Broken internal invariants
// use MOE_ASSERT, which aborts.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "moeinfer/moeinfer.h"

namespace moe {

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(moe_status code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok() { return Status(); }

    bool is_ok() const { return code_ == MOE_STATUS_OK; }
    moe_status code() const { return code_; }
    const std::string& message() const { return message_; }

    // Prefixes the message with context ("loading model.gguf: ...").
    Status with_context(const std::string& context) const {
        if (is_ok()) return *this;
        return Status(code_, context + ": " + message_);
    }

private:
    moe_status code_ = MOE_STATUS_OK;
    std::string message_;
};

inline Status invalid_argument(std::string m) { return Status(MOE_STATUS_INVALID_ARGUMENT, std::move(m)); }
inline Status not_found(std::string m) { return Status(MOE_STATUS_NOT_FOUND, std::move(m)); }
inline Status out_of_range(std::string m) { return Status(MOE_STATUS_OUT_OF_RANGE, std::move(m)); }
inline Status resource_exhausted(std::string m) { return Status(MOE_STATUS_RESOURCE_EXHAUSTED, std::move(m)); }
inline Status unimplemented(std::string m) { return Status(MOE_STATUS_UNIMPLEMENTED, std::move(m)); }
inline Status internal_error(std::string m) { return Status(MOE_STATUS_INTERNAL, std::move(m)); }
inline Status io_error(std::string m) { return Status(MOE_STATUS_IO_ERROR, std::move(m)); }
inline Status data_corrupt(std::string m) { return Status(MOE_STATUS_DATA_CORRUPT, std::move(m)); }
inline Status failed_precondition(std::string m) { return Status(MOE_STATUS_FAILED_PRECONDITION, std::move(m)); }
inline Status cancelled(std::string m) { return Status(MOE_STATUS_CANCELLED, std::move(m)); }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
public:
    StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
    StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
        if (status_.is_ok()) status_ = internal_error("StatusOr constructed from an OK status");
    }

    bool is_ok() const { return status_.is_ok(); }
    const Status& status() const { return status_; }

    // REQUIRES: is_ok().
    T& value() & { return *value_; }
    const T& value() const& { return *value_; }
    T&& value() && { return std::move(*value_); }
    T* operator->() { return &*value_; }
    const T* operator->() const { return &*value_; }
    T& operator*() & { return *value_; }
    const T& operator*() const& { return *value_; }

private:
    Status status_;
    std::optional<T> value_;
};

}  // namespace moe

#define MOE_CONCAT_INNER(a, b) a##b
#define MOE_CONCAT(a, b) MOE_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define MOE_RETURN_IF_ERROR(expr)                         \
    do {                                                  \
        ::moe::Status moe_status_tmp_ = (expr);           \
        if (!moe_status_tmp_.is_ok()) return moe_status_tmp_; \
    } while (0)

// `lhs = value of expr`, or return its Status. lhs may be a declaration: MOE_ASSIGN_OR_RETURN(auto x, f());
#define MOE_ASSIGN_OR_RETURN(lhs, expr) MOE_ASSIGN_OR_RETURN_IMPL(MOE_CONCAT(moe_statusor_, __LINE__), lhs, expr)
#define MOE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
    auto tmp = (expr);                            \
    if (!tmp.is_ok()) return tmp.status();        \
    lhs = std::move(tmp).value()

// Internal invariant: a failure is a bug in moeinfer, so abort with the location.
#define MOE_ASSERT(cond)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            std::fprintf(stderr, "moeinfer: internal assertion failed at %s:%d: %s\n", __FILE__, \
                         __LINE__, #cond);                                                      \
            std::abort();                                                                       \
        }                                                                                       \
    } while (0)
