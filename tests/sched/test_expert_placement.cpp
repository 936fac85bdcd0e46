// Per-expert placement (sched/expert_placement.h) and expert profiles (sched/expert_profile.h): the
// resident experts are the hottest of a random profile (checked against a sort of the counts), the
// budget holds (device bytes summed here from the sides and the slices), the uniform fill is whole
// layers from the last, and bad or foreign profile files give named errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "sched/expert_placement.h"
#include "sched/expert_profile.h"

using namespace moe;
using namespace moe::sched;

namespace {

struct FakeModel {
    std::vector<WeightDesc> weights;
    int n_layer = 0;
    int n_expert = 0;
};

// Per layer: an attention weight, and up/gate/down expert matrices (plus a down bias) of per_expert
// bytes per expert each; then the output head.
FakeModel fake_model(int n_layer, int n_expert, uint64_t per_expert, bool biases) {
    FakeModel m{{}, n_layer, n_expert};
    m.weights.push_back({"token_embd.weight", 5000});
    for (int il = 0; il < n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        m.weights.push_back({b + "attn_q.weight", 3000});
        for (const char* t : {"ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight"}) {
            m.weights.push_back({b + t, per_expert * static_cast<uint64_t>(n_expert)});
        }
        if (biases) m.weights.push_back({b + "ffn_down_exps.bias", 64u * static_cast<uint64_t>(n_expert)});
    }
    m.weights.push_back({"output.weight", 7000});
    return m;
}

uint64_t pad(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// Device bytes of a placement, counted from the sides and the residency.
uint64_t device_bytes(const FakeModel& m, const ExpertPlacement& p, uint64_t align) {
    uint64_t n = 0;
    for (size_t i = 0; i < m.weights.size(); ++i) {
        const WeightDesc& w = m.weights[i];
        const int layer = layer_of(w.name);
        if (p.sides[i] == Side::DEVICE) n += pad(w.bytes, align);
        if (is_expert_tensor(w.name) && p.resident.partial(layer)) {
            n += pad(w.bytes / m.n_expert * p.resident.experts[static_cast<size_t>(layer)].size(), align);
        }
    }
    return n;
}

// Experts on the device per layer: all of a layer whose expert tensors are there whole.
std::vector<int> resident_count(const FakeModel& m, const ExpertPlacement& p) {
    std::vector<int> n(static_cast<size_t>(m.n_layer), 0);
    for (int il = 0; il < m.n_layer; ++il) {
        if (p.resident.partial(il)) {
            n[static_cast<size_t>(il)] = static_cast<int>(p.resident.experts[static_cast<size_t>(il)].size());
            continue;
        }
        bool all = true;
        for (size_t i = 0; i < m.weights.size(); ++i) {
            if (layer_of(m.weights[i].name) == il && is_expert_tensor(m.weights[i].name)) all = all && p.sides[i] == Side::DEVICE;
        }
        n[static_cast<size_t>(il)] = all ? m.n_expert : 0;
    }
    return n;
}

std::string temp_path(const std::string& tag) {
    return (std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(getpid()) + ".txt")).string();
}

}  // namespace

