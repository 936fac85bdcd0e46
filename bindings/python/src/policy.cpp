// moeinfer.Policy: the hybrid scheduler's policy (moe_sched_policy), bound as the C struct itself so
// that a Context takes it as it is.
#include <string>

#include "bindings.h"

namespace moeinfer_py {
namespace {

// "mul_mat" -> MOE_OFFLOAD_MUL_MAT; ValueError naming the known ops otherwise.
int32_t offload_op(const std::string& name) {
    std::string known;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        const std::string n = moeinfer::offload_op_name(op).value_or("");
        if (n == name) return op;
        known += (op ? ", " : "") + n;
    }
    throw py::value_error("Policy: unknown op '" + name + "' (expected one of " + known + ")");
}

void set_rule(moe_sched_policy& p, int32_t op, bool enabled, int32_t min_batch) {
    if (min_batch < -1) {
        throw py::value_error("Policy: min_batch of " + moeinfer::offload_op_name(op).value_or("?") +
                              " must be >= 0, or -1 for the default threshold, got " + std::to_string(min_batch));
    }
    p.offload[op].enabled = enabled ? 1 : 0;
    p.offload[op].min_batch = min_batch;
}

py::dict offload_dict(const moe_sched_policy& p) {
    py::dict d;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        d[py::str(moeinfer::offload_op_name(op).value_or("op" + std::to_string(op)))] =
            py::make_tuple(p.offload[op].enabled != 0, p.offload[op].min_batch);
    }
    return d;
}

// Applies {"op": (enabled, min_batch), ...}; ops not in the dict keep their rule. Checked in full
// before anything changes.
void set_offload_dict(moe_sched_policy& p, const py::dict& rules) {
    moe_sched_policy updated = p;
    for (const auto& [key, value] : rules) {
        if (!py::isinstance<py::str>(key)) throw py::type_error("Policy.offload: keys must be op names (str)");
        const int32_t op = offload_op(key.cast<std::string>());
        if (!py::isinstance<py::tuple>(value) || py::len(value) != 2) {
            throw py::type_error("Policy.offload['" + key.cast<std::string>() +
                                 "'] must be a tuple (enabled: bool, min_batch: int)");
        }
        const auto t = value.cast<py::tuple>();
        set_rule(updated, op, t[0].cast<bool>(), t[1].cast<int32_t>());
    }
    p = updated;
}

std::string expert_copy_name(int32_t copy) {
    switch (copy) {
        case MOE_EXPERT_COPY_FULL: return "full";
        case MOE_EXPERT_COPY_ACTIVE_ONLY: return "active";
        case MOE_EXPERT_COPY_ACTIVE_PREFETCH: return "prefetch";
        case MOE_EXPERT_COPY_AUTO: return "auto";
        default: return "expert_copy" + std::to_string(copy);
    }
}

int32_t expert_copy_from_name(const std::string& name) {
    if (name == "full") return MOE_EXPERT_COPY_FULL;
    if (name == "active") return MOE_EXPERT_COPY_ACTIVE_ONLY;
    if (name == "prefetch") return MOE_EXPERT_COPY_ACTIVE_PREFETCH;
    if (name == "auto") return MOE_EXPERT_COPY_AUTO;
    throw py::value_error("Policy: expert_copy must be 'full', 'active', 'prefetch' or 'auto', got '" + name + "'");
}

// "mul_mat=on,mul_mat_id=128,moe_up_gate=off": the rules as a spec parse_offload accepts.
std::string offload_spec(const moe_sched_policy& p) {
    std::string spec;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        const moe_offload_rule& r = p.offload[op];
        spec += (op ? "," : "") + moeinfer::offload_op_name(op).value_or("?") + "=" +
                (r.enabled == 0 ? std::string("off") : r.min_batch < 0 ? std::string("on") : std::to_string(r.min_batch));
    }
    return spec;
}

