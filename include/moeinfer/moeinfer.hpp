/*
 * moeinfer.hpp: a thin, header-only C++17 wrapper over the C API in moeinfer.h.
 *
 * It adds only what C++ users expect and nothing else: handles owned by std::unique_ptr, errors
 * thrown as moeinfer::Error (carrying the moe_status and moe_last_error()), "not found" answered
 * with std::optional where absence is an ordinary outcome, std::vector helpers, and progress
 * callbacks as std::function. Structs are the C ones (moe_model_info, moe_tensor_info, ...), so the
 * wrapper grows with the C API without copying its field lists.
 *
 *     auto model = moeinfer::Model::load("model.gguf");
 *     moe_model_info info = model.info();            // strings borrowed from `model`
 *     if (auto i = model.find_tensor("token_embd.weight")) {
 *         std::vector<uint8_t> raw = model.read_tensor(*i);
 *     }
 *     auto ctx = moeinfer::Context::create(model);     // `model` must outlive `ctx`
 *     moeinfer::Logits l = ctx.decode(std::vector<int32_t>{1, 2, 3});  // last token's row
 *     const float* next = l.row(0);                   // borrowed until the next decode
 *
 * Thread safety: as the C API's (a Model may be queried from any number of threads at once).
 * Exceptions thrown by a progress callback never cross the C ABI: the wrapper catches them, asks
 * the library to cancel, and rethrows them to the caller once the C call has returned.
 */
#ifndef MOEINFER_HPP
#define MOEINFER_HPP

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeinfer/moeinfer.h"

#if __cplusplus >= 202002L && defined(__has_include)
#  if __has_include(<span>)
#    include <span>
#    define MOEINFER_HPP_HAS_SPAN 1
#  endif
#endif

namespace moeinfer {

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

// A failed moe_ call: what() is the library's message (moe_last_error()), status() its code.
class Error : public std::runtime_error {
public:
    Error(moe_status status, const std::string& message)
        : std::runtime_error(message.empty() ? std::string(moe_status_string(status)) : message), status_(status) {}
    moe_status status() const noexcept { return status_; }

private:
    moe_status status_;
};

// Throws Error for any status but MOE_STATUS_OK. Call it right after the moe_ call: the message
// is thread-local and the next moe_ call on this thread replaces it.
inline void check(moe_status status) {
    if (status != MOE_STATUS_OK) throw Error(status, moe_last_error());
}

inline std::string version() { return moe_version(); }

namespace detail {

// unique_ptr deleter for a C handle freed by `Free` (every moe_*_free accepts NULL).
template <auto Free>
struct Deleter {
    template <class T>
    void operator()(T* p) const noexcept {
        Free(p);
    }
};

template <class T, auto Free>
using Handle = std::unique_ptr<T, Deleter<Free>>;

// NOT_FOUND -> std::nullopt, OK -> value, anything else throws. Call it after the moe_ call that
// writes `value` (not in the same expression: argument evaluation order is unspecified).
template <class T>
std::optional<T> optional_if_found(moe_status status, const T& value) {
    if (status == MOE_STATUS_NOT_FOUND) return std::nullopt;
    check(status);
    return value;
}

// Calls `fn(buf, capacity, &n)` of the C API's size-then-fill convention (the text functions:
// nothing is written when the buffer is too small) until the result fits, and returns it.
template <class T, class Fn>
std::vector<T> sized_call(Fn&& fn) {
    std::vector<T> out(64);
    for (;;) {
        int64_t n = 0;
        check(fn(out.data(), static_cast<int64_t>(out.size()), &n));
        if (static_cast<uint64_t>(n) <= out.size()) {
            out.resize(static_cast<size_t>(n));
            return out;
        }
        out.resize(static_cast<size_t>(n));
    }
}

}  // namespace detail

/* ---------------------------------------------------------------------------------------------
 * Progress callbacks
 * ------------------------------------------------------------------------------------------- */

// Receives a fraction in [0, 1]; returns false to cancel (the call then throws Error with
// MOE_STATUS_CANCELLED). An exception it throws cancels the call and reaches the caller unchanged.
using ProgressFn = std::function<bool(float)>;

namespace detail {

// Bridges a ProgressFn to moe_progress_fn for the length of one C call.
class ProgressBridge {
public:
    explicit ProgressBridge(const ProgressFn& fn) : fn_(fn) {}
    ProgressBridge(const ProgressBridge&) = delete;  // the C library holds its address
    ProgressBridge& operator=(const ProgressBridge&) = delete;

    moe_progress_fn callback() const { return fn_ ? &ProgressBridge::trampoline : nullptr; }
    void* user_data() { return fn_ ? this : nullptr; }