TEST_CASE("per-expert placement keeps the hottest experts of a profile within the budget", "[sched]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (int trial = 0; trial < 50; ++trial) {
        const int n_layer = 1 + static_cast<int>(rng() % 6), n_expert = 2 + static_cast<int>(rng() % 30);
        const uint64_t per_expert = 100 + rng() % 900;
        const FakeModel m = fake_model(n_layer, n_expert, per_expert, false);
        // Distinct counts, so that the hottest set is unique.
        std::vector<uint64_t> counts(static_cast<size_t>(n_layer * n_expert));
        std::iota(counts.begin(), counts.end(), uint64_t{1});
        std::shuffle(counts.begin(), counts.end(), rng);
        uint64_t fixed = 0, total = 0;
        for (const WeightDesc& w : m.weights) {
            total += w.bytes;
            if (!is_expert_tensor(w.name)) fixed += w.bytes;
        }
        ExpertPlacementParams p;
        p.base.n_layer = n_layer;
        p.base.vram_budget = fixed + rng() % (total - fixed);
        p.n_expert = n_expert;
        p.counts = counts;
        StatusOr<ExpertPlacement> got = place_experts(m.weights, p);
        REQUIRE(got.is_ok());
        INFO("trial " << trial << ": n_layer " << n_layer << " n_expert " << n_expert << " budget " << p.base.vram_budget);
        const uint64_t used = device_bytes(m, *got, 1);
        CHECK(used <= p.base.vram_budget);
        // Independent: every expert costs 3 * per_expert, so the budget holds the N hottest of all.
        const uint64_t cost = 3 * per_expert;
        const size_t n_fit = static_cast<size_t>((p.base.vram_budget - fixed) / cost);
        std::vector<size_t> by_heat(counts.size());
        std::iota(by_heat.begin(), by_heat.end(), size_t{0});
        std::sort(by_heat.begin(), by_heat.end(), [&](size_t a, size_t b) { return counts[a] > counts[b]; });
        std::vector<int> want(static_cast<size_t>(n_layer), 0);
        std::vector<std::vector<int32_t>> want_experts(static_cast<size_t>(n_layer));
        for (size_t k = 0; k < n_fit; ++k) {
            ++want[by_heat[k] / static_cast<size_t>(n_expert)];
            want_experts[by_heat[k] / static_cast<size_t>(n_expert)].push_back(static_cast<int32_t>(by_heat[k] % n_expert));
        }
        CHECK(resident_count(m, *got) == want);
        for (int il = 0; il < n_layer; ++il) {
            std::vector<int32_t>& w = want_experts[static_cast<size_t>(il)];
            std::sort(w.begin(), w.end());
            if (w.empty() || w.size() == static_cast<size_t>(n_expert)) {
                CHECK_FALSE(got->resident.partial(il));
            } else {
                CHECK(got->resident.experts[static_cast<size_t>(il)] == w);
            }
        }
    }
}

TEST_CASE("per-expert placement: uniform fills whole layers from the last, padding and pins respected", "[sched]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (int trial = 0; trial < 50; ++trial) {
        const int n_layer = 2 + static_cast<int>(rng() % 6), n_expert = 2 + static_cast<int>(rng() % 30);
        const uint64_t align = uint64_t{1} << (rng() % 9);
        const FakeModel m = fake_model(n_layer, n_expert, 64 + rng() % 900, true);
        ExpertPlacementParams p;
        p.base.n_layer = n_layer;
        p.base.n_cpu_moe = static_cast<int>(rng() % 2);  // layer 0's experts stay in RAM
        auto rules = parse_overrides(rng() % 2 ? "blk\\.1\\.ffn_down_exps=CPU" : "");
        REQUIRE(rules.is_ok());
        p.base.overrides = std::move(rules).value();
        p.n_expert = n_expert;
        p.align = align;
        uint64_t fixed = 0, total = 0;
        for (const WeightDesc& w : m.weights) {
            total += pad(w.bytes, align);
            if (!is_expert_tensor(w.name)) fixed += pad(w.bytes, align);
        }
        p.base.vram_budget = fixed + rng() % (total - fixed);
        StatusOr<ExpertPlacement> got = place_experts(m.weights, p);
        REQUIRE(got.is_ok());
        INFO("trial " << trial << " n_layer " << n_layer << " n_expert " << n_expert << " align " << align);
        CHECK(device_bytes(m, *got, align) <= p.base.vram_budget);
        const std::vector<int> n = resident_count(m, *got);
        // Pinned and n_cpu_moe layers: their experts never on the device (the budget is below everything).
        if (p.base.n_cpu_moe > 0) CHECK(n[0] == 0);
        if (!p.base.overrides.empty()) CHECK_FALSE(got->resident.partial(1));
        // The others fill from the last layer: full layers, then at most one partial, then empty ones.
        int il = n_layer - 1;
        auto movable = [&](int l) { return !(l < p.base.n_cpu_moe) && !(l == 1 && !p.base.overrides.empty()); };
        while (il >= 0 && (!movable(il) || n[static_cast<size_t>(il)] == n_expert)) --il;
        if (il >= 0 && got->resident.partial(il)) {
            // The lowest experts of the boundary layer.
            const std::vector<int32_t>& e = got->resident.experts[static_cast<size_t>(il)];
            for (size_t k = 0; k < e.size(); ++k) CHECK(e[k] == static_cast<int32_t>(k));
            --il;
        }
        for (; il >= 0; --il) {
            if (movable(il)) CHECK(n[static_cast<size_t>(il)] == 0);
        }
    }
}

