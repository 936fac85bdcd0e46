// The CPU backend: host buffers and oneTBB-parallel kernels, run inside a task arena of the
// requested thread count (leased from the process-wide pool, core/task_arenas.h).
#pragma once

#include <memory>

#include "core/backend.h"
#include "core/task_arenas.h"
#include "cpu/cpu_ops.h"

namespace moe::cpu {

// Plain host memory, 64-byte aligned.
class HostBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, size_t size);
    ~HostBuffer() override;
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return true; }

private:
    HostBuffer(Backend* backend, void* data, size_t size) : Buffer(backend), data_(data), size_(size) {}
    void* data_;
    size_t size_;
};

class CpuBackend final : public Backend {
public:
    // fuse_moe_ffn: backend option cpu_moe_fusion (an expert FFN's two products in one parallel pass,
    // cpu_ops.h moe_ffn).
    explicit CpuBackend(int n_threads, bool fuse_moe_ffn = true);

    const char* name() const override { return "cpu"; }
    bool is_host() const override { return true; }
    bool supports_op(const Tensor& node) const override;
    StatusOr<std::unique_ptr<Buffer>> alloc_buffer(size_t size) override;
    StatusOr<std::unique_ptr<Buffer>> alloc_host_buffer(size_t size) override { return alloc_buffer(size); }
    Status compute(std::span<Tensor* const> nodes) override;
    Status copy_to_device(void* dst, const void* src_host, size_t n) override;
    Status copy_to_host(void* dst_host, const void* src, size_t n) override;
    Status synchronize() override { return Status::ok(); }

    int n_threads() const { return n_threads_; }

private:
    Status compute_node(Tensor& node);

    int n_threads_;
    bool fuse_moe_ffn_;
    TaskArenaLease arena_;
    Scratch scratch_;
    Scratch down_scratch_;  // the down product's, while moe_ffn runs both
};

// Registers "cpu" in the backend registry (called by the generated backends_init.cpp).
void register_backend();

}  // namespace moe::cpu
