// C API: tokenizer, detokenizer, vocabulary queries and metadata arrays.
#include <cstring>
#include <string>
#include <vector>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/model.h"
#include "text/detokenize.h"
#include "text/tokenize.h"

struct moe_detokenizer {
    const moe_model* model;
    moe::text::Detokenizer state;
};

namespace {

moe::StatusOr<const moe::text::Vocab*> vocab_of(const moe_model* model) {
    if (model->vocab == nullptr) {
        return moe::failed_precondition("the model has no tokenizer (no tokenizer.ggml.model in its metadata)");
    }
    return model->vocab.get();
}

moe::Status check_token(const moe::text::Vocab& v, int64_t token, const char* what) {
    if (token < 0 || token >= v.n_tokens()) {
        return moe::out_of_range(std::string(what) + " " + std::to_string(token) + " is outside the vocabulary [0, " +
                                 std::to_string(v.n_tokens()) + ")");
    }
    return moe::Status::ok();
}

moe::Status check_tokens(const moe::text::Vocab& v, const int32_t* tokens, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= v.n_tokens()) {
            return moe::out_of_range("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                     " is outside the vocabulary [0, " + std::to_string(v.n_tokens()) + ")");
        }
    }
    return moe::Status::ok();
}

moe::Status check_buffer(const void* buf, int64_t capacity, const char* name) {
    if (capacity < 0) return moe::invalid_argument("capacity is " + std::to_string(capacity));
    if (capacity > 0 && buf == nullptr) return moe::invalid_argument(std::string(name) + " is NULL with capacity > 0");
    return moe::Status::ok();
}

// The buffer rule of this section: *out_n = size needed; copied only when it fits.
template <typename T>
bool copy_out(const T* src, size_t n, T* dst, int64_t capacity, int64_t* out_n) {
    *out_n = static_cast<int64_t>(n);
    if (static_cast<uint64_t>(capacity) < n) return false;
    if (n > 0) std::memcpy(dst, src, n * sizeof(T));
    return true;
}

moe::StatusOr<const moe::GgufValue*> find_meta(const moe_model* model, const char* key) {
    const moe::GgufValue* v = model->file->find(key);
    if (v == nullptr) return moe::not_found(std::string("no metadata key '") + key + "'");
    return v;
}

bool is_integer_type(moe::GgufValueType t) {
    using T = moe::GgufValueType;
    return t != T::STRING && t != T::ARRAY && t != T::FLOAT32 && t != T::FLOAT64;
}

moe::StatusOr<const moe::GgufValue*> find_array(const moe_model* model, const char* key, bool (*elem_ok)(moe::GgufValueType),
                                                const char* what) {
    MOE_ASSIGN_OR_RETURN(const moe::GgufValue* v, find_meta(model, key));
    if (v->type != moe::GgufValueType::ARRAY || !elem_ok(v->array_type)) {
        const std::string found = v->type == moe::GgufValueType::ARRAY
                                      ? std::string("an array of ") + moe::gguf_value_type_name(v->array_type)
                                      : std::string("a ") + moe::gguf_value_type_name(v->type);
        return moe::invalid_argument(std::string("metadata '") + key + "' is " + found + ", not an array of " + what);
    }
    return v;
}

}  // namespace

extern "C" {

MOE_API moe_status moe_tokenize(const moe_model* model, const char* text, size_t text_len, int32_t add_special,
                                int32_t parse_special, int32_t* tokens, int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(text != nullptr || text_len == 0, "text is NULL with text_len > 0");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(tokens, capacity, "tokens"));
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    moe::text::TokenizeOptions opt;
    opt.add_special = add_special != 0;
    opt.parse_special = parse_special != 0;
    std::vector<int32_t> ids;
    moe::text::tokenize(*v, std::string_view(text != nullptr ? text : "", text_len), opt, ids);
    copy_out(ids.data(), ids.size(), tokens, capacity, out_n);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_token_to_piece(const moe_model* model, int32_t token, int32_t render_special, char* buf,
                                      int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(buf, capacity, "buf"));
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    MOE_RETURN_API(check_token(*v, token, "token"));
    std::string piece;
    moe::text::token_to_piece(*v, token, render_special != 0, piece);
    copy_out(piece.data(), piece.size(), buf, capacity, out_n);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_detokenize(const moe_model* model, const int32_t* tokens, int64_t n_tokens,
                                  int32_t render_special, char* buf, int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(n_tokens >= 0, "n_tokens is negative");
    MOE_CHECK_ARG(tokens != nullptr || n_tokens == 0, "tokens is NULL with n_tokens > 0");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(buf, capacity, "buf"));
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    MOE_RETURN_API(check_tokens(*v, tokens, n_tokens));
    moe::text::Detokenizer d(*v, render_special != 0);
    std::string text;
    d.feed(tokens, static_cast<size_t>(n_tokens), text);
    d.flush(text);
    copy_out(text.data(), text.size(), buf, capacity, out_n);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_detokenizer_create(const moe_model* model, int32_t render_special, moe_detokenizer** out_detok) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_detok != nullptr, "out_detok is NULL");
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    *out_detok = new moe_detokenizer{model, moe::text::Detokenizer(*v, render_special != 0)};
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API void moe_detokenizer_free(moe_detokenizer* detok) { delete detok; }

