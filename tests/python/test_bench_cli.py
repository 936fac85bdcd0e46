"""moeinfer-bench, end to end: runs the tool on tiny synthetic models and checks its text, CSV and JSON
output (columns, row counts, and the derived numbers against Python's own arithmetic), the synthetic
model cache, and that bad arguments give one clear line on stderr with exit status 2.

The binary is found through $MOEINFER_TOOLS_DIR, else the newest <repo>/build*/tools/moeinfer-bench;
every test is skipped (with the reason) when there is none.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import statistics
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = "moeinfer-bench"

SWEEP_COLUMNS = ["PP", "TG", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s"]
BENCH_COLUMNS = ["model", "size", "params", "backend", "threads", "test", "t/s"]
COMMON_FIELDS = ["model", "model_path", "size_bytes", "n_params", "backend", "n_threads", "n_ctx", "n_ubatch",
                 "version"]
SWEEP_FIELDS = COMMON_FIELDS + ["pp", "tg", "n_kv", "t_pp_s", "speed_pp_tps", "t_tg_s", "speed_tg_tps"]
BENCH_FIELDS = COMMON_FIELDS + ["test", "n_prompt", "n_gen", "n_depth", "repetitions", "avg_s", "stdev_s", "avg_ts",
                                "stdev_ts"]
# Appended after the llama-bench-like fields: run settings, then the scheduler statistics of the row.
RUN_FIELDS = ["n_batch", "tensor_overrides", "n_cpu_moe", "n_gpu_layers", "vram_budget", "offload_policy",
              "offload_thresholds", "backend_options", "expert_copy", "bias_dup", "offload_vram_budget", "expert_split", "weights_host_bytes",
              "weights_device_bytes"]
OPS = ["mul_mat", "mul_mat_id", "moe_up_gate"]
STATS_FIELDS = (["n_ubatches", "n_splits", "bytes_weights_full", "bytes_weights_experts", "bytes_weights_skipped",
                 "bytes_activations", "n_weight_copies", "n_activation_copies", "n_id_readbacks"] +
                [f"n_offloaded_{op}" for op in OPS] + [f"n_kept_host_{op}" for op in OPS] +
                ["n_ops_host", "n_ops_device", "seconds_total", "seconds_host_compute", "seconds_wait", "seconds_device_submit",
                 "n_split_layers", "n_split_host_experts", "n_split_trials", "n_cache_hits", "n_cache_misses",
                 "bytes_cache_saved", "bytes_between_devices", "bytes_weights_relayed", "bytes_uploaded", "bytes_uploaded_per_ubatch", "upload_gbps"])
SWEEP_CSV_FIELDS = (SWEEP_FIELDS + RUN_FIELDS + ["sched_pp_" + f for f in STATS_FIELDS] +
                    ["sched_tg_" + f for f in STATS_FIELDS])
BENCH_CSV_FIELDS = BENCH_FIELDS + RUN_FIELDS + ["sched_" + f for f in STATS_FIELDS]

# Speeds are printed with 9 significant digits: derived values agree with Python's to this much.
REL = 1e-6


def _find_tool() -> Path | None:
    env = os.environ.get("MOEINFER_TOOLS_DIR")
    if env:
        p = Path(env) / TOOL
        return p if p.is_file() else None
    found = [p for p in REPO.glob(f"build*/tools/{TOOL}") if p.is_file() and os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


BIN = _find_tool()
pytestmark = pytest.mark.skipif(
    BIN is None, reason=f"{TOOL} not built (set MOEINFER_TOOLS_DIR or build it into {REPO}/build*/tools)")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One synthetic-model cache for the module: each spec is written once, then reused."""
    return tmp_path_factory.mktemp("bench_synth")


def run(*args: str, cache: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = [str(BIN), *args]
    if cache is not None:
        argv += ["--synthetic-dir", str(cache)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}\nstderr:\n{proc.stderr}\nstdout:\n{proc.stdout}")
    return proc


def tiny(arch: str = "qwen3moe") -> list[str]:
    return ["--synthetic", f"{arch}:preset=tiny", "-t", "2"]


def markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table in `text`: (header cells, data rows); the |---| rule is checked and dropped."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(lines) >= 2, f"no markdown table in:\n{text}"
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    header, rule, rows = cells[0], cells[1], cells[2:]
    assert all(re.fullmatch(r":?-+:?", c) for c in rule), f"bad rule line: {lines[1]}"
    assert all(len(r) == len(header) for r in rows), f"ragged table:\n{text}"
    return header, rows


def close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------------------------

def test_sweep_text_table(cache_dir):
    out = run(*tiny(), "-c", "128", "-ub", "32", "--sweep-tg", "4", cache=cache_dir).stdout
    header, rows = markdown_table(out)
    assert header == SWEEP_COLUMNS
    # N_KV = 0, 32, 64, 96: each row needs max(PP, TG) more tokens below n_ctx = 128.
    assert [int(r[2]) for r in rows] == [0, 32, 64, 96]
    assert all(int(r[0]) == 32 and int(r[1]) == 4 for r in rows)
    for r in rows:
        assert float(r[3]) >= 0 and float(r[4]) > 0 and float(r[5]) >= 0 and float(r[6]) > 0


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "glm4moe", "deepseek2"])
def test_sweep_json_records(cache_dir, arch):
    proc = run(*tiny(arch), "-c", "64", "-ub", "16", "--sweep-pp", "24", "--sweep-tg", "3", "-o", "json",
               cache=cache_dir)
    records = json.loads(proc.stdout)
    # PP 24 (not the ubatch) sets the step: 0, 24 fit (24 + 24 <= 64), 48 does not.
    assert [r["n_kv"] for r in records] == [0, 24]
    for r in records:
        assert list(r)[: len(SWEEP_FIELDS)] == SWEEP_FIELDS
        assert r["pp"] == 24 and r["tg"] == 3
        assert r["n_ctx"] == 64 and r["n_ubatch"] == 16 and r["n_threads"] == 2
        assert r["model"].startswith(arch + " ")
        assert r["size_bytes"] > 0 and r["n_params"] > 0
        assert r["t_pp_s"] > 0 and r["t_tg_s"] > 0
        assert close(r["speed_pp_tps"], r["pp"] / r["t_pp_s"])
        assert close(r["speed_tg_tps"], r["tg"] / r["t_tg_s"])
        assert "profile" not in r


