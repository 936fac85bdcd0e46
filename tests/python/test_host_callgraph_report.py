"""scripts/host_callgraph_report.py on a made-up `perf script` text: random call chains of known shape, the
report's inclusive times and its attribution of foreign leaves against counts made here."""
import collections
import lzma
import random
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "host_callgraph_report.py"
RATE_HZ = 1999
LIB = "/x/build/lib/libmoeinfer.so.0"

# Chains below the root, root-side first: (frames, leaf shared object or None for ours).
SHAPES = [
    (["moe::sched::Scheduler::flush(moe::sched::RunState&)", "moe::cpu::CpuBackend::compute(std::span<moe::Tensor* const>)"], None),
    (["moe::sched::Scheduler::flush(moe::sched::RunState&)", "moe::cuda::CudaBackend::wait_fence(unsigned long)"],
     "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    (["moe::sched::Scheduler::prepare_operands(moe::Tensor&)"], "/usr/lib/x86_64-linux-gnu/libc.so.6"),
]


def sample(frames_root_first, leaf_dso, decode):
    lines = ["12345  100.000000: "]
    chain = []
    if leaf_dso is not None:
        chain.append(("[unknown]", leaf_dso))
    for f in reversed(frames_root_first):
        chain.append((f, LIB))
    chain.append(("moe::sched::Scheduler::run(moe::Graph&)", LIB))
    if decode:
        chain.append(("moe::(anonymous namespace)::decode_ubatch(moe_context&)", LIB))
        chain.append(("moe::decode(moe_context&)", LIB))
    chain.append(("main", "/x/moeinfer-bench"))
    for i, (sym, dso) in enumerate(chain):
        lines.append(f"\t    {0x1000 + i:x} {sym} ({dso})")
    return "\n".join(lines) + "\n\n"


def test_report_counts_the_chains_it_was_given(tmp_path):
    rng = random.Random()
    counts = collections.Counter()
    text = []
    for _ in range(rng.randint(200, 400)):
        k = rng.randrange(len(SHAPES))
        decode = rng.random() < 0.8  # the rest (loading, say) must be left out
        counts[(k, decode)] += 1
        text.append(sample(SHAPES[k][0], SHAPES[k][1], decode))
    path = tmp_path / "callchains.txt.xz"
    with lzma.open(path, "wt") as f:
        f.write("".join(text))
    tokens = 10.0
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--tokens", str(tokens), "--min-ms", "0"],
                         check=True, capture_output=True, text=True).stdout
    ms = lambda n: 1e3 * n / RATE_HZ / tokens  # noqa: E731
    n_decode = sum(v for (k, d), v in counts.items() if d)
    assert f"{n_decode} of {sum(counts.values())} samples" in out

    def value(name, indent):
        m = re.search(rf"^\s*([\d.]+)  {' ' * indent}{re.escape(name)}$", out, re.M)
        assert m, f"{name} not in the report:\n{out}"
        return float(m.group(1))

    flush = counts[(0, True)] + counts[(1, True)]
    assert abs(value("moe::sched::Scheduler::flush", 0) - ms(flush)) < 1e-3
    assert abs(value("moe::cpu::CpuBackend::compute", 2) - ms(counts[(0, True)])) < 1e-3
    assert abs(value("moe::cuda::CudaBackend::wait_fence", 2) - ms(counts[(1, True)])) < 1e-3
    assert abs(value("moe::sched::Scheduler::prepare_operands", 0) - ms(counts[(2, True)])) < 1e-3
    m = re.search(r"^\s*([\d.]+)  libcuda\.so\.1\s+moe::cuda::CudaBackend::wait_fence$", out, re.M)
    assert m and abs(float(m.group(1)) - ms(counts[(1, True)])) < 1e-3
    m = re.search(r"^\s*([\d.]+)  libc\.so\.6\s+moe::sched::Scheduler::prepare_operands$", out, re.M)
    assert m and abs(float(m.group(1)) - ms(counts[(2, True)])) < 1e-3