    // After the C call: a callback's exception wins over the CANCELLED status it caused.
    void finish(moe_status status) const {
        if (error_) std::rethrow_exception(error_);
        check(status);
    }

private:
    static int trampoline(float fraction, void* user_data) noexcept {
        auto* self = static_cast<ProgressBridge*>(user_data);
        try {
            return self->fn_(fraction) ? 1 : 0;
        } catch (...) {
            self->error_ = std::current_exception();
            return 0;
        }
    }

    const ProgressFn& fn_;
    std::exception_ptr error_;
};

}  // namespace detail

/* ---------------------------------------------------------------------------------------------
 * Element types and quantisation
 * ------------------------------------------------------------------------------------------- */

struct BlockInfo {
    int64_t block_size;   // elements per block
    int64_t block_bytes;  // bytes per block
};

// "q8_0" -> MOE_TYPE_Q8_0 (case-insensitive); throws Error(NOT_FOUND) for unknown names.
inline int32_t type_from_name(const std::string& name) {
    int32_t type = 0;
    check(moe_type_from_name(name.c_str(), &type));
    return type;
}

// MOE_TYPE_Q8_0 -> "q8_0"; std::nullopt for unknown types.
inline std::optional<std::string> type_name(int32_t type) {
    const char* name = moe_type_name(type);
    if (name == nullptr) return std::nullopt;
    return std::string(name);
}

inline BlockInfo block_info(int32_t type) {
    BlockInfo b{0, 0};
    check(moe_type_block_info(type, &b.block_size, &b.block_bytes));
    return b;
}

// Bytes taken by n elements (n a multiple of the block size).
inline uint64_t row_bytes(int32_t type, int64_t n) {
    uint64_t bytes = 0;
    check(moe_type_row_bytes(type, n, &bytes));
    return bytes;
}

inline void quantize(int32_t type, const float* src, int64_t n, void* dst, uint64_t dst_size) {
    check(moe_quantize(type, src, n, dst, dst_size));
}

inline std::vector<uint8_t> quantize(int32_t type, const float* src, int64_t n) {
    std::vector<uint8_t> dst(static_cast<size_t>(row_bytes(type, n)));
    quantize(type, src, n, dst.data(), dst.size());
    return dst;
}

inline std::vector<uint8_t> quantize(int32_t type, const std::vector<float>& src) {
    return quantize(type, src.data(), static_cast<int64_t>(src.size()));
}

inline void dequantize(int32_t type, const void* src, uint64_t src_size, int64_t n, float* dst) {
    check(moe_dequantize(type, src, src_size, n, dst));
}

inline std::vector<float> dequantize(int32_t type, const void* src, uint64_t src_size, int64_t n) {
    if (n < 0) throw Error(MOE_STATUS_INVALID_ARGUMENT, "dequantize: n must be >= 0, got " + std::to_string(n));
    std::vector<float> dst(static_cast<size_t>(n));
    dequantize(type, src, src_size, n, dst.data());
    return dst;
}

inline std::vector<float> dequantize(int32_t type, const std::vector<uint8_t>& src, int64_t n) {
    return dequantize(type, src.data(), src.size(), n);
}

#ifdef MOEINFER_HPP_HAS_SPAN
inline std::vector<uint8_t> quantize(int32_t type, std::span<const float> src) {
    return quantize(type, src.data(), static_cast<int64_t>(src.size()));
}

inline void quantize(int32_t type, std::span<const float> src, std::span<uint8_t> dst) {
    quantize(type, src.data(), static_cast<int64_t>(src.size()), dst.data(), dst.size());
}

// Converts dst.size() elements.
inline void dequantize(int32_t type, std::span<const uint8_t> src, std::span<float> dst) {
    dequantize(type, src.data(), src.size(), static_cast<int64_t>(dst.size()), dst.data());
}
#endif

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

// Defaults of the C library (moe_model_params_init); change fields, then pass to Model::load.
inline moe_model_params model_params() {
    moe_model_params p;
    moe_model_params_init(&p);
    return p;
}

// An owned moe_model. Movable, not copyable. Every query throws Error on failure.
class Model {
public:
    // Loads a GGUF model. `progress`, when set, replaces params.progress / progress_user_data.
    static Model load(const std::string& path, const moe_model_params& params = model_params(),
                      const ProgressFn& progress = {}) {
        moe_model_params p = params;
        detail::ProgressBridge bridge(progress);
        if (progress) {
            p.progress = bridge.callback();
            p.progress_user_data = bridge.user_data();
        }
        moe_model* raw = nullptr;
        const moe_status status = moe_model_load(path.c_str(), &p, &raw);
        Model model(raw);  // owns the handle even if finish() throws
        bridge.finish(status);
        return model;
    }

    // Takes ownership of a handle from moe_model_load (may be NULL).
    explicit Model(moe_model* model) noexcept : model_(model) {}