int32_t checked_expert_split(int32_t n) {
    if (n < MOE_EXPERT_SPLIT_AUTO) {
        throw py::value_error("expert_split must be >= 0 (experts per layer on the host) or -1 (automatic), got " +
                              std::to_string(n));
    }
    return n;
}

int64_t checked_expert_cache(int64_t bytes) {
    if (bytes < MOE_EXPERT_CACHE_AUTO) {
        throw py::value_error("expert_cache must be >= 0 (bytes; 0 turns the cache off) or -1 (automatic), got " +
                              std::to_string(bytes));
    }
    return bytes;
}

bool same(const moe_sched_policy& a, const moe_sched_policy& b) {
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        if ((a.offload[op].enabled != 0) != (b.offload[op].enabled != 0) ||
            a.offload[op].min_batch != b.offload[op].min_batch) {
            return false;
        }
    }
    return a.expert_copy == b.expert_copy && (a.bias_dup != 0) == (b.bias_dup != 0) &&
           a.offload_vram_budget == b.offload_vram_budget && a.expert_split == b.expert_split &&
           a.expert_cache == b.expert_cache;
}

moe_sched_policy create(const py::object& offload, const std::string& expert_copy, bool bias_dup,
                        uint64_t offload_vram_budget, int32_t expert_split, int64_t expert_cache) {
    moe_sched_policy p = moeinfer::sched_policy();
    if (py::isinstance<py::str>(offload)) {
        moeinfer::parse_offload(p, offload.cast<std::string>());
    } else if (py::isinstance<py::dict>(offload)) {
        set_offload_dict(p, offload.cast<py::dict>());
    } else if (!offload.is_none()) {
        throw py::type_error("Policy: offload must be a spec string, a dict or None");
    }
    p.expert_copy = expert_copy_from_name(expert_copy);
    p.bias_dup = bias_dup ? 1 : 0;
    p.offload_vram_budget = offload_vram_budget;
    p.expert_split = checked_expert_split(expert_split);
    p.expert_cache = checked_expert_cache(expert_cache);
    return p;
}

}  // namespace

