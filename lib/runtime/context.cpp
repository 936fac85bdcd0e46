#include "runtime/context.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/backend_registry.h"

namespace moe {
namespace {

Status check_params(const moe_context_params& p) {
    if (p.n_ctx <= 0) return invalid_argument("n_ctx must be > 0 (got " + std::to_string(p.n_ctx) + ")");
    if (p.n_ubatch <= 0) return invalid_argument("n_ubatch must be > 0 (got " + std::to_string(p.n_ubatch) + ")");
    if (p.n_threads < 0) return invalid_argument("n_threads must be >= 0 (got " + std::to_string(p.n_threads) + ")");
    if (p.device != MOE_DEVICE_CPU && p.device != MOE_DEVICE_CUDA) {
        return invalid_argument("device must be MOE_DEVICE_CPU or MOE_DEVICE_CUDA (got " + std::to_string(p.device) + ")");
    }
    return Status::ok();
}

// Copies every bound weight into one buffer of a device backend and points the tensors there.
Status upload_weights(moe_context& ctx) {
    constexpr size_t kAlign = 256;
    size_t total = 0;
    for (const Tensor& t : ctx.weight_tensors) {
        if (t.is_weight) total += (t.n_bytes() + kAlign - 1) & ~(kAlign - 1);
    }
    MOE_ASSIGN_OR_RETURN(ctx.weight_buffer, ctx.backend->alloc_buffer(total));
    auto* base = static_cast<uint8_t*>(ctx.weight_buffer->data());
    size_t offset = 0;
    for (Tensor& t : ctx.weight_tensors) {
        if (!t.is_weight) continue;
        MOE_RETURN_IF_ERROR(ctx.backend->copy_to_device(base + offset, t.data, t.n_bytes()));
        t.data = base + offset;
        t.buffer = ctx.weight_buffer.get();
        offset += (t.n_bytes() + kAlign - 1) & ~(kAlign - 1);
    }
    return ctx.backend->synchronize().with_context("uploading the weights");
}

// Leaf tensors over the model file's data, one per GGUF tensor.
Status bind_model_weights(moe_context& ctx) {
    const GgufFile& file = *ctx.model->file;
    std::unordered_map<std::string, Tensor*> by_name;
    for (const GgufTensorInfo& info : file.tensors()) {
        Tensor& t = ctx.weight_tensors.emplace_back();
        set_shape(t, info.type, std::max(info.n_dims, 1), info.ne);
        // Weights are only ever read; the mapping is read-only.
        t.data = const_cast<uint8_t*>(file.tensor_data(info));
        t.name = info.name;
        by_name[info.name] = &t;
    }
    StatusOr<ModelWeights> w = bind_weights(ctx.model->hparams, [&](const std::string& name) -> Tensor* {
        auto it = by_name.find(name);
        return it == by_name.end() ? nullptr : it->second;
    });
    if (!w.is_ok()) return w.status();
    ctx.weights = std::move(w).value();
    if (!ctx.backend->is_host()) MOE_RETURN_IF_ERROR(upload_weights(ctx));
    // Every weight is a matrix-product operand or a norm/bias vector; ask the backend about the former.
    for (Tensor& t : ctx.weight_tensors) {
        if (!t.is_weight || t.type == Type::F32) continue;
        Tensor probe;
        probe.op = Op::MUL_MAT;
        probe.src[0] = &t;
        if (!ctx.backend->supports_op(probe)) {
            return unimplemented("tensor '" + t.name + "': type " + type_name(t.type) + " is not supported");
        }
    }
    return Status::ok();
}

Status allocate_kv_cache(moe_context& ctx) {
    const HParams& hp = ctx.model->hparams;
    const int64_t ne[3] = {hp.head_dim, hp.n_head_kv, ctx.params.n_ctx};
    Tensor proto;
    set_shape(proto, Type::F16, 3, ne);
    const size_t per_tensor = proto.n_bytes();
    const size_t total = per_tensor * 2 * static_cast<size_t>(hp.n_layer);
    MOE_ASSIGN_OR_RETURN(ctx.kv_buffer, ctx.backend->alloc_buffer(total));
    auto* base = static_cast<uint8_t*>(ctx.kv_buffer->data());
    ctx.kv.n_ctx = ctx.params.n_ctx;
    for (int il = 0; il < hp.n_layer; ++il) {
        for (int kv = 0; kv < 2; ++kv) {
            Tensor& t = ctx.kv_tensors.emplace_back(proto);
            t.data = base + (static_cast<size_t>(il) * 2 + static_cast<size_t>(kv)) * per_tensor;
            t.buffer = ctx.kv_buffer.get();
            t.name = std::string(kv == 0 ? "cache_k." : "cache_v.") + std::to_string(il);
            (kv == 0 ? ctx.kv.k : ctx.kv.v).push_back(&t);
        }
    }
    return Status::ok();
}

Status validate_batch(const moe_context& ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens,
                      int* first_pos) {
    const int n_vocab = ctx.model->hparams.n_vocab;
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return out_of_range("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        }
    }
    int p0 = ctx.n_past;
    if (positions != nullptr) {
        p0 = positions[0];
        if (p0 < 0 || p0 > ctx.n_past) {
            return invalid_argument("positions[0] = " + std::to_string(p0) + " must be in [0, n_past = " +
                                    std::to_string(ctx.n_past) + "]");
        }
        for (int32_t i = 1; i < n_tokens; ++i) {
            if (positions[i] != p0 + i) {
                return invalid_argument("positions must be consecutive: positions[" + std::to_string(i) + "] = " +
                                        std::to_string(positions[i]) + ", expected " + std::to_string(p0 + i));
            }
        }
    }
    if (static_cast<int64_t>(p0) + n_tokens > ctx.params.n_ctx) {
        return out_of_range("context overflow: " + std::to_string(p0) + " tokens in the cache + " +
                            std::to_string(n_tokens) + " new > n_ctx = " + std::to_string(ctx.params.n_ctx));
    }
    *first_pos = p0;
    return Status::ok();
}

Status run_graph(moe_context& ctx, const Graph& g) {
    const std::vector<Tensor*>& nodes = g.nodes();
    for (const Tensor* n : nodes) {
        if (!ctx.backend->supports_op(*n)) {
            return unimplemented(std::string("the ") + ctx.backend->name() + " backend cannot compute " +
                                 op_name(n->op) + (n->src[0] ? " of '" + n->src[0]->name + "'" : std::string()));
        }
    }
    if (!ctx.profiling) return ctx.backend->compute(nodes);
    for (Tensor* n : nodes) {
        if (n->op == Op::VIEW) continue;  // no work: views only name memory
        const auto t0 = std::chrono::steady_clock::now();
        MOE_RETURN_IF_ERROR(ctx.backend->compute(std::span<Tensor* const>(&n, 1)));
        MOE_RETURN_IF_ERROR(ctx.backend->synchronize());
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        auto& slot = ctx.op_times[static_cast<size_t>(n->op)];
        ++slot.count;
        slot.seconds += dt.count();
    }
    return Status::ok();
}

// Evaluates one ubatch; logits_dst receives the logits `mode` asks for (nullptr for NONE).
Status decode_ubatch(moe_context& ctx, const int32_t* tokens, int n_tokens, int n_past, LogitsMode mode,
                     float* logits_dst) {
    const HParams& hp = ctx.model->hparams;
    Graph g;
    UbatchGraph ub = build_model_graph(g, hp, ctx.weights, ctx.kv, n_tokens, n_past, mode);
    const AllocPlan plan = plan_allocation(g);
    if (!ctx.arena || ctx.arena->size() < plan.arena_size) {
        ctx.arena.reset();  // free the old arena before allocating a larger one
        MOE_ASSIGN_OR_RETURN(ctx.arena, ctx.backend->alloc_buffer(plan.arena_size));
    }
    bind_allocation(g, plan, ctx.arena->data());

    // Inputs and outputs go through the backend's copies (device memory is not host-addressable).
    std::vector<int32_t> positions(static_cast<size_t>(n_tokens));
    for (int i = 0; i < n_tokens; ++i) positions[static_cast<size_t>(i)] = n_past + i;
    Backend& be = *ctx.backend;
    MOE_RETURN_IF_ERROR(be.copy_to_device(ub.tokens->data, tokens, sizeof(int32_t) * static_cast<size_t>(n_tokens)));
    MOE_RETURN_IF_ERROR(be.copy_to_device(ub.positions->data, positions.data(), sizeof(int32_t) * positions.size()));

    MOE_RETURN_IF_ERROR(run_graph(ctx, g));
    if (ub.logits != nullptr) MOE_RETURN_IF_ERROR(be.copy_to_host(logits_dst, ub.logits->data, ub.logits->n_bytes()));
    return be.synchronize();
}

}  // namespace

StatusOr<std::unique_ptr<moe_context>> create_context(moe_model* model, const moe_context_params& params) {
    MOE_RETURN_IF_ERROR(check_params(params));
    auto ctx = std::make_unique<moe_context>();
    ctx->model = model;
    ctx->params = params;
    const char* name = params.device == MOE_DEVICE_CUDA ? "cuda" : "cpu";
    const BackendFactory* factory = find_backend_factory(name);
    if (factory == nullptr) {
        return unimplemented(std::string("this build of moeinfer has no ") + name + " backend");
    }
    if (factory->device_count() == 0) return failed_precondition(std::string("no ") + name + " device found");
    BackendOptions opts;
    opts.n_threads = params.n_threads;
    MOE_ASSIGN_OR_RETURN(ctx->backend, factory->create(opts));
    MOE_RETURN_IF_ERROR(bind_model_weights(*ctx));
    MOE_RETURN_IF_ERROR(allocate_kv_cache(*ctx));
    return ctx;
}

Status decode(moe_context& ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens, bool logits_all) {
    int p0 = 0;
    MOE_RETURN_IF_ERROR(validate_batch(ctx, tokens, positions, n_tokens, &p0));
    const int n_vocab = ctx.model->hparams.n_vocab;
    ctx.n_past = p0;  // rewinding: later cache rows are simply overwritten
    ctx.logits.resize(static_cast<size_t>(logits_all ? n_tokens : 1) * static_cast<size_t>(n_vocab));
    ctx.logits_rows = 0;

    Status status;
    for (int done = 0; done < n_tokens;) {
        const int n = std::min(ctx.params.n_ubatch, n_tokens - done);
        const bool last = done + n == n_tokens;
        if (logits_all || last) {
            float* dst = ctx.logits.data() + static_cast<size_t>(logits_all ? done : 0) * static_cast<size_t>(n_vocab);
            status = decode_ubatch(ctx, tokens + done, n, ctx.n_past, logits_all ? LogitsMode::ALL : LogitsMode::LAST,
                                   dst);
        } else {
            status = decode_ubatch(ctx, tokens + done, n, ctx.n_past, LogitsMode::NONE, nullptr);
        }
        if (!status.is_ok()) {
            // The sequence ends where it was before this call; cache rows past it are never read.
            ctx.n_past = p0;
            return status;
        }
        ctx.n_past += n;
        done += n;
    }
    ctx.logits_rows = logits_all ? n_tokens : 1;
    return Status::ok();
}

}  // namespace moe