def test_sweep_runs_deepseek2_prompts_in_both_attention_forms(cache_dir):
    """Ubatches of 32 (kMlaDecompressMinTokens: the keys and values up-projected per head) and the 4-token decode
    steps (latent space) through the sweep, at depths 0, 32, 64 and 96."""
    out = run(*tiny("deepseek2"), "-c", "128", "-ub", "32", "--sweep-tg", "4", "-o", "csv", cache=cache_dir).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [int(r["n_kv"]) for r in rows] == [0, 32, 64, 96]
    assert all(float(r["speed_pp_tps"]) > 0 and float(r["speed_tg_tps"]) > 0 for r in rows)


def test_sweep_csv_rows(cache_dir):
    out = run(*tiny(), "-c", "96", "-ub", "32", "--sweep-tg", "2", "-o", "csv", cache=cache_dir).stdout
    reader = csv.DictReader(io.StringIO(out))
    assert reader.fieldnames == SWEEP_CSV_FIELDS
    rows = list(reader)
    assert [int(r["n_kv"]) for r in rows] == [0, 32, 64]
    for r in rows:
        assert close(float(r["speed_pp_tps"]), int(r["pp"]) / float(r["t_pp_s"]))
        assert close(float(r["speed_tg_tps"]), int(r["tg"]) / float(r["t_tg_s"]))


def test_sweep_is_default_mode(cache_dir):
    out = run(*tiny(), "-c", "32", "-ub", "16", "--sweep-tg", "2", cache=cache_dir).stdout
    header, rows = markdown_table(out)
    assert header == SWEEP_COLUMNS and len(rows) == 2


# ---------------------------------------------------------------------------------------------
# llama-bench style tests
# ---------------------------------------------------------------------------------------------

def test_bench_text_table(cache_dir):
    out = run(*tiny(), "-p", "16,32", "-n", "4", "-r", "2", cache=cache_dir).stdout
    header, rows = markdown_table(out)
    assert header == BENCH_COLUMNS
    assert [r[5] for r in rows] == ["pp16", "pp32", "tg4"]
    for r in rows:
        assert r[0].startswith("qwen3moe ")
        assert re.fullmatch(r"\d+\.\d\d (MiB|GiB)", r[1]) and re.fullmatch(r"\d+\.\d\d [MB]", r[2])
        assert r[3] == "CPU" or r[3] == "CUDA"
        assert r[4] == "2"
        m = re.fullmatch(r"(\d+\.\d\d) ± (\d+\.\d\d)", r[6])
        assert m and float(m.group(1)) > 0
    assert re.search(r"^build: moeinfer \d+\.\d+\.\d+", out, re.M)


def test_bench_json_statistics(cache_dir):
    reps = 3
    proc = run(*tiny(), "-p", "16", "-n", "4", "-d", "0,8", "-r", str(reps), "-o", "json", cache=cache_dir)
    records = json.loads(proc.stdout)
    assert [r["test"] for r in records] == ["pp16", "pp16 @ d8", "tg4", "tg4 @ d8"]
    assert records[0]["n_ctx"] == 24  # auto: the longest test, pp16 @ d8
    for r in records:
        assert list(r)[: len(BENCH_FIELDS)] == BENCH_FIELDS
        n = r["n_prompt"] or r["n_gen"]
        assert (r["n_prompt"] == 0) != (r["n_gen"] == 0)
        assert r["repetitions"] == reps
        s, ts = r["samples_s"], r["samples_ts"]
        assert len(s) == reps and len(ts) == reps
        assert all(x > 0 for x in s)
        # The tool's statistics against Python's: tokens/s per run, mean, sample standard deviation.
        assert all(close(t, n / x) for t, x in zip(ts, s))
        assert close(r["avg_s"], statistics.fmean(s))
        # The samples are printed to 9 significant digits: a spread far below the mean is known to REL of the
        # mean, not of itself.
        assert math.isclose(r["stdev_s"], statistics.stdev(s), rel_tol=REL, abs_tol=REL * statistics.fmean(s))
        assert close(r["avg_ts"], statistics.fmean(ts))
        assert math.isclose(r["stdev_ts"], statistics.stdev(ts), rel_tol=REL, abs_tol=REL * statistics.fmean(ts))


def test_bench_auto_ctx_fits_longest_test(cache_dir):
    records = json.loads(run(*tiny(), "-p", "16", "-n", "0", "-d", "8", "-r", "1", "-o", "json",
                             cache=cache_dir).stdout)
    assert len(records) == 1 and records[0]["test"] == "pp16 @ d8"
    assert records[0]["n_ctx"] == 24


def test_bench_csv_rows(cache_dir):
    out = run(*tiny(), "-p", "8", "-n", "2,3", "-r", "1", "-o", "csv", cache=cache_dir).stdout
    reader = csv.DictReader(io.StringIO(out))
    assert reader.fieldnames == BENCH_CSV_FIELDS
    rows = list(reader)
    assert [r["test"] for r in rows] == ["pp8", "tg2", "tg3"]
    for r in rows:
        assert int(r["repetitions"]) == 1
        assert float(r["stdev_s"]) == 0.0  # one run: no spread
        n = int(r["n_prompt"]) or int(r["n_gen"])
        assert close(float(r["avg_ts"]), n / float(r["avg_s"]))