    moe_model* get() noexcept { return model_.get(); }
    const moe_model* get() const noexcept { return model_.get(); }
    explicit operator bool() const noexcept { return model_ != nullptr; }

    // Strings in the result are borrowed from this model.
    moe_model_info info() const {
        moe_model_info info;
        moe_model_info_init(&info);
        check(moe_model_get_info(get(), &info));
        return info;
    }

    int32_t n_tensors() const { return info().n_tensors; }

    // Contexts created afterwards place their experts by this activation profile (nullptr clears it).
    void set_expert_profile(const char* path) { check(moe_model_set_expert_profile(get(), path)); }

    // Tensor `index` in [0, n_tensors); its name is borrowed from this model.
    moe_tensor_info tensor(int32_t index) const {
        moe_tensor_info t;
        moe_tensor_info_init(&t);
        check(moe_model_get_tensor(get(), index, &t));
        return t;
    }

    std::vector<moe_tensor_info> tensors() const {
        const int32_t n = n_tensors();
        std::vector<moe_tensor_info> out;
        out.reserve(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) out.push_back(tensor(i));
        return out;
    }

    std::optional<int32_t> find_tensor(const std::string& name) const {
        int32_t index = -1;
        const moe_status status = moe_model_find_tensor(get(), name.c_str(), &index);
        return detail::optional_if_found(status, index);
    }

    // Raw bytes of tensor `index`, in its stored type.
    void read_tensor(int32_t index, void* dst, uint64_t dst_size) const {
        check(moe_model_read_tensor(get(), index, dst, dst_size));
    }

    std::vector<uint8_t> read_tensor(int32_t index) const {
        std::vector<uint8_t> dst(static_cast<size_t>(tensor(index).n_bytes));
        read_tensor(index, dst.data(), dst.size());
        return dst;
    }

    // Metadata by key: std::nullopt when the key is absent; Error(INVALID_ARGUMENT) when its
    // value has another type.
    std::optional<int64_t> meta_int(const std::string& key) const {
        int64_t v = 0;
        const moe_status status = moe_model_meta_int(get(), key.c_str(), &v);
        return detail::optional_if_found(status, v);
    }

    std::optional<double> meta_float(const std::string& key) const {
        double v = 0.0;
        const moe_status status = moe_model_meta_float(get(), key.c_str(), &v);
        return detail::optional_if_found(status, v);
    }

    std::optional<std::string> meta_string(const std::string& key) const {
        const char* v = nullptr;
        const moe_status status = moe_model_meta_string(get(), key.c_str(), &v);
        if (status == MOE_STATUS_NOT_FOUND) return std::nullopt;
        check(status);
        return std::string(v != nullptr ? v : "");
    }

    // Metadata arrays. meta_type: std::nullopt when the key is absent.
    struct MetaType {
        int32_t type = 0;       // a moe_meta_type
        int32_t elem_type = -1; // arrays: their elements' moe_meta_type
        int64_t n = 1;          // arrays: their length
    };
    std::optional<MetaType> meta_type(const std::string& key) const {
        MetaType t;
        const moe_status status = moe_model_meta_type(get(), key.c_str(), &t.type, &t.elem_type, &t.n);
        return detail::optional_if_found(status, t);
    }
    std::vector<int64_t> meta_array_int(const std::string& key) const {
        return detail::sized_call<int64_t>(
            [&](int64_t* v, int64_t cap, int64_t* n) { return moe_model_meta_array_int(get(), key.c_str(), v, cap, n); });
    }
    std::vector<double> meta_array_float(const std::string& key) const {
        return detail::sized_call<double>(
            [&](double* v, int64_t cap, int64_t* n) { return moe_model_meta_array_float(get(), key.c_str(), v, cap, n); });
    }
    std::string meta_array_string(const std::string& key, int64_t index) const {
        const char* v = nullptr;
        uint64_t len = 0;
        check(moe_model_meta_array_string(get(), key.c_str(), index, &v, &len));
        return std::string(v, static_cast<size_t>(len));
    }

