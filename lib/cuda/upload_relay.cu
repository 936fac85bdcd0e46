#include "cuda/upload_relay.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"
#include "cuda/device_scope.h"
#include "cuda/host_copy.h"

namespace moe::cuda {

StatusOr<std::unique_ptr<UploadRelay>> UploadRelay::create(Backend* owner, int device, int partner, size_t slot_bytes,
                                                           int slots) {
    std::unique_ptr<UploadRelay> r(new UploadRelay(owner, device, partner));
    r->slot_bytes_ = slot_bytes;
    MOE_CUDA_DEVICE_SCOPE(partner);
    MOE_ASSIGN_OR_RETURN(r->staging_, DeviceBuffer::allocate(owner, partner, slot_bytes * static_cast<size_t>(slots)));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r->h2d_, cudaStreamNonBlocking));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r->push_, cudaStreamNonBlocking));
    r->loaded_.assign(static_cast<size_t>(slots), nullptr);
    r->freed_.assign(static_cast<size_t>(slots), nullptr);
    for (cudaEvent_t& e : r->loaded_) MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : r->freed_) MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r->pushed_, cudaEventDisableTiming));
    return StatusOr<std::unique_ptr<UploadRelay>>(std::move(r));
}

UploadRelay::~UploadRelay() {
    const DeviceScope scope(partner_);
    // Nothing queued may outlive the slots it uses, nor the caller's memory it reads.
    if (h2d_) cudaStreamSynchronize(h2d_);
    if (push_) cudaStreamSynchronize(push_);
    for (cudaEvent_t e : loaded_) {
        if (e) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : freed_) {
        if (e) cudaEventDestroy(e);
    }
    if (pushed_) cudaEventDestroy(pushed_);
    if (h2d_) cudaStreamDestroy(h2d_);
    if (push_) cudaStreamDestroy(push_);
    staging_.reset();
}

Status UploadRelay::send(void* dst, const void* src, size_t n, cudaEvent_t after) {
    if (n == 0) return Status::ok();
    MOE_CUDA_DEVICE_SCOPE(partner_);
    // dst may still be read by compute before `after` on the receiving GPU: only the pushes wait for it.
    if (after != nullptr) MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(push_, after, 0));
    auto* slots = static_cast<uint8_t*>(staging_->data());
    Status st = Status::ok();
    for (size_t done = 0; done < n && st.is_ok();) {
        const size_t bytes = std::min(slot_bytes_, n - done);
        const size_t k = next_slot_++ % loaded_.size();
        uint8_t* slot = slots + k * slot_bytes_;
        st = [&]() -> Status {
            MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(h2d_, freed_[k], 0));
            MOE_RETURN_IF_ERROR(copy_host_range(partner_, slot, static_cast<const uint8_t*>(src) + done, bytes, h2d_));
            MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(loaded_[k], h2d_));
            MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(push_, loaded_[k], 0));
            MOE_CUDA_RETURN_IF_ERROR(
                cudaMemcpyPeerAsync(static_cast<uint8_t*>(dst) + done, device_, slot, partner_, bytes, push_));
            MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(freed_[k], push_));
            return Status::ok();
        }();
        done += bytes;
    }
    // Also after a failure part way: order() then waits for the pushes that were queued.
    const cudaError_t marked = cudaEventRecord(pushed_, push_);
    pending_ = true;
    MOE_RETURN_IF_ERROR(st);
    MOE_CUDA_RETURN_IF_ERROR(marked);
    return Status::ok();
}

Status UploadRelay::order(cudaStream_t stream) {
    if (!pending_) return Status::ok();
    MOE_CUDA_DEVICE_SCOPE(device_);
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, pushed_, 0));
    pending_ = false;
    return Status::ok();
}

Status UploadRelay::synchronize() {
    MOE_CUDA_DEVICE_SCOPE(partner_);
    const cudaError_t loads = cudaStreamSynchronize(h2d_);  // both waited for, the first error reported
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(push_));
    MOE_CUDA_RETURN_IF_ERROR(loads);
    return Status::ok();
}

StatusOr<UploadRelay::Rates> UploadRelay::measure() {
    MOE_ASSIGN_OR_RETURN(const std::unique_ptr<Buffer> host, PinnedHostBuffer::allocate(owner_, slot_bytes_));
    MOE_ASSIGN_OR_RETURN(const std::unique_ptr<Buffer> target, DeviceBuffer::allocate(owner_, device_, slot_bytes_));
    MOE_CUDA_DEVICE_SCOPE(partner_);
    void* slot = staging_->data();
    const auto best_of_three = [this](auto&& copy, cudaStream_t stream) -> StatusOr<double> {
        double best = 0.0;
        for (int i = 0; i < 4; ++i) {  // the first warms up
            const auto t0 = std::chrono::steady_clock::now();
            MOE_RETURN_IF_ERROR(copy());
            MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (i > 0 && s > 0) best = std::max(best, static_cast<double>(slot_bytes_) / s);
        }
        return best;
    };
    Rates rates;
    MOE_ASSIGN_OR_RETURN(rates.host,
                         best_of_three([&] { return copy_host_range(partner_, slot, host->data(), slot_bytes_, h2d_); }, h2d_));
    MOE_ASSIGN_OR_RETURN(rates.peer, best_of_three(
                                         [&]() -> Status {
                                             MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(target->data(), device_, slot,
                                                                                          partner_, slot_bytes_, push_));
                                             return Status::ok();
                                         },
                                         push_));
    return rates;
}

}  // namespace moe::cuda