def test_threads_flag(cache_dir):
    records = json.loads(run(*tiny()[:2], "-t", "1", "-p", "8", "-n", "0", "-r", "1", "-o", "json",
                             cache=cache_dir).stdout)
    assert records[0]["n_threads"] == 1


# ---------------------------------------------------------------------------------------------
# verbose profile, progress
# ---------------------------------------------------------------------------------------------

def test_verbose_profile(cache_dir):
    proc = run(*tiny(), "-p", "16", "-n", "2", "-r", "1", "-v", "-o", "json", cache=cache_dir)
    records = json.loads(proc.stdout)  # the profile goes to stderr: stdout stays valid JSON
    for r in records:
        prof = r["profile"]
        assert prof, "verbose run without a profile"
        assert {"op", "backend", "count", "seconds"} <= set(prof[0])
        assert all(e["count"] > 0 and e["seconds"] >= 0 for e in prof)
        # Ops of one run cannot take longer than the run (the profile covers the last run only).
        assert sum(e["seconds"] for e in prof) <= r["samples_s"][-1] * 1.05 + 1e-3
    assert proc.stderr.count("profile of ") == len(records)
    assert re.search(r"^\s+op\s+backend\s+count\s+seconds\s+%", proc.stderr, re.M)


def test_progress_goes_to_stderr(cache_dir):
    proc = run(*tiny(), "-c", "32", "-ub", "16", "--sweep-tg", "2", "--progress", "-o", "csv", cache=cache_dir)
    assert "sweep row" in proc.stderr
    assert len(list(csv.DictReader(io.StringIO(proc.stdout)))) == 2


# ---------------------------------------------------------------------------------------------
# synthetic model cache
# ---------------------------------------------------------------------------------------------

def test_synthetic_file_written_once_and_reused(tmp_path):
    args = ["-p", "8", "-n", "0", "-r", "1", "-o", "json", "-t", "2"]
    first = run("--synthetic", "qwen3moe:preset=tiny:layers=1:experts=q8_0:seed=5", *args, cache=tmp_path)
    files = list(tmp_path.glob("*.gguf"))
    assert len(files) == 1 and "writing synthetic model" in first.stderr
    stamp = files[0].stat().st_mtime_ns
    # Same spec, other key order and spelling of the type: the same file, not rewritten.
    second = run("--synthetic", "qwen3moe:seed=5:experts=Q8_0:layers=1:preset=tiny", *args, "-v", cache=tmp_path)
    assert "writing synthetic model" not in second.stderr and "reusing synthetic model" in second.stderr
    assert list(tmp_path.glob("*.gguf")) == files and files[0].stat().st_mtime_ns == stamp
    assert json.loads(second.stdout)[0]["model_path"] == str(files[0])
    assert not list(tmp_path.glob("*.tmp-*"))
    # A different spec is a different file.
    run("--synthetic", "qwen3moe:preset=tiny:layers=1:seed=6", *args, cache=tmp_path)
    assert len(list(tmp_path.glob("*.gguf"))) == 2
    # experts= also takes a recipe of types by role (one file whatever its spelling).
    spec = "qwen3moe:preset=tiny:layers=1:embd=256:ff=256:head_dim=64:seed=5:experts="
    run("--synthetic", spec + "q4_k_m", *args, cache=tmp_path)
    reused = run("--synthetic", spec + "Q4_K_M", *args, "-v", cache=tmp_path)
    assert "reusing synthetic model" in reused.stderr
    recipe_file = [f for f in tmp_path.glob("*.gguf") if "q4_k_m" in f.name]
    assert len(recipe_file) == 1 and len(list(tmp_path.glob("*.gguf"))) == 3
    import moeinfer  # only here: the other tests need just the tool
    types = {t.type for t in moeinfer.Model(str(recipe_file[0])).tensors}
    assert {"q4_K", "q6_K"} <= types, types
    # recipe= names the same recipe (the same file); recipe=iq4_xs is the mix, experts=iq4_xs the type.
    reused = run("--synthetic", spec.replace("experts=", "recipe=") + "q4_k_m", *args, "-v", cache=tmp_path)
    assert "reusing synthetic model" in reused.stderr
    for key in ("experts", "recipe"):
        run("--synthetic", spec.replace("experts=", key + "=") + "iq4_xs", *args, cache=tmp_path)
    iq4 = {("recipe-" in f.name): f for f in tmp_path.glob("*iq4_xs*.gguf")}
    assert len(iq4) == 2 and len(list(tmp_path.glob("*.gguf"))) == 5
    output_type = {k: {t.name: t.type for t in moeinfer.Model(str(f)).tensors}["output.weight"] for k, f in iq4.items()}
    assert output_type == {True: "q6_K", False: "f16"}, output_type


def test_gguf_path_positional_and_flag(cache_dir):
    run(*tiny(), "-p", "8", "-n", "0", "-r", "1", cache=cache_dir)
    path = next(cache_dir.glob("*qwen3moe_preset-tiny-*.gguf"))
    for argv in ([str(path)], ["-m", str(path)]):
        records = json.loads(run(*argv, "-p", "8", "-n", "0", "-r", "1", "-o", "json", "-t", "2").stdout)
        assert records[0]["model_path"] == str(path)


# ---------------------------------------------------------------------------------------------
# placement and scheduling (--device emulated: a host-memory backend plays the GPU)
# ---------------------------------------------------------------------------------------------