    // Tokenizer (see the "Text" section of moeinfer.h).
    std::vector<int32_t> tokenize(std::string_view text, bool add_special = true, bool parse_special = false) const {
        return detail::sized_call<int32_t>([&](int32_t* t, int64_t cap, int64_t* n) {
            return moe_tokenize(get(), text.data(), text.size(), add_special, parse_special, t, cap, n);
        });
    }
    std::string token_to_piece(int32_t token, bool render_special = false) const {
        const std::vector<char> b = detail::sized_call<char>([&](char* buf, int64_t cap, int64_t* n) {
            return moe_token_to_piece(get(), token, render_special, buf, cap, n);
        });
        return std::string(b.begin(), b.end());
    }
    std::string detokenize(const std::vector<int32_t>& tokens, bool render_special = false) const {
        const std::vector<char> b = detail::sized_call<char>([&](char* buf, int64_t cap, int64_t* n) {
            return moe_detokenize(get(), tokens.data(), static_cast<int64_t>(tokens.size()), render_special, buf, cap, n);
        });
        return std::string(b.begin(), b.end());
    }
    // Strings in the result are borrowed from this model.
    moe_vocab_info vocab_info() const {
        moe_vocab_info info;
        moe_vocab_info_init(&info);
        check(moe_model_get_vocab_info(get(), &info));
        return info;
    }
    std::string token_text(int32_t token) const {
        const char* t = nullptr;
        check(moe_token_get_text(get(), token, &t));
        return t;
    }
    int32_t token_type(int32_t token) const {
        int32_t t = 0;
        check(moe_token_get_type(get(), token, &t));
        return t;
    }
    bool is_eog(int32_t token) const {
        int32_t e = 0;
        check(moe_token_is_eog(get(), token, &e));
        return e != 0;
    }

private:
    detail::Handle<moe_model, moe_model_free> model_;
};

// Streaming detokenization: feed() returns whole UTF-8 characters only; flush() the rest. Borrows
// the Model, which must outlive it.
class Detokenizer {
public:
    explicit Detokenizer(const Model& model, bool render_special = false) {
        moe_detokenizer* raw = nullptr;
        check(moe_detokenizer_create(model.get(), render_special, &raw));
        detok_.reset(raw);
    }
    std::string feed(const int32_t* tokens, size_t n) {
        const std::vector<char> b = detail::sized_call<char>([&](char* buf, int64_t cap, int64_t* out_n) {
            return moe_detokenizer_feed(detok_.get(), tokens, static_cast<int64_t>(n), buf, cap, out_n);
        });
        return std::string(b.begin(), b.end());
    }
    std::string feed(const std::vector<int32_t>& tokens) { return feed(tokens.data(), tokens.size()); }
    std::string flush() {
        const std::vector<char> b = detail::sized_call<char>(
            [&](char* buf, int64_t cap, int64_t* out_n) { return moe_detokenizer_flush(detok_.get(), buf, cap, out_n); });
        return std::string(b.begin(), b.end());
    }

private:
    detail::Handle<moe_detokenizer, moe_detokenizer_free> detok_;
};

/* ---------------------------------------------------------------------------------------------
 * Chat templates
 * ------------------------------------------------------------------------------------------- */

// Defaults of the C library (moe_chat_params_init).
inline moe_chat_params chat_params() {
    moe_chat_params p;
    moe_chat_params_init(&p);
    return p;
}

// moe_chat_apply_template: `model` may be nullptr when template_text is given; template_text nullptr
// uses the model's tokenizer.chat_template. Strings in `messages` and `params` are borrowed.
inline std::string chat_apply_template(const Model* model, const char* template_text,
                                       const std::vector<moe_chat_message>& messages, bool add_generation_prompt,
                                       const moe_chat_params& params = chat_params()) {
    const std::vector<char> b = detail::sized_call<char>([&](char* buf, int64_t cap, int64_t* out_n) {
        return moe_chat_apply_template(model != nullptr ? model->get() : nullptr, template_text, messages.data(),
                                       static_cast<int64_t>(messages.size()), add_generation_prompt ? 1 : 0, &params,
                                       buf, cap, out_n);
    });
    return std::string(b.begin(), b.end());
}

// The built-in renderer's name for a template text (moe_chat_template_detect).
inline std::string chat_template_detect(const std::string& template_text) {
    const char* name = nullptr;
    check(moe_chat_template_detect(template_text.c_str(), &name));
    return name;
}

/* ---------------------------------------------------------------------------------------------
 * Contexts and decoding
 * ------------------------------------------------------------------------------------------- */

// Defaults of the C library (moe_context_params_init); change fields, then pass to Context::create.
inline moe_context_params context_params() {
    moe_context_params p;
    moe_context_params_init(&p);
    return p;
}

// The logits of the last decode: n_rows rows of n_vocab floats, row-major. Borrowed from the
// Context; valid until its next decode / kv_clear or its destruction.
struct Logits {
    const float* data = nullptr;
    int32_t n_rows = 0;
    int32_t n_vocab = 0;

