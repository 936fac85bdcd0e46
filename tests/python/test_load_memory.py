"""Peak memory of loading a model and creating a hybrid context: host-resident weights are used in place
from the mapped file, so the process's peak resident set (VmHWM) grows by at most the file's size + 5%.

Measured in a fresh child process (the peak is per process and never goes down), against its own resident
set just before the load, on a ~250 MB synthetic model whose expert tensors (kept in host RAM with
tensor_overrides="exps=CPU") are ~97% of the file, so a copy of them (what context creation did before:
~1.9x the file) cannot hide in the margin. Allowance besides the 5%: the emulated device's memory
(weights_device_bytes: host RAM here, device memory on a GPU) and 24 MiB for the KV cache, the
activations and allocator slack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import moeinfer

ALLOWANCE = 24 << 20

CHILD = r"""
import json, sys
import moeinfer

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)

path, use_mmap = sys.argv[1], sys.argv[2] == "1"
before = status("VmRSS")
model = moeinfer.Model(path, use_mmap=use_mmap)
fractions = []
ctx = moeinfer.Context(model, n_ctx=64, n_ubatch=32, n_threads=2, device="emulated",
                       tensor_overrides="exps=CPU", progress=fractions.append)
ctx.decode([1, 2, 3])
s = ctx.stats()
print(json.dumps({"before": before, "peak": status("VmHWM"), "device": s["weights_device_bytes"],
                  "host": s["weights_host_bytes"], "pinned": s["weights_host_pinned_bytes"],
                  "fractions": fractions}))
"""


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """qwen3moe, 6 layers of 64 F16 experts of 256 x 512: ~250 MB, ~97% of it expert tensors."""
    path = tmp_path_factory.mktemp("load") / "q-250mb.gguf"
    moeinfer.synth_write(str(path), "qwen3moe", preset="tiny", n_layer=6, n_embd=256, n_expert=64,
                         n_expert_used=4, n_ff_expert=512, expert_type="f16", seed=3)
    return path


def measure(path, use_mmap: bool) -> dict:
    env = dict(os.environ)
    env.pop("MOEINFER_EMULATED_ASYNC", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), "1" if use_mmap else "0"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc/self/status (Linux)")
@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "read"])
def test_peak_rss_of_a_hybrid_context_stays_within_the_file_size(big_model, use_mmap):
    size = big_model.stat().st_size
    r = measure(big_model, use_mmap)
    experts = sum(t.n_bytes for t in moeinfer.Model(str(big_model)).tensors if "_exps." in t.name)
    assert experts > 0.95 * size  # the margin below could not hide a copy of them
    assert r["pinned"] == experts  # used in place and page-locked, on both paths
    growth = r["peak"] - r["before"]
    limit = 1.05 * size + r["device"] + ALLOWANCE
    print(f"file {size / 1e6:.1f} MB, peak growth {growth / 1e6:.1f} MB, limit {limit / 1e6:.1f} MB")
    assert growth <= limit
    # Progress: locking the expert pages, then the device uploads, ending at 1.
    f = r["fractions"]
    assert f and f == sorted(f) and abs(f[-1] - 1.0) < 1e-6