# The tiny qwen3moe: 2 layers, 8 experts, top-2; gate, up and down expert tensors of equal size, no biases.
TINY_LAYERS, TINY_EXPERTS, TINY_TOP_K = 2, 8, 2


def emulated(*extra: str) -> list[str]:
    return [*tiny(), "--device", "emulated", "-ot", "exps=CPU", *extra]


def test_emulated_text_prints_scheduler_summary(cache_dir):
    # The expert cache off: with it, the matrices pp16 leaves whole in it take tg2 to the device too.
    out = run(*emulated("--offload-policy", "all=4", "-ub", "8", "--expert-split", "off", "--expert-cache", "off"),
              "-p", "16", "-n", "2", "-r", "1", cache=cache_dir).stdout
    header, rows = markdown_table(out)
    assert [r[3] for r in rows] == ["EMULATED", "EMULATED"]
    summary = out[out.index("\nscheduler: "):]
    assert re.search(r"^scheduler: weights [\d.]+ \w+ in host RAM, [\d.]+ \w+ in device memory; offload "
                     r"mul_mat=4,mul_mat_id=4,moe_up_gate=4, expert copy auto, bias dup on, expert split off$",
                     summary, re.M)
    # One block per test: pp16 is 2 ubatches of 8 (offloaded), tg2 2 ubatches of 1 (kept on the host).
    assert re.search(r"^pp16: 2 ubatches in 1 runs; per ubatch: [\d.]+ \w+ uploaded", summary, re.M)
    assert re.search(r"^tg2: 2 ubatches in 1 runs; per ubatch: 0 B uploaded", summary, re.M)
    assert re.search(rf"offloaded/kept on host per ubatch: mul_mat 0/0, mul_mat_id {TINY_LAYERS}/0, "
                     rf"moe_up_gate {TINY_LAYERS}/0$", summary, re.M)
    assert re.search(rf"offloaded/kept on host per ubatch: mul_mat 0/0, mul_mat_id 0/{TINY_LAYERS}, "
                     rf"moe_up_gate 0/{TINY_LAYERS}$", summary, re.M)
    assert summary.count("time per ubatch: ") == 2 and "GB/s" in summary
    assert re.search(r"^build: moeinfer ", out, re.M)


def test_cpu_text_has_no_scheduler_summary(cache_dir):
    out = run(*tiny(), "--device", "cpu", "-p", "8", "-n", "0", "-r", "1", cache=cache_dir).stdout
    assert "scheduler:" not in out


@pytest.mark.parametrize("copy", ["full", "active"])
def test_emulated_json_stats_per_row(cache_dir, copy):
    reps = 2
    # The upload slots alone (--expert-cache off): a cache would keep the warm-up's experts for the timed runs.
    records = json.loads(run(*emulated("--offload-policy", "all=4", "--expert-copy", copy, "-ub", "8", "-o", "json",
                                       "--expert-split", "off", "--expert-cache", "off"),
                             "-p", "16", "-n", "3", "-r", str(reps), cache=cache_dir).stdout)
    assert [r["test"] for r in records] == ["pp16", "tg3"]
    pp, tg = records
    for r in records:
        assert list(r)[: len(BENCH_CSV_FIELDS)] == BENCH_CSV_FIELDS
        assert r["backend"] == "EMULATED" and r["tensor_overrides"] == "exps=CPU" and r["expert_copy"] == copy
        assert r["offload_policy"] == "mul_mat=4,mul_mat_id=4,moe_up_gate=4" and r["bias_dup"] == 1
        assert r["weights_host_bytes"] > 0 and r["weights_device_bytes"] > 0
        assert close(r["sched_upload_gbps"], r["sched_bytes_uploaded"] / r["sched_seconds_total"] / 1e9)
        assert r["sched_bytes_uploaded"] == r["sched_bytes_weights_full"] + r["sched_bytes_weights_experts"]
        assert close(r["sched_bytes_uploaded_per_ubatch"], r["sched_bytes_uploaded"] / r["sched_n_ubatches"])
        # Stats cover the timed runs only: not the warm-up, not the refills.
        assert r["sched_seconds_total"] <= sum(r["samples_s"]) * 1.05 + 1e-3
    # pp16 = 2 ubatches of 8 per run, each offloading both expert ops of every layer.
    assert pp["sched_n_ubatches"] == 2 * reps
    assert pp["sched_n_offloaded_mul_mat_id"] == pp["sched_n_offloaded_moe_up_gate"] == 2 * reps * TINY_LAYERS
    assert pp["sched_n_kept_host_mul_mat_id"] == 0
    # tg3 = 3 single-token ubatches per run, all on the host.
    assert tg["sched_n_ubatches"] == 3 * reps
    assert tg["sched_n_offloaded_mul_mat_id"] == 0 and tg["sched_n_kept_host_moe_up_gate"] == 3 * reps * TINY_LAYERS
    assert tg["sched_bytes_uploaded"] == 0
    # Expert bytes per tensor: the host holds the 3 * TINY_LAYERS expert tensors.
    tensor = pp["weights_host_bytes"] // (3 * TINY_LAYERS)
    uploads = pp["sched_n_offloaded_mul_mat_id"] + 2 * pp["sched_n_offloaded_moe_up_gate"]  # down; gate + up
    if copy == "full":
        assert pp["sched_bytes_weights_full"] == uploads * tensor and pp["sched_bytes_weights_experts"] == 0
        assert pp["sched_n_id_readbacks"] == 0
    else:
        assert pp["sched_bytes_weights_full"] == 0
        assert pp["sched_bytes_weights_experts"] + pp["sched_bytes_weights_skipped"] == uploads * tensor
        assert pp["sched_n_id_readbacks"] == 2 * reps * TINY_LAYERS


