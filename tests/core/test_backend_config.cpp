// The backend options string (core/backend_config.h): every key parsed, bad input refused naming it, the
// environment as the fallback for keys left out (with each variable's own rules), the string winning
// over it. The environment is a map here, so that nothing leaks between tests.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "core/backend_config.h"

using moe::BackendConfig;
using moe::ExpertGemmDecode;
using moe::parse_backend_config;
using moe::PullCopies;

namespace {

struct FakeEnv {
    std::map<std::string, std::string> vars;
    moe::EnvLookup lookup() const {
        return [this](const char* name) -> const char* {
            const auto it = vars.find(name);
            return it == vars.end() ? nullptr : it->second.c_str();
        };
    }
};

BackendConfig parse_ok(const std::string& spec, const FakeEnv& env = {}) {
    moe::StatusOr<BackendConfig> c = parse_backend_config(spec, env.lookup());
    INFO(spec << ": " << c.status().message());
    REQUIRE(c.is_ok());
    return *c;
}

// The message of a refused spec.
std::string refused(const std::string& spec) {
    moe::StatusOr<BackendConfig> c = parse_backend_config(spec, FakeEnv{}.lookup());
    REQUIRE_FALSE(c.is_ok());
    CHECK(c.status().code() == MOE_STATUS_INVALID_ARGUMENT);
    return c.status().message();
}

}  // namespace

TEST_CASE("backend options: nothing given and no environment gives the documented defaults", "[core]") {
    const BackendConfig c = parse_ok("");
    CHECK(c.cuda_graphs);
    CHECK(c.cuda_fusion);
    CHECK_FALSE(c.cuda_pdl.has_value());
    CHECK(c.cuda_pull_copies == PullCopies::WHILE_UPLOADING);
    CHECK_FALSE(c.emulated_async);
    CHECK(c.emulated_pcie_gbps == 0.0);
    CHECK(c.emulated_vram == (uint64_t{64} << 30));
    CHECK_FALSE(c.offload_calibration.has_value());
    CHECK(c.expert_gemm_decode == ExpertGemmDecode::FUSED);
    CHECK(c.cpu_moe_fusion);
    CHECK_FALSE(c.stable_kv);
}

TEST_CASE("backend options: each key takes each of its values", "[core]") {
    for (const char* on : {"on", "1"}) {
        for (const char* off : {"off", "0"}) {
            const std::string s = std::string("cuda_graphs=") + off + ",cuda_fusion=" + off + ",cuda_pdl=" + on +
                                  ",emulated_async=" + on + ",offload_calibration=" + off;
            const BackendConfig c = parse_ok(s);
            CHECK_FALSE(c.cuda_graphs);
            CHECK_FALSE(c.cuda_fusion);
            CHECK(c.cuda_pdl == std::optional<bool>(true));
            CHECK(c.emulated_async);
            CHECK(c.offload_calibration == std::optional<bool>(false));
            const BackendConfig d = parse_ok(std::string("cuda_graphs=") + on + ",cuda_fusion=" + on + ",cuda_pdl=" +
                                             off + ",emulated_async=" + off + ",offload_calibration=" + on);
            CHECK(d.cuda_graphs);
            CHECK(d.cuda_fusion);
            CHECK(d.cuda_pdl == std::optional<bool>(false));
            CHECK_FALSE(d.emulated_async);
            CHECK(d.offload_calibration == std::optional<bool>(true));
        }
    }
    CHECK_FALSE(parse_ok("offload_calibration=auto").offload_calibration.has_value());
    CHECK(parse_ok("stable_kv=on").stable_kv);
    CHECK_FALSE(parse_ok("stable_kv=off").stable_kv);
    CHECK(parse_ok("cuda_pull_copies=never").cuda_pull_copies == PullCopies::NEVER);
    CHECK(parse_ok("cuda_pull_copies=always").cuda_pull_copies == PullCopies::ALWAYS);
    CHECK(parse_ok("cuda_pull_copies=auto").cuda_pull_copies == PullCopies::WHILE_UPLOADING);
    CHECK(parse_ok("emulated_pcie_gbps=0.005").emulated_pcie_gbps == 0.005);
    CHECK(parse_ok("emulated_pcie_gbps=0").emulated_pcie_gbps == 0.0);
    CHECK(parse_ok("emulated_vram=123456789").emulated_vram == 123456789u);
    CHECK(parse_ok("emulated_vram=0").emulated_vram == 0u);
    CHECK(parse_ok("expert_gemm_decode=fused").expert_gemm_decode == ExpertGemmDecode::FUSED);
    CHECK(parse_ok("expert_gemm_decode=scratch").expert_gemm_decode == ExpertGemmDecode::SCRATCH);
}

