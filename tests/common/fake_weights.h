// Weight tensors without data, by name and shape (F32), for tests of bind_weights: a model's tensor
// table without a file.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/models/model_graph.h"
#include "core/tensor.h"

namespace moe::test {

struct FakeModel {
    std::deque<Tensor> tensors;  // a deque: the pointers in by_name stay valid
    std::map<std::string, Tensor*> by_name;

    explicit FakeModel(const std::map<std::string, std::vector<int64_t>>& shapes) {
        for (const auto& [name, ne] : shapes) {
            Tensor& t = tensors.emplace_back();
            set_shape(t, Type::F32, static_cast<int>(ne.size()), ne.data());
            t.name = name;
            by_name[name] = &t;
        }
    }
    WeightLookup lookup() {
        return [this](const std::string& n) -> Tensor* {
            auto it = by_name.find(n);
            return it == by_name.end() ? nullptr : it->second;
        };
    }
};

}  // namespace moe::test
