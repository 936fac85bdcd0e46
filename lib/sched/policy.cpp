#include "sched/policy.h"

#include <charconv>
#include <climits>

namespace moe::sched {

const char* offload_op_name(int op) {
    switch (op) {
        case 0: return "mul_mat";
        case 1: return "mul_mat_id";
        case 2: return "moe_up_gate";
        default: return nullptr;
    }
}

std::optional<OffloadOp> offload_op_of(Op op) {
    switch (op) {
        case Op::MUL_MAT: return OffloadOp::MUL_MAT;
        case Op::MUL_MAT_ID: return OffloadOp::MUL_MAT_ID;
        case Op::MOE_UP_GATE: return OffloadOp::MOE_UP_GATE;
        default: return std::nullopt;
    }
}

int32_t default_min_batch(OffloadOp op, int n_expert, int n_expert_used) {
    if (op == OffloadOp::MUL_MAT || n_expert <= 0 || n_expert_used <= 0) return 32;
    return static_cast<int32_t>(32LL * n_expert / n_expert_used);
}

int32_t resolved_min_batch(const Policy& p, OffloadOp op, int n_expert, int n_expert_used) {
    const int32_t m = p.rule(op).min_batch;
    return m >= 0 ? m : default_min_batch(op, n_expert, n_expert_used);
}

bool copies_active_experts(const Policy& p, int64_t n_used, int64_t n_tokens, int n_expert) {
    switch (p.expert_copy) {
        case ExpertCopy::FULL: return false;
        case ExpertCopy::AUTO: return n_used * n_tokens < kActiveAutoRatio * n_expert;
        default: return true;
    }
}

Status validate_policy(const Policy& p) {
    for (int i = 0; i < kOffloadOps; ++i) {
        if (p.offload[i].min_batch < -1) {
            return invalid_argument(std::string("offload policy: ") + offload_op_name(i) + " min_batch must be >= 0 " +
                                    "(or -1 for the default), got " + std::to_string(p.offload[i].min_batch));
        }
    }
    if (p.expert_copy != ExpertCopy::FULL && p.expert_copy != ExpertCopy::ACTIVE_ONLY &&
        p.expert_copy != ExpertCopy::ACTIVE_PREFETCH && p.expert_copy != ExpertCopy::AUTO) {
        return invalid_argument(
            "expert_copy must be MOE_EXPERT_COPY_FULL (0), _ACTIVE_ONLY (1), _ACTIVE_PREFETCH (2) or _AUTO (3), got " +
            std::to_string(static_cast<int>(p.expert_copy)));
    }
    if (p.expert_cache < kExpertCacheAuto) {
        return invalid_argument("expert_cache must be >= 0 (bytes; 0 turns the cache off) or -1 (automatic), got " +
                                std::to_string(p.expert_cache));
    }
    if (p.expert_split < kExpertSplitAuto) {
        return invalid_argument("expert_split must be >= 0 (experts per layer on the host) or -1 (automatic), got " +
                                std::to_string(p.expert_split));
    }
    return Status::ok();
}

namespace {

Status apply_entry(const std::string& entry, Policy* p) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) {
        return invalid_argument("offload policy entry '" + entry + "': expected op=N, op=on or op=off");
    }
    const std::string name = entry.substr(0, eq);
    const std::string value = entry.substr(eq + 1);
    int first = -1, last = -1;
    if (name == "all") {
        first = 0;
        last = kOffloadOps - 1;
    } else {
        for (int i = 0; i < kOffloadOps; ++i) {
            if (name == offload_op_name(i)) first = last = i;
        }
    }
    if (first < 0) {
        return invalid_argument("offload policy entry '" + entry + "': unknown op '" + name +
                                "' (expected mul_mat, mul_mat_id, moe_up_gate or all)");
    }
    OffloadRule rule;
    if (value == "off") {
        rule.enabled = false;
    } else if (value != "on") {
        int64_t n = 0;
        const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (ec != std::errc() || ptr != value.data() + value.size() || value.empty()) {
            return invalid_argument("offload policy entry '" + entry + "': '" + value +
                                    "' is not a number, 'on' or 'off'");
        }
        if (n < 0 || n > INT32_MAX) {
            return invalid_argument("offload policy entry '" + entry + "': min_batch must be in [0, 2^31), got " + value);
        }
        rule.min_batch = static_cast<int32_t>(n);
    }
    for (int i = first; i <= last; ++i) p->offload[i] = rule;
    return Status::ok();
}

}  // namespace

Status parse_offload_spec(const std::string& spec, Policy* p) {
    Policy out = *p;
    size_t start = 0;
    while (start <= spec.size()) {
        const size_t comma = spec.find(',', start);
        const std::string entry = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (entry.empty()) return invalid_argument("offload policy '" + spec + "': empty entry");
        MOE_RETURN_IF_ERROR(apply_entry(entry, &out));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    *p = out;
    return Status::ok();
}

}  // namespace moe::sched