TEST_CASE("backend options: a bad entry is refused naming it", "[core]") {
    std::string m = refused("cuda_graph=off");
    CHECK_THAT(m, Catch::Contains("'cuda_graph=off'"));
    CHECK_THAT(m, Catch::Contains("unknown key 'cuda_graph'"));
    CHECK_THAT(m, Catch::Contains("cuda_graphs, cuda_fusion"));  // the known keys
    m = refused("cuda_fusion=maybe");
    CHECK_THAT(m, Catch::Contains("cuda_fusion takes on|off, got 'maybe'"));
    CHECK_THAT(refused("cuda_pull_copies=1"), Catch::Contains("cuda_pull_copies takes auto|never|always, got '1'"));
    CHECK_THAT(refused("emulated_pcie_gbps=-1"), Catch::Contains("emulated_pcie_gbps takes GB/s, >= 0, got '-1'"));
    CHECK_THAT(refused("emulated_pcie_gbps=inf"), Catch::Contains("got 'inf'"));
    CHECK_THAT(refused("emulated_pcie_gbps=1x"), Catch::Contains("got '1x'"));
    CHECK_THAT(refused("emulated_vram=-5"), Catch::Contains("emulated_vram takes bytes, got '-5'"));
    CHECK_THAT(refused("emulated_vram=1GiB"), Catch::Contains("got '1GiB'"));
    CHECK_THAT(refused("emulated_vram="), Catch::Contains("got ''"));
    CHECK_THAT(refused("offload_calibration=yes"), Catch::Contains("offload_calibration takes auto|on|off"));
    CHECK_THAT(refused("expert_gemm_decode=on"), Catch::Contains("expert_gemm_decode takes fused|scratch, got 'on'"));
    CHECK_THAT(refused("cuda_graphs"), Catch::Contains("'cuda_graphs': expected key=value"));
    CHECK_THAT(refused("cuda_graphs=on,"), Catch::Contains("empty entry"));
    CHECK_THAT(refused(",cuda_graphs=on"), Catch::Contains("empty entry"));
    CHECK_THAT(refused("cuda_graphs=on,cuda_graphs=off"), Catch::Contains("cuda_graphs is given twice"));
    CHECK_THAT(refused("CUDA_GRAPHS=on"), Catch::Contains("unknown key 'CUDA_GRAPHS'"));  // keys are exact
}

