// C API: model loading and queries.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/model.h"

namespace {

moe::Status check_struct_size(uint32_t struct_size, size_t min_size, const char* what) {
    if (struct_size < min_size) {
        return moe::invalid_argument(std::string(what) + "->struct_size is " + std::to_string(struct_size) +
                                     " (at least " + std::to_string(min_size) + "; call the _init function first)");
    }
    return moe::Status::ok();
}

// The reader calls a type mismatch DATA_CORRUPT (the file disagrees with what a model needs); to a
// caller asking for a key of the wrong type it is an invalid argument, as the header documents.
template <typename T>
moe::StatusOr<T> as_caller_error(moe::StatusOr<T> v) {
    if (!v.is_ok() && v.status().code() == MOE_STATUS_DATA_CORRUPT) {
        return moe::invalid_argument(v.status().message());
    }
    return v;
}

}  // namespace

extern "C" {

MOE_API void moe_model_params_init(moe_model_params* params) {
    if (params == nullptr) return;
    std::memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->use_mmap = 1;
}

MOE_API void moe_model_info_init(moe_model_info* info) {
    if (info == nullptr) return;
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

MOE_API void moe_tensor_info_init(moe_tensor_info* info) {
    if (info == nullptr) return;
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

MOE_API moe_status moe_model_load(const char* path, const moe_model_params* params, moe_model** out_model) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(path != nullptr, "path is NULL");
    MOE_CHECK_ARG(out_model != nullptr, "out_model is NULL");
    moe_model_params p;
    moe_model_params_init(&p);
    if (params != nullptr) {
        // Copy only the fields the caller's struct has; the rest keep their defaults.
        MOE_RETURN_API(check_struct_size(params->struct_size, offsetof(moe_model_params, use_mmap) + sizeof(int32_t), "params"));
        p = moe::read_sized(*params, p);
    }
    moe::StatusOr<std::unique_ptr<moe_model>> model = moe::load_model(path, p);
    if (!model.is_ok()) return moe::api_return(model.status());
    *out_model = std::move(model).value().release();
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API void moe_model_free(moe_model* model) { delete model; }

MOE_API moe_status moe_model_get_info(const moe_model* model, moe_model_info* out_info) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_info != nullptr, "out_info is NULL");
    MOE_RETURN_API(check_struct_size(out_info->struct_size, sizeof(uint32_t), "out_info"));
    const moe::HParams& hp = model->hparams;
    moe_model_info info;
    moe_model_info_init(&info);
    info.architecture = hp.arch_name.c_str();
    info.name = hp.name.c_str();
    info.n_layer = hp.n_layer;
    info.n_embd = hp.n_embd;
    info.n_vocab = hp.n_vocab;
    info.n_head = hp.n_head;
    info.n_head_kv = hp.n_head_kv;
    info.head_dim = hp.head_dim;
    info.n_expert = hp.n_expert;
    info.n_expert_used = hp.n_expert_used;
    info.n_ff_expert = hp.n_ff_expert;
    info.n_ctx_train = hp.n_ctx_train;
    info.sliding_window = hp.sliding_window;
    info.n_tensors = static_cast<int32_t>(model->file->tensors().size());
    info.n_bytes = model->n_bytes;
    info.n_expert_bytes = model->n_expert_bytes;
    moe::write_sized(info, out_info);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_get_tensor(const moe_model* model, int32_t index, moe_tensor_info* out_info) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_info != nullptr, "out_info is NULL");
    MOE_RETURN_API(check_struct_size(out_info->struct_size, sizeof(uint32_t), "out_info"));
    const auto& tensors = model->file->tensors();
    if (index < 0 || static_cast<size_t>(index) >= tensors.size()) {
        return moe::api_return(moe::out_of_range("tensor index " + std::to_string(index) + " is outside [0, " +
                                                 std::to_string(tensors.size()) + ")"));
    }
    const moe::GgufTensorInfo& t = tensors[static_cast<size_t>(index)];
    moe_tensor_info info;
    moe_tensor_info_init(&info);
    info.name = t.name.c_str();
    info.type = static_cast<int32_t>(t.type);
    info.n_dims = t.n_dims;
    for (int d = 0; d < MOE_MAX_DIMS; ++d) info.ne[d] = t.ne[d];
    info.n_bytes = t.n_bytes;
    info.file_offset = t.file_offset;
    moe::write_sized(info, out_info);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_find_tensor(const moe_model* model, const char* name, int32_t* out_index) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(name != nullptr, "name is NULL");
    MOE_CHECK_ARG(out_index != nullptr, "out_index is NULL");
    const int64_t index = model->file->tensor_index(name);
    if (index < 0) return moe::api_return(moe::not_found(std::string("no tensor named '") + name + "'"));
    *out_index = static_cast<int32_t>(index);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_read_tensor(const moe_model* model, int32_t index, void* dst, uint64_t dst_size) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(dst != nullptr, "dst is NULL");
    const auto& tensors = model->file->tensors();
    if (index < 0 || static_cast<size_t>(index) >= tensors.size()) {
        return moe::api_return(moe::out_of_range("tensor index " + std::to_string(index) + " is outside [0, " +
                                                 std::to_string(tensors.size()) + ")"));
    }
    const moe::GgufTensorInfo& t = tensors[static_cast<size_t>(index)];
    if (dst_size < t.n_bytes) {
        return moe::api_return(moe::invalid_argument("dst_size: " + std::to_string(dst_size) + " bytes given, " +
                                                     std::to_string(t.n_bytes) + " needed for '" + t.name + "'"));
    }
    std::memcpy(dst, model->file->tensor_data(t), t.n_bytes);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_int(const moe_model* model, const char* key, int64_t* out_value) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_value != nullptr, "out_value is NULL");
    MOE_API_ASSIGN(*out_value, as_caller_error(model->file->get_int(key)));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_float(const moe_model* model, const char* key, double* out_value) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_value != nullptr, "out_value is NULL");
    MOE_API_ASSIGN(*out_value, as_caller_error(model->file->get_float(key)));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_meta_string(const moe_model* model, const char* key, const char** out_value) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(key != nullptr, "key is NULL");
    MOE_CHECK_ARG(out_value != nullptr, "out_value is NULL");
    const moe::GgufValue* v = model->file->find(key);
    if (v == nullptr) return moe::api_return(moe::not_found(std::string("no metadata key '") + key + "'"));
    if (v->type != moe::GgufValueType::STRING) {
        return moe::api_return(moe::invalid_argument(std::string("metadata '") + key + "' is a " +
                                                     moe::gguf_value_type_name(v->type) + ", not a string"));
    }
    *out_value = v->s.c_str();  // borrowed from the model
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