    const float* row(int32_t i) const { return data + static_cast<size_t>(i) * static_cast<size_t>(n_vocab); }
    size_t size() const { return static_cast<size_t>(n_rows) * static_cast<size_t>(n_vocab); }
#ifdef MOEINFER_HPP_HAS_SPAN
    std::span<const float> values() const { return {data, size()}; }
    std::span<const float> row_span(int32_t i) const { return {row(i), static_cast<size_t>(n_vocab)}; }
#endif
};

// Time spent per op kind while profiling was on. `op` and `backend` are static strings.
using OpProfile = moe_op_profile;

// Defaults of the C library (moe_sched_policy_init); change fields, then pass to
// Context::set_policy or through moe_context_params.policy.
inline moe_sched_policy sched_policy() {
    moe_sched_policy p;
    moe_sched_policy_init(&p);
    return p;
}

// Applies an offload spec ("mul_mat_id=512,moe_up_gate=off", see moe_sched_policy_parse_offload) to
// `policy`; throws Error(INVALID_ARGUMENT) naming the bad entry, leaving `policy` unchanged.
inline void parse_offload(moe_sched_policy& policy, const std::string& spec) {
    check(moe_sched_policy_parse_offload(&policy, spec.c_str()));
}

// MOE_OFFLOAD_MUL_MAT -> "mul_mat"; std::nullopt for unknown ops.
inline std::optional<std::string> offload_op_name(int32_t op) {
    const char* name = moe_offload_op_name(op);
    if (name == nullptr) return std::nullopt;
    return std::string(name);
}

// Where a weight tensor lives (moe_context_tensor_location).
struct TensorLocation {
    int32_t location = MOE_LOCATION_HOST;  // a moe_location
    bool duplicated = false;               // a copy is also kept on the other side
};

// An owned moe_context: one sequence (KV cache, ubatch loop, logits) over a Model. Movable, not
// copyable. The Model must outlive the Context. Use it from one thread at a time.
class Context {
public:
    // `progress`, when set, replaces params.progress / progress_user_data.
    static Context create(Model& model, const moe_context_params& params = context_params(),
                          const ProgressFn& progress = {}) {
        moe_context_params p = params;
        detail::ProgressBridge bridge(progress);
        if (progress) {
            p.progress = bridge.callback();
            p.progress_user_data = bridge.user_data();
        }
        moe_context* raw = nullptr;
        const moe_status status = moe_context_create(model.get(), &p, &raw);
        Context ctx(raw);  // owns the handle even if finish() throws
        bridge.finish(status);
        return ctx;
    }

    // Takes ownership of a handle from moe_context_create (may be NULL).
    explicit Context(moe_context* ctx) noexcept : ctx_(ctx) {}

    moe_context* get() noexcept { return ctx_.get(); }
    const moe_context* get() const noexcept { return ctx_.get(); }
    explicit operator bool() const noexcept { return ctx_ != nullptr; }

    // Evaluates n_tokens tokens (see moe_decode). positions == nullptr continues the sequence;
    // otherwise n_tokens consecutive positions starting at or before n_past(). logits_all keeps
    // every token's logits (else only the last one's). Returns the logits view.
    Logits decode(const int32_t* tokens, int32_t n_tokens, const int32_t* positions = nullptr,
                  bool logits_all = false) {
        check(moe_decode(get(), tokens, positions, n_tokens, logits_all ? 1 : 0));
        return logits();
    }

    // An empty `positions` continues the sequence; otherwise it has one entry per token.
    Logits decode(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions = {},
                  bool logits_all = false) {
        return decode_n(tokens.data(), tokens.size(), positions.data(), positions.size(), logits_all);
    }

#ifdef MOEINFER_HPP_HAS_SPAN
    Logits decode(std::span<const int32_t> tokens, std::span<const int32_t> positions = {},
                  bool logits_all = false) {
        return decode_n(tokens.data(), tokens.size(), positions.data(), positions.size(), logits_all);
    }
#endif

    // decode with size_t counts, as containers give them: n_positions == 0 continues the sequence,
    // otherwise it must equal n_tokens. Error(INVALID_ARGUMENT) for counts the C API cannot take.
    Logits decode_n(const int32_t* tokens, size_t n_tokens, const int32_t* positions, size_t n_positions,
                    bool logits_all) {
        // An empty container's data() may be NULL, which the C API would report instead.
        if (n_tokens == 0) throw Error(MOE_STATUS_INVALID_ARGUMENT, "decode: n_tokens must be > 0 (no tokens given)");
        // n_tokens is an int32_t in the C API; larger counts would wrap around.
        if (n_tokens > static_cast<size_t>(INT32_MAX)) {
            throw Error(MOE_STATUS_INVALID_ARGUMENT,
                        "decode: " + std::to_string(n_tokens) + " tokens exceed INT32_MAX");
        }
        if (n_positions != 0 && n_positions != n_tokens) {
            throw Error(MOE_STATUS_INVALID_ARGUMENT, "decode: " + std::to_string(n_positions) +
                                                         " positions for " + std::to_string(n_tokens) + " tokens");
        }
        return decode(tokens, static_cast<int32_t>(n_tokens), n_positions != 0 ? positions : nullptr, logits_all);
    }

