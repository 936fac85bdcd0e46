// The resident experts of partly resident layers (sched/expert_placement.h) on the device: per expert
// tensor a slice holding those experts in ascending order, and per layer the map from expert id to
// slice row that the device's part of the layer's expert block reads its ids through (MASK_IDS in
// remap mode).
//
// Such a layer's expert block is split on every ubatch: the device computes the resident experts'
// part from the slices, without an upload, while the other experts' part runs on the host from RAM
// (decode), or where the policy sends an op with host-resident weights (prefill: offloaded, uploading
// what it needs, or on the host).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "sched/expert_placement.h"
#include "sched/run_state.h"
#include "sched/weight_table.h"

namespace moe::sched {

// Device bytes of the slices of `weights` (padded to align each) for the residency.
uint64_t resident_bytes(std::span<Tensor* const> weights, const ExpertResidency& resident, uint64_t align);

// Copies the resident experts of each expert tensor of a partly resident layer into `buffer` from byte
// `offset` on (queued: synchronise before use), one copy per run of adjacent experts. Per weight (same
// order): its slice, or an empty one. progress is called with each slice's padded bytes; an error
// from it (cancellation) stops the uploads, with nothing left in flight.
StatusOr<std::vector<ResidentSlice>> upload_resident_experts(std::span<Tensor* const> weights,
                                                             const ExpertResidency& resident, Backend& device,
                                                             Buffer& buffer, size_t offset, uint64_t align,
                                                             const std::function<Status(uint64_t)>& progress);

// The stand-in of expert tensor `w` (experts outermost) over its resident slice: the same shape with
// slice.n_experts experts.
Tensor* slice_operand(const Tensor& w, const ResidentSlice& slice, RunState& rs);

// The slice row of each expert of a partly resident layer (-1 where not resident).
std::vector<int32_t> slice_rows(const ExpertResidency& resident, int layer);

// Per layer: the experts whose weights are in device memory (all of a layer whose expert tensors are
// there whole, the resident ones of a partly resident layer, else none) and their device bytes
// (padded to align per tensor or slice).
struct LayerResidency {
    std::vector<int32_t> n_experts;
    std::vector<uint64_t> bytes;
};
LayerResidency residency_by_layer(std::span<Tensor* const> weights, std::span<const Side> sides,
                                  const ExpertResidency& resident, int n_layer, uint64_t align);

// What the scheduler keeps of the residency: the partly resident layers' row maps on the device (the
// MASK_IDS remap operand) and the expert groups their split uses.
class ResidentExperts {
public:
    ResidentExperts() = default;
    ResidentExperts(const ResidentExperts&) = delete;
    ResidentExperts& operator=(const ResidentExperts&) = delete;

    // Uploads the row maps (synchronises). REQUIRES: called once, with a device when resident.any().
    Status init(const ExpertResidency& resident, Backend* device);

    const ExpertResidency& residency() const { return resident_; }
    bool partial(int layer) const { return resident_.partial(layer); }
    // The device tensor I32 [n_expert] of a partly resident layer's slice rows; nullptr for the others.
    Tensor* row_map(int layer) const;
    // The expert of slice row `row` of a partly resident layer.
    int32_t expert_of_row(int layer, int32_t row) const {
        return resident_.experts[static_cast<size_t>(layer)][static_cast<size_t>(row)];
    }

private:
    ExpertResidency resident_;
    std::unique_ptr<Buffer> maps_;
    std::deque<Tensor> map_tensors_;
    std::vector<Tensor*> map_of_layer_;
};

}  // namespace moe::sched