TEST_CASE("per-expert placement: what fits whole is placed as before; too little budget is named", "[sched]") {
    const FakeModel m = fake_model(3, 8, 100, false);
    ExpertPlacementParams p;
    p.base.n_layer = 3;
    p.n_expert = 8;
    p.base.vram_budget = UINT64_MAX;
    StatusOr<ExpertPlacement> all = place_experts(m.weights, p);
    REQUIRE(all.is_ok());
    CHECK(std::all_of(all->sides.begin(), all->sides.end(), [](Side s) { return s == Side::DEVICE; }));
    CHECK_FALSE(all->resident.any());
    p.base.vram_budget = 100;  // less than the dense weights
    StatusOr<ExpertPlacement> none = place_experts(m.weights, p);
    CHECK(none.status().code() == MOE_STATUS_RESOURCE_EXHAUSTED);
    const std::vector<uint64_t> short_counts(5, 1);
    p.counts = short_counts;
    CHECK(place_experts(m.weights, p).status().code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("expert profiles round-trip; foreign, malformed and missing files are named", "[sched]") {
    std::mt19937_64 rng(std::random_device{}());
    ExpertProfile p;
    p.arch = "qwen3moe";
    p.n_layer = 3;
    p.n_expert = 5;
    p.n_expert_used = 2;
    for (int i = 0; i < 15; ++i) p.counts.push_back(rng() % 1000000000000ull);
    const std::string path = temp_path("moe_profile");
    REQUIRE(write_expert_profile(path, p).is_ok());
    ExpertProfile shape = p;
    shape.counts.clear();
    StatusOr<ExpertProfile> back = read_expert_profile(path, shape);
    REQUIRE(back.is_ok());
    CHECK(back->counts == p.counts);

    for (const char* field : {"arch", "n_layer", "n_expert", "n_expert_used"}) {
        ExpertProfile other = shape;
        const std::string f = field;
        if (f == "arch") other.arch = "gpt-oss";
        if (f == "n_layer") other.n_layer = 4;
        if (f == "n_expert") other.n_expert = 6;
        if (f == "n_expert_used") other.n_expert_used = 1;
        const StatusOr<ExpertProfile> r = read_expert_profile(path, other);
        INFO(r.status().message());
        CHECK(r.status().code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(r.status().message().find(f) != std::string::npos);
    }

    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto with = [&](const std::string& from, const std::string& to) {
        std::string t = text;
        t.replace(t.find(from), from.size(), to);
        std::ofstream(path, std::ios::trunc) << t;
        return read_expert_profile(path, shape).status();
    };
    CHECK(with("moeinfer-expert-profile 1", "moeinfer-expert-profile 2").code() == MOE_STATUS_UNIMPLEMENTED);
    CHECK(with("moeinfer-expert-profile 1", "hello").code() == MOE_STATUS_DATA_CORRUPT);
    CHECK(with("layer 1 ", "layer 2 ").code() == MOE_STATUS_DATA_CORRUPT);
    CHECK(with("layer 2 ", "layer 2 x").code() == MOE_STATUS_DATA_CORRUPT);
    CHECK(with("layer 1 ", "layer 1 7 ").code() == MOE_STATUS_DATA_CORRUPT);  // a count too many
    CHECK(with("end\n", "").code() == MOE_STATUS_DATA_CORRUPT);
    const Status bad = with("layer 2 ", "layer 2 -3 ");
    CHECK(bad.code() == MOE_STATUS_DATA_CORRUPT);
    CHECK(bad.message().find("line 8") != std::string::npos);
    std::filesystem::remove(path);
    CHECK(read_expert_profile(path, shape).status().code() == MOE_STATUS_NOT_FOUND);
}