TEST_CASE("backend options: a key left out takes its environment variable, with the variable's rules", "[core]") {
    FakeEnv env;
    env.vars = {{"MOEINFER_CUDA_GRAPHS", "0"},        {"MOEINFER_CUDA_FUSION", "0"},
                {"MOEINFER_CUDA_PDL", "0"},           {"MOEINFER_CUDA_PULL_COPIES", "1"},
                {"MOEINFER_EMULATED_ASYNC", "1"},     {"MOEINFER_EMULATED_PCIE_GBPS", "2.5"},
                {"MOEINFER_EMULATED_VRAM", "1048576"}, {"MOEINFER_EXPERT_GEMM_DECODE", "scratch"}};
    BackendConfig c = parse_ok("", env);
    CHECK(c.expert_gemm_decode == ExpertGemmDecode::SCRATCH);
    CHECK_FALSE(c.cuda_graphs);
    CHECK_FALSE(c.cuda_fusion);
    CHECK(c.cuda_pdl == std::optional<bool>(false));
    CHECK(c.cuda_pull_copies == PullCopies::ALWAYS);
    CHECK(c.emulated_async);
    CHECK(c.emulated_pcie_gbps == 2.5);
    CHECK(c.emulated_vram == 1048576u);

    // The variables' own rules: anything but "0" keeps a default-on switch on, only "1" turns the
    // asynchronous device on, "0" / "1" select the pull mode, malformed numbers are ignored.
    env.vars = {{"MOEINFER_CUDA_GRAPHS", "off"},      {"MOEINFER_CUDA_PDL", "yes"},
                {"MOEINFER_CUDA_PULL_COPIES", "0"},   {"MOEINFER_EMULATED_ASYNC", "on"},
                {"MOEINFER_EMULATED_PCIE_GBPS", "-3"}, {"MOEINFER_EMULATED_VRAM", "12x"},
                {"MOEINFER_EXPERT_GEMM_DECODE", "on"}};
    c = parse_ok("", env);
    CHECK(c.expert_gemm_decode == ExpertGemmDecode::FUSED);
    CHECK(c.cuda_graphs);
    CHECK(c.cuda_pdl == std::optional<bool>(true));
    CHECK(c.cuda_pull_copies == PullCopies::NEVER);
    CHECK_FALSE(c.emulated_async);
    CHECK(c.emulated_pcie_gbps == 0.0);
    CHECK(c.emulated_vram == (uint64_t{64} << 30));
}

TEST_CASE("backend options: a key given wins over its environment variable, the others still fall back", "[core]") {
    FakeEnv env;
    env.vars = {{"MOEINFER_CUDA_GRAPHS", "0"}, {"MOEINFER_EMULATED_VRAM", "1000"}, {"MOEINFER_EMULATED_ASYNC", "1"}};
    const BackendConfig c = parse_ok("cuda_graphs=on,emulated_vram=2000", env);
    CHECK(c.cuda_graphs);
    CHECK(c.emulated_vram == 2000u);
    CHECK(c.emulated_async);  // not given: the variable's
    const BackendConfig d = parse_ok("emulated_async=off", env);
    CHECK_FALSE(d.emulated_async);
    CHECK_FALSE(d.cuda_graphs);
    CHECK(d.emulated_vram == 1000u);
}

TEST_CASE("backend options: the help text names every key, its values and its variable", "[core]") {
    const std::string& help = moe::backend_options_help();
    for (const char* key : {"cuda_graphs=on|off", "cuda_fusion=on|off", "cuda_pdl=on|off",
                            "cuda_pull_copies=auto|never|always", "emulated_async=on|off", "emulated_pcie_gbps=",
                            "emulated_vram=bytes", "offload_calibration=auto|on|off", "env MOEINFER_CUDA_GRAPHS",
                            "env MOEINFER_EMULATED_VRAM", "expert_gemm_decode=fused|scratch",
                            "env MOEINFER_EXPERT_GEMM_DECODE", "emulated_busy=0..7|none", "cpu_moe_fusion=on|off",
                            "env MOEINFER_CPU_MOE_FUSION", "stable_kv=on|off"}) {
        CHECK_THAT(help, Catch::Contains(key));
    }
}

TEST_CASE("backend options: emulated_busy names one emulated device that refuses to open", "[core]") {
    CHECK(parse_ok("").emulated_busy == -1);
    CHECK(parse_ok("emulated_busy=3").emulated_busy == 3);
    CHECK(parse_ok("emulated_busy=none").emulated_busy == -1);
    CHECK_THAT(refused("emulated_busy=8"), Catch::Contains("emulated_busy takes 0..7|none, got '8'"));
    CHECK_THAT(refused("emulated_busy=-1"), Catch::Contains("emulated_busy"));
}