def test_emulated_sweep_json_has_pp_and_tg_stats(cache_dir):
    records = json.loads(run(*emulated("--offload-policy", "all=8", "--expert-cache", "off", "-o", "json"), "-c", "32",
                             "-ub", "16", "--sweep-tg", "3", cache=cache_dir).stdout)
    assert len(records) == 2
    for r in records:
        assert list(r) == SWEEP_CSV_FIELDS
        assert r["sched_tg_n_ubatches"] == 3 and r["sched_tg_n_offloaded_mul_mat_id"] == 0
        assert r["sched_pp_n_ubatches"] == 1 and r["sched_pp_n_offloaded_mul_mat_id"] == TINY_LAYERS


@pytest.mark.parametrize("argv, n_ubatch, ubatches", [
    (["-ub", "8"], 8, 3),                 # one call of 20 tokens: 8 + 8 + 4
    (["-ub", "8", "-b", "12"], 8, 3),     # calls of 12 + 8: 8 + 4 + 8
    (["-ub", "8", "-b", "5"], 5, 4),      # the ubatch is at most the batch: 5 + 5 + 5 + 5
    (["-ub", "16", "-b", "6"], 6, 4),     # 6 + 6 + 6 + 2
])
def test_batch_size_splits_prefill_calls(cache_dir, argv, n_ubatch, ubatches):
    r = json.loads(run(*emulated("-o", "json"), *argv, "-p", "20", "-n", "0", "-r", "1", cache=cache_dir).stdout)[0]
    assert r["n_ubatch"] == n_ubatch
    assert r["n_batch"] == (int(argv[argv.index("-b") + 1]) if "-b" in argv else 0)
    assert r["sched_n_ubatches"] == ubatches


@pytest.mark.parametrize("flag, value, expected", [
    ("--vram-budget", "1.5GiB", ("vram_budget", 1536 * 1024 * 1024)),
    ("--vram-budget", "2G", ("vram_budget", 2 * 10**9)),
    ("--vram-budget", "3000000000", ("vram_budget", 3 * 10**9)),
    ("--offload-budget", "64MiB", ("offload_vram_budget", 64 << 20)),
    ("--offload-budget", "1.25gb", ("offload_vram_budget", 1_250_000_000)),
])
def test_size_flags(cache_dir, flag, value, expected):
    r = json.loads(run(*emulated("-o", "json", flag, value), "-p", "4", "-n", "0", "-r", "1",
                       cache=cache_dir).stdout)[0]
    assert r[expected[0]] == expected[1]


def test_placement_flags_reach_the_context(cache_dir):
    base = [*tiny(), "--device", "emulated", "-o", "json", "-p", "4", "-n", "0", "-r", "1"]
    everything = json.loads(run(*base, cache=cache_dir).stdout)[0]
    assert everything["weights_host_bytes"] == 0 and everything["n_gpu_layers"] == -1
    one_layer = json.loads(run(*base, "--n-cpu-moe", "1", cache=cache_dir).stdout)[0]
    all_experts = json.loads(run(*base, "-ot", "exps=CPU", cache=cache_dir).stdout)[0]
    assert one_layer["n_cpu_moe"] == 1
    assert 2 * one_layer["weights_host_bytes"] == all_experts["weights_host_bytes"] > 0
    # -ot is repeatable: entries are joined with ',' (first match wins).
    split = json.loads(run(*base, "-ot", r"blk\.0\.ffn_up_exps=CPU", "-ot", "down_exps=CPU",
                           cache=cache_dir).stdout)[0]
    assert split["tensor_overrides"] == r"blk\.0\.ffn_up_exps=CPU,down_exps=CPU"
    assert split["weights_host_bytes"] == all_experts["weights_host_bytes"] // 2  # 3 of the 6 expert tensors
    no_bias_dup = json.loads(run(*base, "-ot", "exps=CPU", "--no-bias-dup", cache=cache_dir).stdout)[0]
    assert no_bias_dup["bias_dup"] == 0
    assert everything["expert_split"] == -1  # automatic by default
    for value, expected in (("off", 0), ("3", 3), ("auto", -1)):
        r = json.loads(run(*base, "-ot", "exps=CPU", "--expert-split", value, cache=cache_dir).stdout)[0]
        assert r["expert_split"] == expected


def test_ik_llama_spellings_reach_the_context(cache_dir):
    """-op is --offload-policy; -ooae / -no-ooae are --expert-copy active / full (ik_llama.cpp's flags)."""
    base = [*emulated("-o", "json"), "-p", "4", "-n", "0", "-r", "1"]
    spec = "mul_mat=off,mul_mat_id=7"
    short = json.loads(run(*base, "-op", spec, cache=cache_dir).stdout)[0]
    long = json.loads(run(*base, "--offload-policy", spec, cache=cache_dir).stdout)[0]
    assert short["offload_policy"] == long["offload_policy"]
    assert short["offload_policy"].startswith("mul_mat=off,mul_mat_id=7,")
    assert json.loads(run(*base, "-ooae", cache=cache_dir).stdout)[0]["expert_copy"] == "active"
    assert json.loads(run(*base, "-no-ooae", cache=cache_dir).stdout)[0]["expert_copy"] == "full"
    assert json.loads(run(*base, "--offload-only-active-experts", cache=cache_dir).stdout)[0]["expert_copy"] == "active"


