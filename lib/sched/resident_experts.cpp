#include "sched/resident_experts.h"

#include <cstring>
#include <string>

namespace moe::sched {
namespace {

// The residency's experts of `w`'s layer, or nullptr when `w` is not an expert tensor of a partly
// resident layer.
const std::vector<int32_t>* resident_of(const Tensor& w, const ExpertResidency& resident) {
    const int layer = layer_of(w.name);
    if (!is_expert_tensor(w.name) || !resident.partial(layer)) return nullptr;
    return &resident.experts[static_cast<size_t>(layer)];
}

}  // namespace

uint64_t resident_bytes(std::span<Tensor* const> weights, const ExpertResidency& resident, uint64_t align) {
    uint64_t n = 0;
    for (const Tensor* w : weights) {
        if (const std::vector<int32_t>* e = resident_of(*w, resident)) {
            n += resident_slice_bytes(w->n_bytes(), resident.n_expert, e->size(), align);
        }
    }
    return n;
}

StatusOr<std::vector<ResidentSlice>> upload_resident_experts(std::span<Tensor* const> weights,
                                                             const ExpertResidency& resident, Backend& device,
                                                             Buffer& buffer, size_t offset, uint64_t align,
                                                             const std::function<Status(uint64_t)>& progress) {
    std::vector<ResidentSlice> slices(weights.size());
    auto stop = [&](Status s) {
        (void)device.synchronize();  // the copies queued before still read the model and write buffer
        return s;
    };
    for (size_t i = 0; i < weights.size(); ++i) {
        const Tensor& w = *weights[i];
        const std::vector<int32_t>* experts = resident_of(w, resident);
        if (experts == nullptr) continue;
        const size_t per_expert = w.n_bytes() / static_cast<size_t>(resident.n_expert);
        auto* dst = static_cast<uint8_t*>(buffer.data()) + offset;
        const auto* src = static_cast<const uint8_t*>(w.data);
        for (size_t j = 0; j < experts->size();) {
            size_t run = 1;  // adjacent experts go in one copy
            while (j + run < experts->size() && (*experts)[j + run] == (*experts)[j] + static_cast<int32_t>(run)) ++run;
            const Status s = device.copy_to_device(dst + j * per_expert,
                                                   src + static_cast<size_t>((*experts)[j]) * per_expert,
                                                   run * per_expert);
            if (!s.is_ok()) return stop(s.with_context("uploading the resident experts of '" + w.name + "'"));
            j += run;
        }
        slices[i] = ResidentSlice{dst, &buffer, static_cast<int32_t>(experts->size())};
        const uint64_t bytes = resident_slice_bytes(w.n_bytes(), resident.n_expert, experts->size(), align);
        offset += bytes;
        if (progress) {
            if (Status s = progress(bytes); !s.is_ok()) return stop(s);
        }
    }
    return slices;
}

Tensor* slice_operand(const Tensor& w, const ResidentSlice& slice, RunState& rs) {
    Tensor* t = rs.substitute(w, slice.device, slice.buffer);
    int d = 3;
    while (d > 0 && t->ne[d] == 1) --d;
    t->ne[d] = slice.n_experts;
    return t;
}

std::vector<int32_t> slice_rows(const ExpertResidency& resident, int layer) {
    std::vector<int32_t> rows(static_cast<size_t>(resident.n_expert), kNoExpert);
    if (!resident.partial(layer)) return rows;
    const std::vector<int32_t>& e = resident.experts[static_cast<size_t>(layer)];
    for (size_t r = 0; r < e.size(); ++r) rows[static_cast<size_t>(e[r])] = static_cast<int32_t>(r);
    return rows;
}

LayerResidency residency_by_layer(std::span<Tensor* const> weights, std::span<const Side> sides,
                                  const ExpertResidency& resident, int n_layer, uint64_t align) {
    LayerResidency r;
    r.n_experts.assign(static_cast<size_t>(n_layer), 0);
    r.bytes.assign(static_cast<size_t>(n_layer), 0);
    std::vector<uint8_t> any_host(static_cast<size_t>(n_layer), 0), any_device(static_cast<size_t>(n_layer), 0);
    for (size_t i = 0; i < weights.size(); ++i) {
        const Tensor& w = *weights[i];
        const int layer = layer_of(w.name);
        if (!is_expert_tensor(w.name) || layer < 0 || layer >= n_layer) continue;
        const auto l = static_cast<size_t>(layer);
        if (const std::vector<int32_t>* e = resident_of(w, resident)) {
            r.bytes[l] += resident_slice_bytes(w.n_bytes(), resident.n_expert, e->size(), align);
        } else if (sides[i] == Side::DEVICE) {
            r.bytes[l] += (w.n_bytes() + align - 1) / align * align;
            any_device[l] = 1;
        } else {
            any_host[l] = 1;
        }
    }
    for (int il = 0; il < n_layer; ++il) {
        const auto l = static_cast<size_t>(il);
        if (resident.partial(il)) {
            r.n_experts[l] = static_cast<int32_t>(resident.experts[l].size());
        } else if (any_device[l] && !any_host[l]) {
            r.n_experts[l] = resident.n_expert;
        }
    }
    return r;
}

Status ResidentExperts::init(const ExpertResidency& resident, Backend* device) {
    resident_ = resident;
    const size_t n_layer = resident_.experts.size();
    map_of_layer_.assign(n_layer, nullptr);
    if (!resident_.any()) return Status::ok();
    if (device == nullptr) return internal_error("resident experts without a device");
    const size_t row_bytes = static_cast<size_t>(resident_.n_expert) * sizeof(int32_t);
    std::vector<int32_t> all;
    for (size_t il = 0; il < n_layer; ++il) {
        if (!resident_.partial(static_cast<int>(il))) continue;
        const std::vector<int32_t> rows = slice_rows(resident_, static_cast<int>(il));
        all.insert(all.end(), rows.begin(), rows.end());
    }
    MOE_ASSIGN_OR_RETURN(maps_, device->alloc_buffer(all.size() * sizeof(int32_t)));
    MOE_RETURN_IF_ERROR(device->copy_to_device(maps_->data(), all.data(), all.size() * sizeof(int32_t)));
    MOE_RETURN_IF_ERROR(device->synchronize());  // `all` goes out of scope
    size_t k = 0;
    for (size_t il = 0; il < n_layer; ++il) {
        if (!resident_.partial(static_cast<int>(il))) continue;
        Tensor& t = map_tensors_.emplace_back();
        const int64_t ne[1] = {resident_.n_expert};
        set_shape(t, Type::I32, 1, ne);
        t.data = static_cast<uint8_t*>(maps_->data()) + k++ * row_bytes;
        t.buffer = maps_.get();
        t.layer = static_cast<int32_t>(il);
        t.name = "resident_rows." + std::to_string(il);
        map_of_layer_[il] = &t;
    }
    return Status::ok();
}

Tensor* ResidentExperts::row_map(int layer) const {
    if (layer < 0 || static_cast<size_t>(layer) >= map_of_layer_.size()) return nullptr;
    return map_of_layer_[static_cast<size_t>(layer)];
}

}  // namespace moe::sched
