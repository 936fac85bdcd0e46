// A tiny synthetic model for the tests that go through the public API: written to a temporary GGUF
// (per process and seed: ctest runs some cases in two processes at once), loaded, removed at the end.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

#include "moeinfer/moeinfer.h"

namespace moe::test {

struct TinyModelOptions {
    int32_t expert_type = MOE_TYPE_Q8_0;
    int32_t n_embd = 0;       // 0: the "tiny" preset's
    int32_t head_dim = 0;     // 0: the preset's
    int32_t n_layer = 0;      // 0: the preset's
    int32_t n_ff_expert = 0;  // 0: the preset's
    float routing_skew = 0.0f;
};

class TinyModel {
public:
    TinyModel(const char* arch, const std::string& tag, uint64_t seed, const TinyModelOptions& o = {})
        : path_((std::filesystem::temp_directory_path() /
                 (tag + "_" + arch + "_" + std::to_string(seed) + "_" + std::to_string(getpid()) + ".gguf"))
                    .string()) {
        moe_synth_params sp;
        REQUIRE(moe_synth_params_init(&sp, arch) == MOE_STATUS_OK);
        sp.preset = "tiny";
        sp.expert_type = o.expert_type;
        sp.dense_type = MOE_TYPE_Q8_0;
        sp.seed = seed;
        sp.routing_skew = o.routing_skew;
        if (o.n_embd > 0) sp.n_embd = o.n_embd;
        if (o.head_dim > 0) sp.head_dim = o.head_dim;
        sp.n_layer = o.n_layer;
        if (o.n_ff_expert > 0) sp.n_ff_expert = o.n_ff_expert;
        REQUIRE(moe_synth_write(path_.c_str(), &sp) == MOE_STATUS_OK);
        REQUIRE(moe_model_load(path_.c_str(), nullptr, &model_) == MOE_STATUS_OK);
        moe_model_info_init(&info_);
        REQUIRE(moe_model_get_info(model_, &info_) == MOE_STATUS_OK);
    }
    ~TinyModel() {
        moe_model_free(model_);
        std::error_code ec;
        std::filesystem::remove(path_, ec);
    }
    TinyModel(const TinyModel&) = delete;
    TinyModel& operator=(const TinyModel&) = delete;

    moe_model* get() const { return model_; }
    const std::string& path() const { return path_; }
    const moe_model_info& info() const { return info_; }

    // Bytes of the named tensor in the file.
    uint64_t tensor_bytes(const std::string& name) const {
        int32_t idx = -1;
        REQUIRE(moe_model_find_tensor(model_, name.c_str(), &idx) == MOE_STATUS_OK);
        moe_tensor_info ti;
        moe_tensor_info_init(&ti);
        REQUIRE(moe_model_get_tensor(model_, idx, &ti) == MOE_STATUS_OK);
        return ti.n_bytes;
    }

private:
    std::string path_;
    moe_model* model_ = nullptr;
    moe_model_info info_{};
};

}  // namespace moe::test