def test_device_defaults_to_auto(cache_dir):
    """No --device: the GPU when there is one (backend CUDA), else the CPU. -ot then places the experts on a
    GPU machine, and on a CPU-only one is refused with exit 2 rather than measuring a CPU run."""
    base = [*tiny(), "-o", "json", "-p", "4", "-n", "0", "-r", "1"]
    plain = json.loads(run(*base, cache=cache_dir).stdout)[0]
    assert plain["backend"] in ("CPU", "CUDA")
    explicit_cpu = json.loads(run(*base, "--device", "cpu", cache=cache_dir).stdout)[0]
    assert explicit_cpu["backend"] == "CPU"
    proc = run(*base, "-ot", "exps=CPU", cache=cache_dir, check=False)
    if plain["backend"] == "CUDA":
        assert proc.returncode == 0, proc.stderr
        r = json.loads(proc.stdout)[0]
        assert r["backend"] == "CUDA" and r["tensor_overrides"] == "exps=CPU" and r["weights_host_bytes"] > 0
    else:
        assert proc.returncode == 2 and proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("moeinfer-bench: --override-tensor applies to a device context")
        assert "--device auto found no CUDA device" in lines[0]
    # --bandwidth resolves auto the same way: copies measured exactly when the context was a CUDA one.
    bw = json.loads(run("--bandwidth", "--bandwidth-mib", "16", "-t", "2", "-r", "1", "-o", "json").stdout)
    assert {r["device"] for r in bw} == {plain["backend"]}
    assert ("h2d_pinned" in {r["test"] for r in bw}) == (plain["backend"] == "CUDA")