    // Logits of the last decode; Error(FAILED_PRECONDITION) when there is none.
    Logits logits() const {
        Logits l;
        check(moe_get_logits(get(), &l.data, &l.n_rows, &l.n_vocab));
        return l;
    }

    // Tokens in the KV cache: the position the next decode continues from.
    int32_t n_past() const {
        int32_t n = 0;
        check(moe_context_n_past(get(), &n));
        return n;
    }

    // Empties the KV cache; the next decode starts a new sequence at position 0.
    void kv_clear() { check(moe_kv_clear(get())); }

    // The moe_device the context computes on (MOE_DEVICE_AUTO resolved to CPU or CUDA).
    int32_t device() const {
        int32_t d = MOE_DEVICE_CPU;
        check(moe_context_get_device(get(), &d));
        return d;
    }

    // Turns per-op timing on or off (it synchronises after every op) and resets the counters.
    void set_profiling(bool enabled) { check(moe_context_set_profiling(get(), enabled ? 1 : 0)); }

    // Op kinds evaluated since profiling was turned on, with their counts and wall time.
    std::vector<OpProfile> profile() const {
        int32_t n = 0;
        check(moe_context_get_profile(get(), nullptr, 0, &n));
        std::vector<OpProfile> out(static_cast<size_t>(n));
        int32_t got = 0;
        check(moe_context_get_profile(get(), out.data(), n, &got));
        out.resize(static_cast<size_t>(std::min(n, got)));  // the set cannot grow between the calls
        return out;
    }

    // Records the last `capacity` ubatches' timing from now on (0: off), dropping what was recorded.
    void set_timeline(int32_t capacity) { check(moe_context_set_timeline(get(), capacity)); }

    // The recorded ubatches, oldest first; `dropped` (if given) receives those the ring no longer holds.
    std::vector<moe_ubatch_timing> timeline(uint64_t* dropped = nullptr) const {
        int32_t n = 0;
        check(moe_context_get_timeline(get(), nullptr, 0, &n, nullptr));
        std::vector<moe_ubatch_timing> out(static_cast<size_t>(n));
        int32_t got = 0;
        check(moe_context_get_timeline(get(), out.data(), n, &got, dropped));
        out.resize(static_cast<size_t>(std::min(n, got)));
        return out;
    }

    // Replaces the scheduling policy (from the next decode on).
    void set_policy(const moe_sched_policy& policy) { check(moe_context_set_policy(get(), &policy)); }

    // The policy in use, defaults resolved (min_batch -1 replaced by the threshold in use).
    moe_sched_policy policy() const {
        moe_sched_policy p = sched_policy();
        check(moe_context_get_policy(get(), &p));
        return p;
    }

    // Location of the weight tensor `name`; std::nullopt when the model has no such tensor.
    std::optional<TensorLocation> tensor_location(const std::string& name) const {
        int32_t location = MOE_LOCATION_HOST;
        int32_t duplicated = 0;
        const moe_status status = moe_context_tensor_location(get(), name.c_str(), &location, &duplicated);
        return detail::optional_if_found(status, TensorLocation{location, duplicated != 0});
    }

    // Scheduler statistics since creation or the last reset_stats().
    moe_sched_stats stats() const {
        moe_sched_stats s{};  // no _init function: zeroed, with struct_size set
        s.struct_size = sizeof s;
        check(moe_context_get_stats(get(), &s));
        return s;
    }

    // The devices the context computes on (moe_context_get_n_devices): 1 for one device or the CPU.
    int32_t n_devices() const {
        int32_t n = 0;
        check(moe_context_get_n_devices(get(), &n));
        return n;
    }

    // Device `index` of the context: its kind, ordinal and layers.
    moe_device_info device_info(int32_t index) const {
        moe_device_info d{};
        d.struct_size = sizeof d;
        check(moe_context_get_device_info(get(), index, &d));
        return d;
    }

    // The statistics of device `index` alone (moe_context_get_device_stats).
    moe_sched_stats device_stats(int32_t index) const {
        moe_sched_stats s{};
        s.struct_size = sizeof s;
        check(moe_context_get_device_stats(get(), index, &s));
        return s;
    }

    // Writes the expert counts as an activation profile (moe_model_set_expert_profile reads it).
    void save_expert_profile(const std::string& path) const {
        check(moe_context_save_expert_profile(get(), path.c_str()));
    }

    // Per layer: the experts in device memory and their bytes (moe_context_get_resident_experts).
    struct ResidentExperts {
        std::vector<int32_t> n_experts;
        std::vector<uint64_t> bytes;
    };
    ResidentExperts resident_experts() const {
        int32_t n = 0;
        check(moe_context_get_resident_experts(get(), nullptr, nullptr, 0, &n));
        ResidentExperts out{std::vector<int32_t>(static_cast<size_t>(n)), std::vector<uint64_t>(static_cast<size_t>(n))};
        check(moe_context_get_resident_experts(get(), out.n_experts.data(), out.bytes.data(), n, &n));
        return out;
    }