void bind_policy(py::module_& m) {
    using namespace pybind11::literals;
    std::string ops;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        ops += (op ? ", " : "") + std::string("\"") + moeinfer::offload_op_name(op).value_or("?") + "\"";
    }
    py::class_<moe_sched_policy>(m, "Policy",
                                 ("The hybrid scheduler's policy (device contexts: device=\"cuda\" or \"emulated\").\n\n"
                                  "offload: per op (" + ops + ") a tuple (enabled, min_batch): an op whose\n"
                                  "weights are in host RAM runs on the device when enabled and the ubatch has at\n"
                                  "least min_batch tokens (-1: the default threshold, measured at context\n"
                                  "creation on CUDA, else 32 for mul_mat and 32 * n_expert / n_expert_used for\n"
                                  "the expert ops; Context.stats()[\"offload_min_batch\"] and\n"
                                  "[\"offload_min_batch_source\"] say which). expert_copy: \"full\" uploads\n"
                                  "whole expert tensors, \"active\" only the experts the router selected,\n"
                                  "\"prefetch\" active plus an early upload of the experts the previous ubatch used,\n"
                                  "\"auto\" (the default) active while a ubatch has fewer than 2 * n_expert (token,\n"
                                  "expert) pairs, full from there on.\n"
                                  "bias_dup: keep expert biases on both sides. offload_vram_budget: bytes of\n"
                                  "device memory for the upload slots (0: automatic). expert_split: while a\n"
                                  "layer's host-resident experts are offloaded, the host computes this many of them\n"
                                  "at the same time as the device the rest (-1: automatic, 0: off). expert_cache:\n"
                                  "bytes of device memory that keep uploaded experts for the next ubatches (-1:\n"
                                  "automatic, half the device's free memory beyond 1 GiB; 0: off).")
                                     .c_str())
        .def(py::init(&create), py::kw_only(), "offload"_a = py::none(), "expert_copy"_a = "auto",
             "bias_dup"_a = true, "offload_vram_budget"_a = 0, "expert_split"_a = MOE_EXPERT_SPLIT_AUTO,
             "expert_cache"_a = MOE_EXPERT_CACHE_AUTO,
             R"(The library's defaults, changed by the arguments given.

offload: None, a spec string (see parse_offload) or a dict {"op": (enabled, min_batch)}.
ValueError for an unknown op, a bad threshold, expert_copy, expert_split or expert_cache.)")
        .def_property(
            "offload", [](const moe_sched_policy& p) { return offload_dict(p); }, &set_offload_dict,
            "{op name: (enabled, min_batch)}: a copy; assign a dict to change rules (ops left out keep theirs).")
        .def(
            "set_offload",
            [](moe_sched_policy& p, const std::string& op, bool enabled, int32_t min_batch) -> moe_sched_policy& {
                set_rule(p, offload_op(op), enabled, min_batch);
                return p;
            },
            "op"_a, "enabled"_a = true, "min_batch"_a = -1, py::return_value_policy::reference_internal,
            "Sets one op's rule; returns this policy.")
        .def(
            "parse_offload",
            [](moe_sched_policy& p, const std::string& spec) -> moe_sched_policy& {
                moeinfer::parse_offload(p, spec);
                return p;
            },
            "spec"_a, py::return_value_policy::reference_internal,
            R"(Applies an offload spec "op=N|on|off[,op=N|on|off...]" and returns this policy.

"all" names every op; N is min_batch, "on" restores the default threshold, "off" disables the op.
ValueError naming the bad entry (unknown op, negative or non-numeric threshold); the policy is
unchanged then.)")
        .def_property(
            "expert_copy", [](const moe_sched_policy& p) { return expert_copy_name(p.expert_copy); },
            [](moe_sched_policy& p, const std::string& name) { p.expert_copy = expert_copy_from_name(name); },
            "\"full\" (upload whole expert tensors), \"active\" (only the selected experts), \"prefetch\" or "
            "\"auto\" (active for small ubatches, full for large ones).")
        .def_property(
            "bias_dup", [](const moe_sched_policy& p) { return p.bias_dup != 0; },
            [](moe_sched_policy& p, bool v) { p.bias_dup = v ? 1 : 0; },
            "Keep expert biases whose weights are in host RAM on both sides.")
        .def_readwrite("offload_vram_budget", &moe_sched_policy::offload_vram_budget,
                       "Bytes of device memory for the offload staging slots; 0: automatic.")
        .def_property(
            "expert_split", [](const moe_sched_policy& p) { return p.expert_split; },
            [](moe_sched_policy& p, int32_t n) { p.expert_split = checked_expert_split(n); },
            "Experts per layer the host computes while the device computes the rest (-1: automatic, 0: off).")
        .def_property(
            "expert_cache", [](const moe_sched_policy& p) { return p.expert_cache; },
            [](moe_sched_policy& p, int64_t n) { p.expert_cache = checked_expert_cache(n); },
            "Bytes of device memory that keep uploaded experts for the next ubatches (-1: automatic, 0: off).")
        .def(
            "__eq__", [](const moe_sched_policy& a, const moe_sched_policy& b) { return same(a, b); },
            py::is_operator())
        .def("__copy__", [](const moe_sched_policy& p) { return p; })
        .def("__deepcopy__", [](const moe_sched_policy& p, const py::object&) { return p; }, "memo"_a)
        .def("__repr__", [](const moe_sched_policy& p) {
            return "moeinfer.Policy(offload='" + offload_spec(p) + "', expert_copy='" + expert_copy_name(p.expert_copy) +
                   "', bias_dup=" + (p.bias_dup != 0 ? "True" : "False") +
                   ", offload_vram_budget=" + std::to_string(p.offload_vram_budget) +
                   ", expert_split=" + std::to_string(p.expert_split) +
                   ", expert_cache=" + std::to_string(p.expert_cache) + ")";
        });
}

}  // namespace moeinfer_py