def test_bad_override_regex_is_a_library_error(cache_dir):
    proc = run(*tiny(), "--device", "emulated", "-ot", "([=CPU", "-p", "4", "-n", "0", cache=cache_dir, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("moeinfer-bench: ") and "([" in proc.stderr


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_expert_counts(cache_dir, fmt):
    reps, n_prompt = 2, 16
    proc = run(*emulated("--expert-counts", "-o", fmt), "-p", str(n_prompt), "-n", "0", "-r", str(reps),
               cache=cache_dir)
    if fmt == "json":
        json.loads(proc.stdout)  # stdout stays JSON: the histogram goes to stderr
        text = proc.stderr
    else:
        text = proc.stdout
    assert f"{TINY_EXPERTS} experts, top-{TINY_TOP_K}" in text
    _, rows = markdown_table(text[text.index("expert activations"):])
    assert [int(r[0]) for r in rows] == list(range(TINY_LAYERS))
    # Every timed token picks TINY_TOP_K experts per layer: the mean over the experts follows.
    mean = reps * n_prompt * TINY_TOP_K / TINY_EXPERTS
    for layer, used, lo, hi, avg, ratio in rows:
        n_used, n_expert = map(int, used.split("/"))
        assert n_expert == TINY_EXPERTS and 1 <= n_used <= TINY_EXPERTS
        assert int(lo) <= float(avg) <= int(hi)
        assert close(float(avg), mean, rel=1e-3)
        assert close(float(ratio), int(hi) / mean, rel=1e-2)
        assert (int(lo) == 0) == (n_used < TINY_EXPERTS)


# ---------------------------------------------------------------------------------------------
# --plot (rendered by `python3 -m moeinfer.plot`, which needs matplotlib)
# ---------------------------------------------------------------------------------------------

def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_plot_writes_picture_and_data(cache_dir, tmp_path):
    pytest.importorskip("matplotlib")
    reps, n_prompt, ub = 2, 16, 8
    png = tmp_path / "run.png"
    # --n-cpu-moe 1: layer 0's experts in host RAM, layer 1's resident on the device.
    proc = run(*tiny(), "--device", "emulated", "--n-cpu-moe", "1", "-ub", str(ub), "-p", str(n_prompt), "-n", "0",
               "-r", str(reps), "-o", "json", "--plot", str(png), cache=cache_dir)
    assert len(json.loads(proc.stdout)) == 1  # stdout is the benchmark's, untouched
    assert png_size(png) == (1600, 1000)
    data = json.loads((tmp_path / "run.json").read_text())
    counts = data["expert_counts"]
    assert len(counts) == TINY_LAYERS and all(len(row) == TINY_EXPERTS for row in counts)
    # Counts over the timed runs: every token picks TINY_TOP_K experts per layer.
    assert all(sum(row) == reps * n_prompt * TINY_TOP_K for row in counts)
    assert data["resident_layers"] == [False, True]
    tl = data["timeline"]
    # The whole run: the warm-up(s) and the timed runs, all in ubatches of `ub`.
    assert set(tl["n_tokens"]) == {ub} and len(tl["n_tokens"]) >= (reps + 1) * n_prompt // ub
    assert len(tl["n_tokens"]) % (n_prompt // ub) == 0 and all(tl["ok"])
    assert all(b >= a for a, b in zip(tl["t_start"], tl["t_end"]))
    assert data["timeline_dropped"] == 0


def test_plot_without_matplotlib_keeps_the_benchmark_output(cache_dir, tmp_path):
    fake = tmp_path / "fake" / "matplotlib"  # shadows the real one: as if it were not installed
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\'")\n')
    png = tmp_path / "run.png"
    argv = [str(BIN), *tiny(), "-p", "8", "-n", "0", "-r", "1", "-o", "json", "--plot", str(png),
            "--synthetic-dir", str(cache_dir)]
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1
    assert len(json.loads(proc.stdout)) == 1
    assert "needs matplotlib" in proc.stderr and f"the data is in {tmp_path / 'run.json'}" in proc.stderr
    assert not png.exists() and (tmp_path / "run.json").is_file()
    # No interpreter at all: the same, naming it.
    env = {**os.environ, "MOEINFER_PYTHON": str(tmp_path / "no-python3")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1 and len(json.loads(proc.stdout)) == 1
    assert f"cannot run {tmp_path / 'no-python3'}" in proc.stderr


def test_plot_argument_errors(cache_dir):
    proc = run("--bandwidth", "--plot", "x.png", check=False)
    assert proc.returncode == 2 and "--plot does not apply to --bandwidth" in proc.stderr
    proc = run(*tiny(), "--plot", "", cache=cache_dir, check=False)
    assert proc.returncode == 2 and "--plot" in proc.stderr and "expected a file name" in proc.stderr


# ---------------------------------------------------------------------------------------------
# --bandwidth (CPU: host read only; small buffers so that it runs in a moment)
# ---------------------------------------------------------------------------------------------

BANDWIDTH_FIELDS = ["device", "test", "bytes", "n_threads", "repetitions", "gbps", "version"]
BW_SMALL = ["--bandwidth", "--device", "cpu", "--bandwidth-mib", "16", "-t", "2"]
BW_THREADS = min(2, len(os.sched_getaffinity(0)))  # -t is capped at the cores this process may use


def test_bandwidth_cpu_json():
    records = json.loads(run(*BW_SMALL, "-r", "2", "-o", "json").stdout)
    assert len(records) == 1
    r = records[0]
    assert list(r) == BANDWIDTH_FIELDS
    assert r["device"] == "CPU" and r["test"] == "host_read"
    assert r["bytes"] == 16 << 20 and r["n_threads"] == BW_THREADS and r["repetitions"] == 2
    assert math.isfinite(r["gbps"]) and r["gbps"] > 0


def test_bandwidth_cpu_text_and_csv():
    proc = run(*BW_SMALL)
    header, rows = markdown_table(proc.stdout)
    assert header == ["test", "size", "threads", "GB/s"]
    assert rows == [["host_read", "16.00 MiB", str(BW_THREADS), rows[0][3]]] and float(rows[0][3]) > 0
    assert "median of 5 runs" in proc.stdout  # -r defaults to 5 with --bandwidth
    rows = list(csv.DictReader(io.StringIO(run(*BW_SMALL, "-r", "1", "-o", "csv").stdout)))
    assert len(rows) == 1 and list(rows[0]) == BANDWIDTH_FIELDS
    assert rows[0]["test"] == "host_read" and int(rows[0]["repetitions"]) == 1 and float(rows[0]["gbps"]) > 0


# ---------------------------------------------------------------------------------------------
# help and errors
# ---------------------------------------------------------------------------------------------

def test_help_documents_every_flag():
    proc = run("--help")
    text = proc.stdout
    for flag in ["--model", "--synthetic", "--synthetic-dir", "--ctx-size", "--ubatch-size", "--threads", "--sweep",
                 "--sweep-pp", "--sweep-tg", "--n-prompt", "--n-gen", "--n-depth", "--repetitions", "--output",
                 "--verbose", "--progress", "--seed", "--no-warmup", "--help", "-ub", "-p", "-n", "-r", "-t", "-o",
                 "-b", "--batch-size", "--device", "-ngl", "--n-gpu-layers", "-ot", "--override-tensor",
                 "--n-cpu-moe", "--vram-budget", "--offload-policy", "--expert-copy", "--no-bias-dup",
                 "--offload-budget", "--expert-counts", "--bandwidth", "--bandwidth-mib", "-op", "-ooae",
                 "--offload-only-active-experts", "-no-ooae", "--no-offload-only-active-experts"]:
        assert re.search(rf"(^|[\s,]){re.escape(flag)}[\s,]", text, re.M), f"--help does not document {flag}"
    flat = " ".join(text.split())  # help lines are wrapped
    for default in ["(default: 512)", "(default: 32)", "(default: 3)", "(default: text)", "(default: all cores)"]:
        assert default in flat
    device_help = re.search(r"--device auto\|cpu\|cuda\|emulated(.*?)\n  -", text, re.S)
    assert device_help and "(default: auto)" in " ".join(device_help.group(1).split())
    assert proc.stderr == ""


@pytest.mark.parametrize("argv, needle", [
    ([], "no model"),
    (["--bogus"], "--bogus"),
    (["-t"], "-t"),
    (["-t", "zero", "x.gguf"], "-t"),
    (["-t", "0", "x.gguf"], "out of range"),
    (["-o", "xml", "x.gguf"], "xml"),
    (["-p", "16,abc", "x.gguf"], "abc"),
    (["--synthetic", "llama"], "llama"),
    (["--synthetic", "qwen3moe:layers=0"], "layers"),
    (["--synthetic", "qwen3moe:experts=q9_9"], "q9_9"),
    (["--synthetic", "qwen3moe:experts=q4_k_s"], "unknown type or recipe 'q4_k_s'"),
    (["--synthetic", "qwen3moe:recipe=q4_k"], "unknown recipe 'q4_k' for key 'recipe'"),
    (["--synthetic", "qwen3moe:skew=1.5"], "skew"),
    (["--synthetic", "qwen3moe:nonsense=1"], "nonsense"),
    (["--synthetic", "qwen3moe:layers"], "key=value"),
    (["--synthetic", "qwen3moe:layers=2:layers=3"], "twice"),
    (["x.gguf", "--synthetic", "qwen3moe"], "not both"),
    (["x.gguf", "y.gguf"], "y.gguf"),
    (["x.gguf", "--sweep", "-p", "512"], "--n-prompt"),
    (["x.gguf", "-n", "8", "--sweep-tg", "4"], "--sweep-tg"),
    (["x.gguf", "-c", "16", "--sweep-pp", "32"], "ctx-size"),
    (["x.gguf", "-c", "16", "-p", "32"], "ctx-size"),
    (["x.gguf", "-p", "0", "-n", "0"], "nothing to run"),
    (["x.gguf", "--verbose=1"], "takes no value"),
    (["x.gguf", "--device", "tpu"], "auto, cpu, cuda, emulated or emulated:N, got 'tpu'"),
    (["x.gguf", "--device", "cpu", "-ot", "exps=CPU"], "applies to --device cuda or emulated"),
    (["x.gguf", "--device", "cpu", "-ooae"], "--offload-only-active-experts applies to --device"),
    (["x.gguf", "-ooae", "--expert-copy", "full"], "give one of --expert-copy, -ooae and -no-ooae"),
    (["x.gguf", "-ooae", "-no-ooae"], "give one of --expert-copy, -ooae and -no-ooae"),
    (["x.gguf", "-op", "27,0,29,0"], "ik_llama.cpp's op-number pairs"),
    (["x.gguf", "-op", "-1,0"], "name the ops instead"),
    (["x.gguf", "-op", "bogus=3"], "bogus"),
    (["x.gguf", "--device", "cpu", "--n-cpu-moe", "2"], "--n-cpu-moe applies to --device"),
    (["x.gguf", "--device", "emulated", "-ot", "exps"], "REGEX=BACKEND"),
    (["x.gguf", "--device", "emulated", "-ngl", "-2"], "out of range"),
    (["x.gguf", "--device", "emulated", "--n-cpu-moe", "-1"], "out of range"),
    (["x.gguf", "--device", "emulated", "--offload-policy", "bogus=3"], "bogus"),
    (["x.gguf", "--device", "emulated", "--offload-policy", "mul_mat_id=-4"], "-4"),
    (["x.gguf", "--device", "emulated", "--offload-policy", "mul_mat=many"], "many"),
    (["x.gguf", "--device", "emulated", "--expert-copy", "some"], "expected auto, full, active or prefetch"),
    (["x.gguf", "--device", "emulated", "--expert-split", "-3"], "expected auto, off or a number of experts"),
    (["x.gguf", "--device", "emulated", "--expert-split", "half"], "expected auto, off or a number of experts"),
    (["x.gguf", "--device", "emulated", "--vram-budget", "12XB"], "unknown unit"),
    (["x.gguf", "--device", "emulated", "--vram-budget", "-5G"], "byte count"),
    (["x.gguf", "--device", "emulated", "--vram-budget", "1.5.3G"], "byte count"),
    (["x.gguf", "--device", "emulated", "--offload-budget", "99999999999TiB"], "exceeds"),
    (["x.gguf", "-b", "0"], "out of range"),
    (["--bandwidth", "x.gguf"], "takes no model"),
    (["--bandwidth", "-p", "512"], "--n-prompt"),
    (["--bandwidth", "--synthetic", "qwen3moe"], "--synthetic"),
    (["--bandwidth", "-r", "1001"], "at most 1000"),
    (["--bandwidth", "--bandwidth-mib", "0"], "out of range"),
    (["x.gguf", "--bandwidth-mib", "16"], "--bandwidth only"),
    # llama.cpp / ik_llama.cpp flags with no counterpart here: refused with the reason.
    (["x.gguf", "-fa", "1"], "flash-style"),
    (["x.gguf", "-fmoe", "1"], "MOE_UP_GATE"),
    (["x.gguf", "-mla", "3"], "absorbed form"),
    (["x.gguf", "--mla-use", "3"], "deepseek2"),
    (["x.gguf", "-rtr", "1"], "nothing to repack"),
    (["x.gguf", "-ctk", "q8_0"], "KV cache is F16"),
])
def test_bad_arguments_exit_2_with_one_line(argv, needle):
    proc = run(*argv, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moeinfer-bench: "), proc.stderr
    assert needle in lines[0]
    assert lines[0].count("(see --help)") == 1, lines[0]


def test_library_error_exit_1(tmp_path):
    missing = tmp_path / "missing.gguf"
    proc = run(str(missing), "-p", "8", "-n", "0", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count(str(missing)) == 1 and proc.stderr.startswith("moeinfer-bench: "), proc.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 4)
    proc = run(str(bad), "-p", "8", "-n", "0", check=False)
    assert proc.returncode == 1 and proc.stderr.count(str(bad)) == 1, proc.stderr


def test_backend_options_flag(cache_dir):
    """--backend-options reaches the context: listed in --help, refused naming a bad entry (exit 1, the
    library's message), recorded in the rows; the thresholds' sources are reported."""
    help_text = run("--help").stdout
    assert "--backend-options STR" in help_text
    for key in ("cuda_graphs=on|off", "offload_calibration=auto|on|off", "env MOEINFER_EMULATED_VRAM"):
        assert key in help_text
    bad = run(*emulated("--backend-options", "cuda_graphs=off,warp_speed=9"), "-p", "8", "-n", "0", "-r", "1",
              cache=cache_dir, check=False)
    assert bad.returncode == 1
    assert "unknown key 'warp_speed'" in bad.stderr
    records = json.loads(run(*emulated("--backend-options", "offload_calibration=off", "-o", "json",
                                       "--offload-policy", "mul_mat_id=5"),
                             "-p", "8", "-n", "0", "-r", "1", cache=cache_dir).stdout)
    (r,) = records
    assert r["backend_options"] == "offload_calibration=off"
    fixed = 32 * TINY_EXPERTS // TINY_TOP_K
    assert r["offload_thresholds"] == f"mul_mat=32 default, mul_mat_id=5 override, moe_up_gate={fixed} default"
    out = run(*emulated("-p", "8", "-n", "0", "-r", "1"), cache=cache_dir).stdout
    assert f"\noffload thresholds: mul_mat=32 default, mul_mat_id={fixed} default, moe_up_gate={fixed} default\n" in out