TEST_CASE("backend options: kquant_gemv selects the decoded-type GEMV, v3 by default", "[core]") {
    using moe::KquantGemv;
    CHECK(parse_ok("").kquant_gemv == KquantGemv::V3);
    CHECK(parse_ok("kquant_gemv=v1").kquant_gemv == KquantGemv::V1);
    CHECK(parse_ok("kquant_gemv=v2").kquant_gemv == KquantGemv::V2);
    CHECK(parse_ok("kquant_gemv=v3").kquant_gemv == KquantGemv::V3);
    CHECK_THAT(refused("kquant_gemv=v4"), Catch::Contains("kquant_gemv takes v3|v2|v1, got 'v4'"));
    FakeEnv env;
    env.vars = {{"MOEINFER_KQUANT_GEMV", "v2"}};
    CHECK(parse_ok("", env).kquant_gemv == KquantGemv::V2);
    env.vars = {{"MOEINFER_KQUANT_GEMV", "v1"}};
    CHECK(parse_ok("", env).kquant_gemv == KquantGemv::V1);
    CHECK(parse_ok("kquant_gemv=v2", env).kquant_gemv == KquantGemv::V2);  // the string wins
    env.vars = {{"MOEINFER_KQUANT_GEMV", "1"}};                              // not a value: the default
    CHECK(parse_ok("", env).kquant_gemv == KquantGemv::V3);
    CHECK_THAT(moe::backend_options_help(), Catch::Contains("kquant_gemv=v3|v2|v1"));
    CHECK_THAT(moe::backend_options_help(), Catch::Contains("env MOEINFER_KQUANT_GEMV"));
}

TEST_CASE("backend options: float_gemv selects the dense float-weight GEMV, v2 by default", "[core]") {
    using moe::FloatGemv;
    CHECK(parse_ok("").float_gemv == FloatGemv::V2);
    CHECK(parse_ok("float_gemv=v1").float_gemv == FloatGemv::V1);
    CHECK(parse_ok("float_gemv=v2").float_gemv == FloatGemv::V2);
    CHECK_THAT(refused("float_gemv=v3"), Catch::Contains("float_gemv takes v2|v1, got 'v3'"));
    CHECK_THAT(refused("float_gemv=v1,float_gemv=v2"), Catch::Contains("float_gemv is given twice"));
    FakeEnv env;
    env.vars = {{"MOEINFER_FLOAT_GEMV", "v1"}};
    CHECK(parse_ok("", env).float_gemv == FloatGemv::V1);
    CHECK(parse_ok("float_gemv=v2", env).float_gemv == FloatGemv::V2);  // the string wins
    env.vars = {{"MOEINFER_FLOAT_GEMV", "v9"}};  // not a value: the default
    CHECK(parse_ok("", env).float_gemv == FloatGemv::V2);
    CHECK_THAT(moe::backend_options_help(), Catch::Contains("float_gemv=v2|v1"));
    CHECK_THAT(moe::backend_options_help(), Catch::Contains("env MOEINFER_FLOAT_GEMV"));
}

TEST_CASE("backend options: peer_copies forces the staged crossing between devices, auto by default", "[core]") {
    using moe::PeerCopies;
    CHECK(parse_ok("").peer_copies == PeerCopies::AUTO);
    CHECK(parse_ok("peer_copies=staged").peer_copies == PeerCopies::STAGED);
    CHECK(parse_ok("peer_copies=auto").peer_copies == PeerCopies::AUTO);
    CHECK_THAT(refused("peer_copies=peer"), Catch::Contains("peer_copies takes auto|staged, got 'peer'"));
    CHECK_THAT(refused("peer_copies=auto,peer_copies=staged"), Catch::Contains("peer_copies is given twice"));
    CHECK_THAT(moe::backend_options_help(), Catch::Contains("peer_copies=auto|staged  (default auto)"));
}
