// moeinfer-info: prints a GGUF model's summary (architecture, hyper-parameters, tensor groups).
// Written on the public C API only.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "moeinfer/moeinfer.h"

namespace {

void usage() {
    std::fprintf(stderr,
                 "usage: moeinfer-info MODEL.gguf [--tensors]\n"
                 "  Prints the model's architecture, hyper-parameters and tensors grouped by role.\n"
                 "  --tensors   also list every tensor (name, type, shape, bytes)\n");
}

std::string gib(uint64_t bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

// "blk.7.ffn_up_exps.weight" -> "ffn_up_exps.weight": the role a tensor plays in every layer.
std::string role_of(const char* name) {
    if (std::strncmp(name, "blk.", 4) == 0) {
        const char* dot = std::strchr(name + 4, '.');
        if (dot != nullptr) return dot + 1;
    }
    return name;
}

// The type as listed: ggml's name, marked '*' when this build has no conversion for it (a context on the
// model then fails to create; the footnote says so).
std::string type_label(int32_t type, bool& any_marked) {
    const char* name = moe_type_name(type);
    if (name == nullptr) return "type" + std::to_string(type);
    uint32_t caps = 0;
    if (moe_type_capabilities(type, &caps) != MOE_STATUS_OK || (caps & MOE_TYPE_CAN_DEQUANTIZE) == 0) {
        any_marked = true;
        return std::string(name) + "*";
    }
    return name;
}

}  // namespace

int main(int argc, char** argv) {
    const char* path = nullptr;
    bool list_all = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--tensors") == 0) {
            list_all = true;
        } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
            usage();
            return 0;
        } else if (path == nullptr && argv[i][0] != '-') {
            path = argv[i];
        } else {
            std::fprintf(stderr, "moeinfer-info: unknown argument '%s'\n", argv[i]);
            usage();
            return 2;
        }
    }
    if (path == nullptr) {
        usage();
        return 2;
    }

    moe_model* model = nullptr;
    if (moe_model_load(path, nullptr, &model) != MOE_STATUS_OK) {
        std::fprintf(stderr, "moeinfer-info: %s\n", moe_last_error());
        return 1;
    }
    moe_model_info info;
    moe_model_info_init(&info);
    if (moe_model_get_info(model, &info) != MOE_STATUS_OK) {
        std::fprintf(stderr, "moeinfer-info: %s\n", moe_last_error());
        moe_model_free(model);
        return 1;
    }
    std::printf("moeinfer %s\n", moe_version());
    std::printf("model          %s\n", path);
    std::printf("architecture   %s  (%s)\n", info.architecture, info.name);
    std::printf("layers         %d\n", info.n_layer);
    std::printf("embedding      %d   vocab %d   context (train) %d\n", info.n_embd, info.n_vocab, info.n_ctx_train);
    std::printf("attention      %d heads / %d kv heads of dim %d", info.n_head, info.n_head_kv, info.head_dim);
    if (info.sliding_window > 0) std::printf(", sliding window %d on alternate layers", info.sliding_window);
    std::printf("\n");
    std::printf("experts        %d, top-%d, FFN %d\n", info.n_expert, info.n_expert_used, info.n_ff_expert);
    std::printf("tensors        %d, %s (experts %s, %.1f%%)\n", info.n_tensors, gib(info.n_bytes).c_str(),
                gib(info.n_expert_bytes).c_str(),
                info.n_bytes ? 100.0 * static_cast<double>(info.n_expert_bytes) / static_cast<double>(info.n_bytes) : 0.0);

    // Group tensors by role, so a 48-layer model prints a short table.
    struct Group {
        int count = 0;
        uint64_t bytes = 0;
        std::string type;
        std::string shape;
    };
    std::map<std::string, Group> groups;
    bool any_marked = false;
    for (int32_t i = 0; i < info.n_tensors; ++i) {
        moe_tensor_info t;
        moe_tensor_info_init(&t);
        if (moe_model_get_tensor(model, i, &t) != MOE_STATUS_OK) continue;
        std::string shape = "[";
        for (int d = 0; d < t.n_dims; ++d) shape += (d ? ", " : "") + std::to_string(t.ne[d]);
        shape += "]";
        const std::string tname = type_label(t.type, any_marked);
        if (list_all) {
            std::printf("  %-40s %-10s %-22s %12llu\n", t.name, tname.c_str(), shape.c_str(),
                        (unsigned long long)t.n_bytes);
        }
        Group& g = groups[role_of(t.name)];
        // Layers may mix types (Q4_K_M files keep some layers' tensors in Q6_K): show every one, in order.
        if (g.count == 0) {
            g.type = tname;
        } else if (("," + g.type + ",").find("," + tname + ",") == std::string::npos) {
            g.type += "," + tname;
        }
        ++g.count;
        g.bytes += t.n_bytes;
        g.shape = shape;
    }
    std::printf("\n  %-28s %5s  %-10s %-22s %14s\n", "tensor (per layer)", "count", "type", "shape", "bytes");
    for (const auto& [role, g] : groups) {
        std::printf("  %-28s %5d  %-10s %-22s %14llu\n", role.c_str(), g.count, g.type.c_str(), g.shape.c_str(),
                    (unsigned long long)g.bytes);
    }
    if (any_marked) {
        std::printf("\n  * no conversion for this type in this build: the file is described, but a context on it\n"
                    "    fails to create\n");
    }
    moe_model_free(model);
    return 0;
}