    // Tokens routed to each expert, as counts[layer * n_expert + expert] (see stats().n_layer / n_expert).
    std::vector<uint64_t> expert_counts() const {
        int64_t n = 0;
        check(moe_context_get_expert_counts(get(), nullptr, 0, &n));
        std::vector<uint64_t> out(static_cast<size_t>(n));
        int64_t got = 0;
        check(moe_context_get_expert_counts(get(), out.data(), n, &got));
        out.resize(static_cast<size_t>(std::min(n, got)));
        return out;
    }

    // The expert cache's counts per layer (moe_context_get_expert_cache_layers).
    struct ExpertCacheLayers {
        std::vector<uint64_t> hits, misses, bytes_saved;
    };
    ExpertCacheLayers expert_cache_layers() const {
        int64_t n = 0;
        check(moe_context_get_expert_cache_layers(get(), nullptr, nullptr, nullptr, 0, &n));
        ExpertCacheLayers out;
        for (std::vector<uint64_t>* v : {&out.hits, &out.misses, &out.bytes_saved}) v->resize(static_cast<size_t>(n));
        check(moe_context_get_expert_cache_layers(get(), out.hits.data(), out.misses.data(), out.bytes_saved.data(),
                                                  n, &n));
        return out;
    }

    // Zeroes the statistics and expert counts (placement figures stay).
    void reset_stats() { check(moe_context_reset_stats(get())); }

private:
    detail::Handle<moe_context, moe_context_free> ctx_;
};

/* ---------------------------------------------------------------------------------------------
 * Synthetic models
 * ------------------------------------------------------------------------------------------- */

// Defaults for `architecture` ("qwen3moe" or "gpt-oss"); throws Error for other names.
inline moe_synth_params synth_params(const std::string& architecture = "qwen3moe") {
    moe_synth_params p;
    check(moe_synth_params_init(&p, architecture.c_str()));
    return p;
}

// Writes a synthetic model to `path`. The strings in `params` are borrowed during the call.
// `progress`, when set, replaces params.progress / progress_user_data.
inline void synth_write(const std::string& path, const moe_synth_params& params, const ProgressFn& progress = {}) {
    moe_synth_params p = params;
    detail::ProgressBridge bridge(progress);
    if (progress) {
        p.progress = bridge.callback();
        p.progress_user_data = bridge.user_data();
    }
    bridge.finish(moe_synth_write(path.c_str(), &p));
}

/* ---------------------------------------------------------------------------------------------
 * Bandwidth measurement
 * ------------------------------------------------------------------------------------------- */

// Defaults of the C library (moe_bandwidth_params_init); change fields, then pass to measure_bandwidth.
inline moe_bandwidth_params bandwidth_params() {
    moe_bandwidth_params p;
    moe_bandwidth_params_init(&p);
    return p;
}

// Host read and (for MOE_DEVICE_CUDA) host<->device copy bandwidths; throws Error on failure.
inline moe_bandwidth_result measure_bandwidth(const moe_bandwidth_params& params = bandwidth_params()) {
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    check(moe_measure_bandwidth(&params, &r));
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

// Defaults of the C library (moe_sampler_params_init); change fields, then pass to Sampler::create.
inline moe_sampler_params sampler_params() {
    moe_sampler_params p;
    moe_sampler_params_init(&p);
    return p;
}

// The candidates left after a sampler's chain, most probable first (moe_sampler_apply).
struct Candidates {
    std::vector<int32_t> ids;
    std::vector<float> probs;
};

// An owned moe_sampler (the chain and its order: moeinfer.h, "Sampling"). Movable, not copyable; one
// thread at a time. Every call throws Error on failure.
class Sampler {
public:
    // params.logit_bias is copied during the call.
    static Sampler create(int32_t n_vocab, const moe_sampler_params& params = sampler_params()) {
        moe_sampler* raw = nullptr;
        check(moe_sampler_create(&params, n_vocab, &raw));
        return Sampler(raw, n_vocab);
    }

    // Takes ownership of a handle from moe_sampler_create (may be NULL) made for n_vocab tokens.
    Sampler(moe_sampler* sampler, int32_t n_vocab) noexcept : sampler_(sampler), n_vocab_(n_vocab) {}

    moe_sampler* get() noexcept { return sampler_.get(); }
    const moe_sampler* get() const noexcept { return sampler_.get(); }
    explicit operator bool() const noexcept { return sampler_ != nullptr; }
    int32_t n_vocab() const noexcept { return n_vocab_; }

    // The next token from logits[0, n_vocab). Not accepted: call accept() with the tokens kept.
    int32_t sample(const float* logits, int32_t n_vocab) {
        int32_t token = -1;
        check(moe_sampler_sample(get(), logits, n_vocab, &token));
        return token;
    }

    // Feeds the penalties' history.
    void accept(const int32_t* tokens, int32_t n_tokens) { check(moe_sampler_accept(get(), tokens, n_tokens)); }
    void accept(int32_t token) { accept(&token, 1); }
    void accept(const std::vector<int32_t>& tokens) { accept(tokens.data(), static_cast<int32_t>(tokens.size())); }

    // The chain without a draw: at most max_n candidates (< 0: all), most probable first.
    Candidates apply(const float* logits, int32_t n_vocab, int32_t max_n = -1) {
        const int32_t capacity = max_n < 0 ? std::max(n_vocab, 0) : max_n;
        Candidates c;
        c.ids.resize(static_cast<size_t>(capacity));
        c.probs.resize(static_cast<size_t>(capacity));
        int32_t n = 0;
        check(moe_sampler_apply(get(), logits, n_vocab, c.ids.data(), c.probs.data(), capacity, &n));
        c.ids.resize(static_cast<size_t>(std::min(n, capacity)));
        c.probs.resize(c.ids.size());
        return c;
    }

    // Empties the history and re-seeds the PRNG: draws repeat from the start.
    void reset() { check(moe_sampler_reset(get())); }

    // The seed in use (the drawn one for MOE_SAMPLER_SEED_RANDOM).
    uint64_t seed() const {
        uint64_t s = 0;
        check(moe_sampler_get_seed(get(), &s));
        return s;
    }

private:
    detail::Handle<moe_sampler, moe_sampler_free> sampler_;
    int32_t n_vocab_ = 0;
};

/* ---------------------------------------------------------------------------------------------
 * Generation (moeinfer.h, "Generation")
 * ------------------------------------------------------------------------------------------- */

inline moe_generate_params generate_params() {
    moe_generate_params p;
    moe_generate_params_init(&p);
    return p;
}

struct GenerateOptions {
    int32_t max_tokens = 128;        // >= 0
    std::vector<std::string> stop;   // non-empty strings
    bool render_special = false;
};

struct GenerateResult {
    std::vector<int32_t> tokens;     // generated ids (the end-of-generation token excluded; at most 2^20)
    moe_generate_result stats{};     // reuse, counts, stop reason, times
};

// Receives each piece of text; returns false to stop. An exception it throws stops the generation and
// reaches the caller unchanged.
using PieceFn = std::function<bool(const char* text, size_t len)>;

// Runs moe_generate: prompt (at least one id), sampler (nullptr: greedy). Throws Error on failure.
inline GenerateResult generate(Context& ctx, const std::vector<int32_t>& prompt, Sampler* sampler,
                               const GenerateOptions& options = {}, const PieceFn& on_piece = {}) {
    struct Bridge {
        const PieceFn* fn;
        std::exception_ptr error;
        static int call(const char* text, size_t len, void* user) {
            auto* b = static_cast<Bridge*>(user);
            try {
                return (*b->fn)(text, len) ? 1 : 0;
            } catch (...) {
                b->error = std::current_exception();
                return 0;
            }
        }
    } bridge{&on_piece, nullptr};
    std::vector<const char*> stops;
    for (const std::string& s : options.stop) stops.push_back(s.c_str());
    GenerateResult r;
    // Room for max_tokens ids, up to 2^20 (max_tokens may be INT32_MAX for "until the end"): a generation
    // longer than that keeps only its first 2^20 ids in `tokens`.
    r.tokens.resize(static_cast<size_t>(std::clamp(options.max_tokens, 0, 1 << 20)));
    moe_generate_params p = generate_params();
    p.max_tokens = options.max_tokens;
    p.stop = stops.data();
    p.n_stop = static_cast<int32_t>(stops.size());
    p.render_special = options.render_special ? 1 : 0;
    if (on_piece) {
        p.on_piece = &Bridge::call;
        p.user_data = &bridge;
    }
    p.tokens = r.tokens.data();
    p.tokens_capacity = static_cast<int32_t>(r.tokens.size());
    moe_generate_result_init(&r.stats);
    const moe_status status = moe_generate(ctx.get(), prompt.data(), static_cast<int32_t>(prompt.size()),
                                           sampler != nullptr ? sampler->get() : nullptr, &p, &r.stats);
    if (bridge.error) std::rethrow_exception(bridge.error);
    check(status);
    r.tokens.resize(std::min(r.tokens.size(), static_cast<size_t>(r.stats.n_generated)));
    return r;
}

}  // namespace moeinfer

#endif /* MOEINFER_HPP */