MOE_API moe_status moe_detokenizer_feed(moe_detokenizer* detok, const int32_t* tokens, int64_t n_tokens, char* buf,
                                        int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(detok != nullptr, "detok is NULL");
    MOE_CHECK_ARG(n_tokens >= 0, "n_tokens is negative");
    MOE_CHECK_ARG(tokens != nullptr || n_tokens == 0, "tokens is NULL with n_tokens > 0");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(buf, capacity, "buf"));
    MOE_RETURN_API(check_tokens(*detok->model->vocab, tokens, n_tokens));
    moe::text::Detokenizer next = detok->state;  // committed only when the text fits
    std::string text;
    next.feed(tokens, static_cast<size_t>(n_tokens), text);
    if (copy_out(text.data(), text.size(), buf, capacity, out_n)) detok->state = next;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_detokenizer_flush(moe_detokenizer* detok, char* buf, int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(detok != nullptr, "detok is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(buf, capacity, "buf"));
    moe::text::Detokenizer next = detok->state;
    std::string text;
    next.flush(text);
    if (copy_out(text.data(), text.size(), buf, capacity, out_n)) detok->state = next;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API void moe_vocab_info_init(moe_vocab_info* info) {
    if (info == nullptr) return;
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    info->model = "";
    info->pre = "";
    info->bos = info->eos = info->eot = info->eom = info->unk = info->pad = -1;
}

MOE_API moe_status moe_model_get_vocab_info(const moe_model* model, moe_vocab_info* out_info) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_info != nullptr, "out_info is NULL");
    MOE_CHECK_ARG(out_info->struct_size >= sizeof(uint32_t), "out_info->struct_size is 0 (call moe_vocab_info_init first)");
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    moe_vocab_info info;
    moe_vocab_info_init(&info);
    info.model = v->model_name().c_str();
    info.pre = v->pre_name().c_str();
    info.n_tokens = v->n_tokens();
    info.bos = v->bos();
    info.eos = v->eos();
    info.eot = v->eot();
    info.eom = v->eom();
    info.unk = v->unk();
    info.pad = v->pad();
    info.add_bos = v->add_bos() ? 1 : 0;
    info.add_eos = v->add_eos() ? 1 : 0;
    info.add_space_prefix = v->add_space_prefix() ? 1 : 0;
    info.n_eog = static_cast<int32_t>(v->eog_ids().size());
    moe::write_sized(info, out_info);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_token_get_text(const moe_model* model, int32_t token, const char** out_text) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_text != nullptr, "out_text is NULL");
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    MOE_RETURN_API(check_token(*v, token, "token"));
    *out_text = v->text(token).c_str();
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_token_get_type(const moe_model* model, int32_t token, int32_t* out_type) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_type != nullptr, "out_type is NULL");
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    MOE_RETURN_API(check_token(*v, token, "token"));
    *out_type = static_cast<int32_t>(v->type(token));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_token_is_eog(const moe_model* model, int32_t token, int32_t* out_is_eog) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_is_eog != nullptr, "out_is_eog is NULL");
    MOE_API_ASSIGN(const moe::text::Vocab* v, vocab_of(model));
    MOE_RETURN_API(check_token(*v, token, "token"));
    *out_is_eog = v->is_eog(token) ? 1 : 0;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_type(const moe_model* model, const char* key, int32_t* out_type,
                                       int32_t* out_elem_type, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_type != nullptr, "out_type is NULL");
    MOE_API_ASSIGN(const moe::GgufValue* v, find_meta(model, key));
    const bool array = v->type == moe::GgufValueType::ARRAY;
    *out_type = static_cast<int32_t>(v->type);
    if (out_elem_type != nullptr) *out_elem_type = array ? static_cast<int32_t>(v->array_type) : -1;
    if (out_n != nullptr) *out_n = array ? static_cast<int64_t>(v->array.size()) : 1;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_array_int(const moe_model* model, const char* key, int64_t* values,
                                            int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(values, capacity, "values"));
    MOE_API_ASSIGN(const moe::GgufValue* v, find_array(model, key, is_integer_type, "integers"));
    const size_t n = v->array.size();
    *out_n = static_cast<int64_t>(n);
    if (static_cast<uint64_t>(capacity) < n) return MOE_STATUS_OK;
    for (size_t i = 0; i < n; ++i) {
        const moe::GgufValue& e = v->array[i];
        // uint64 values past INT64_MAX keep their bits (as C's conversion would); documented as int64.
        values[i] = e.type == moe::GgufValueType::UINT64 ? static_cast<int64_t>(e.u) : e.i;
    }
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_array_float(const moe_model* model, const char* key, double* values,
                                              int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_RETURN_API(check_buffer(values, capacity, "values"));
    auto numeric = [](moe::GgufValueType t) { return t != moe::GgufValueType::STRING && t != moe::GgufValueType::ARRAY; };
    MOE_API_ASSIGN(const moe::GgufValue* v, find_array(model, key, numeric, "numbers"));
    const size_t n = v->array.size();
    *out_n = static_cast<int64_t>(n);
    if (static_cast<uint64_t>(capacity) < n) return MOE_STATUS_OK;
    for (size_t i = 0; i < n; ++i) {
        const moe::GgufValue& e = v->array[i];
        values[i] = e.is_float() ? e.f
                    : e.type == moe::GgufValueType::UINT64 ? static_cast<double>(e.u)
                                                           : static_cast<double>(e.i);
    }
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_array_string(const moe_model* model, const char* key, int64_t index,
                                               const char** out_value, uint64_t* out_len) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_value != nullptr, "out_value is NULL");
    auto is_string = [](moe::GgufValueType t) { return t == moe::GgufValueType::STRING; };
    MOE_API_ASSIGN(const moe::GgufValue* v, find_array(model, key, is_string, "strings"));
    if (index < 0 || static_cast<uint64_t>(index) >= v->array.size()) {
        return moe::api_return(moe::out_of_range("index " + std::to_string(index) + " is outside [0, " +
                                                 std::to_string(v->array.size()) + ") of '" + key + "'"));
    }
    const std::string& s = v->array[static_cast<size_t>(index)].s;
    *out_value = s.c_str();
    if (out_len != nullptr) *out_len = s.size();
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
