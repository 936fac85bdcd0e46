"""Why deepseek2 "tiny" (V3-like) q8_0 rows of the hybrid GPU test miss the bound: router near-ties or a bug.

Run by scripts/device_deepseek2_check.sh (paths of the carried build); DEVICE=emulated runs it without a GPU.
For each model seed: the hybrid test's sequence (20, 6, 1 and 1 tokens, all logits) on the CPU and on the device
under each configuration (expert copies full / active, expert split 0 / 2, expert cache automatic / off,
explicit thresholds all=3 as the test; "defaults": auto copies, the cache and calibrated thresholds; cuda_fusion
off; every weight on the device), and the
float64 reference's router margins and flip-sensitive rows (tests/python/router_flips.py). Printed:
* per configuration and seed, the rows outside test_forward_cuda._compare's bound (cosine 0.999, 3e-2 of max
  |logit|) per batch, and whether each batch's expert counts equal the CPU's (a flip changes them);
* per row outside the bound: relative error and cosine against the CPU, the device's and the CPU's relative
  error against the float64 reference, the token's router margin, and whether router_flips excuses it;
* whether the expert cache changes any logit (it must not: bit for bit), and the hybrid rows against the
  all-device context where both route alike;
* a verdict: "near-tie" when every row outside the bound is excused, "NOT a near-tie" with the rows otherwise.
The full per-configuration lines go to LOG (default $OUT/deepseek2_check.log, else /tmp); stdout gets a line
per seed, the rows outside the bound and the verdict (the device tool returns only the tail of stdout).
Environment: MODEL_SEEDS (space-separated; default 8 fixed seeds), TIME_S (stop starting seeds after it,
default 90), DEVICE (cuda), LOG.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import moeinfer  # noqa: E402
import router_flips  # noqa: E402

SIZES = (20, 6, 1, 1)
DEVICE = os.environ.get("DEVICE", "cuda")
LOG = open(os.environ.get("LOG", os.path.join(os.environ.get("OUT", "/tmp"), "deepseek2_check.log")), "w")


def say(line: str) -> None:
    print(line, flush=True)
    print(line, file=LOG, flush=True)


def detail(line: str) -> None:
    print(line, file=LOG, flush=True)


def configs():
    """(name, context keyword arguments) of the device contexts."""
    out = []
    for copy in ("full", "active"):
        for split in (0, 2):
            for cache in (-1, 0):
                policy = moeinfer.Policy(expert_copy=copy, expert_split=split, expert_cache=cache)
                policy = policy.parse_offload("all=3")
                out.append((f"{copy}/split{split}/cache{'auto' if cache else 'off'}",
                            dict(tensor_overrides="exps=CPU", policy=policy)))
    out.append(("defaults", dict(tensor_overrides="exps=CPU")))  # auto copies, the cache, calibrated thresholds
    if DEVICE == "cuda":
        for copy in ("full", "active"):
            policy = moeinfer.Policy(expert_copy=copy, expert_split=0).parse_offload("all=3")
            out.append((f"{copy}/split0/cacheauto/fusion-off", dict(tensor_overrides="exps=CPU", policy=policy,
                                                                     backend_options="cuda_fusion=off")))
    out.append(("all-device", {}))
    return out


def run(model, kw, batches):
    """(logits per batch, expert-count deltas per batch, stats) of a context on the device."""
    ctx = moeinfer.Context(model, device=DEVICE, n_ctx=128, n_ubatch=32, **kw)
    logits, counts = [], []
    for b in batches:
        before = ctx.expert_counts()
        logits.append(ctx.decode(b, logits_all=True))
        counts.append(ctx.expert_counts() - before)
    return logits, counts, ctx.stats()


def check_seed(seed, tmp, totals):
    path = os.path.join(tmp, f"ds-{seed}.gguf")
    moeinfer.synth_write(path, "deepseek2", preset="tiny", expert_type="q8_0", dense_type="q8_0", seed=seed)
    model = moeinfer.Model(path)
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32) for n in SIZES]
    flips = router_flips.reference_forward(path)
    tokens = np.concatenate(batches)
    excused, margins = router_flips.excused_rows(flips, tokens)
    ref, _ = flips(tokens, None)
    starts = np.cumsum((0,) + SIZES)
    cpu_ctx = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=32)
    cpu, cpu_counts = [], []
    for b in batches:
        before = cpu_ctx.expert_counts()
        cpu.append(cpu_ctx.decode(b, logits_all=True))
        cpu_counts.append(cpu_ctx.expert_counts() - before)
    cpu_ref_rel, _ = router_flips.row_shift(np.concatenate(cpu), ref)
    say(f"== MOEINFER_MODEL_SEED={seed}: router margins < {router_flips.NEAR_TIE:g} at rows "
        f"{np.nonzero(margins < router_flips.NEAR_TIE)[0]}; excused rows {np.nonzero(excused)[0]}; "
        f"CPU vs float64 worst row {cpu_ref_rel.max():.2e}")
    results = {}
    worst_stable = 0.0
    off_rows: dict = {}  # (batch, row) -> [(configuration, rel, cos, device vs float64, routing as the CPU's)]
    for name, kw in configs():
        try:
            results[name] = run(model, kw, batches)
        except Exception as e:  # a context the device refuses: say so, go on
            say(f"  {name}: FAILED {type(e).__name__}: {e}")
            continue
        logits, counts, stats = results[name]
        summary = []
        for bi, (g, c) in enumerate(zip(logits, cpu)):
            rel, cos = router_flips.row_shift(g, c)
            worst_stable = max(worst_stable, float(rel[~excused[starts[bi]:starts[bi + 1]]].max(initial=0.0)))
            off = np.nonzero(~((rel <= router_flips.ROW_REL) & (cos > router_flips.ROW_COS)))[0]
            same = np.array_equal(counts[bi], cpu_counts[bi])
            summary.append(f"b{SIZES[bi]}: {len(off)} off, max rel {rel.max():.1e}, "
                           f"routing {'=' if same else 'DIFFERS'}")
            for r in off:
                row = starts[bi] + r
                dev_ref = router_flips.row_shift(g[r:r + 1], ref[row:row + 1])[0][0]
                off_rows.setdefault((bi, int(r)), []).append((name, rel[r], cos[r], dev_ref, same))
                detail(f"    {name} batch {SIZES[bi]} row {r}: rel {rel[r]:.3e} cos {cos[r]:.6f}; vs float64: device "
                       f"{dev_ref:.2e} cpu {cpu_ref_rel[row]:.2e}; batch routing {'same' if same else 'differs'}")
        offl = stats.get("n_offloaded", {})
        detail(f"  {name}: " + "; ".join(summary) + f"; offloaded {offl}; cache hits {stats.get('n_cache_hits')}")
    n_configs = len(results)
    for (bi, r), hits in sorted(off_rows.items()):
        row = starts[bi] + r
        ok = bool(excused[row])
        n_differs = sum(not h[4] for h in hits)
        totals["off"] += len(hits)
        totals["excused"] += len(hits) if ok else 0
        totals["off_routing_differs"] += n_differs
        if not ok:
            totals["unexplained"].append((seed, SIZES[bi], r, [h[0] for h in hits]))
        say(f"    batch {SIZES[bi]} row {r} outside the bound in {len(hits)}/{n_configs} configurations "
            f"(rel up to {max(h[1] for h in hits):.2e}, cos down to {min(h[2] for h in hits):.6f}; device vs float64 "
            f"{min(h[3] for h in hits):.2e}..{max(h[3] for h in hits):.2e}, cpu vs float64 {cpu_ref_rel[row]:.2e}); "
            f"margin {margins[row]:.2e}; {'excused (near-tie)' if ok else 'NOT EXCUSED'}; batch routing differs "
            f"from the CPU's in {n_differs}/{len(hits)}; in: "
            f"{'all' if len(hits) == n_configs else ', '.join(h[0] for h in hits)}")
    # The expert cache must change nothing, bit for bit.
    for copy in ("full", "active"):
        for split in (0, 2):
            a, b = (results.get(f"{copy}/split{split}/cache{c}") for c in ("auto", "off"))
            if a and b:
                same = all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
                totals["cache_mismatch"] += not same
                if not same:
                    say(f"  CACHE CHANGES LOGITS: {copy}/split{split}")
    # Hybrid against all-device, on the batches both route alike (the same dense kernels either way).
    full = results.get("all-device")
    if full:
        worst = 0.0
        for name, (logits, counts, _) in results.items():
            for bi in range(len(SIZES)):
                if np.array_equal(counts[bi], full[1][bi]):
                    worst = max(worst, float(router_flips.row_shift(logits[bi], full[0][bi])[0].max()))
        say(f"  worst row with stable routing against the CPU {worst_stable:.2e}; hybrid against all-device where "
            f"routed alike {worst:.2e}")


def main():
    seeds = [int(s) for s in os.environ.get("MODEL_SEEDS", "11 22 33 44 55 66 77 88").split()]
    budget = float(os.environ.get("TIME_S", "90"))
    totals = {"off": 0, "excused": 0, "off_routing_differs": 0, "unexplained": [], "cache_mismatch": 0}
    t0 = time.monotonic()
    done = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            if time.monotonic() - t0 > budget:
                say(f"time budget {budget:g} s spent: {len(seeds) - done} seeds left out")
                break
            check_seed(seed, tmp, totals)
            done += 1
    say(f"VERDICT over {done} models: {totals['off']} (row, configuration) pairs outside the bound, "
        f"{totals['excused']} excused by a router near-tie, {totals['off_routing_differs']} in batches whose expert "
        f"counts differ from the CPU's; expert cache changed logits in {totals['cache_mismatch']} comparisons")
    if totals["unexplained"]:
        say(f"NOT a near-tie: rows outside the bound with stable routing: {totals['unexplained']}")
    if totals["cache_mismatch"]:
        say("expert cache bug: the cache changes logits")
    if not totals["unexplained"] and not totals["cache_mismatch"]:
        say("near-tie: every row outside the bound is one a router flip moves (router_flips.py)" if totals["off"]
            else "no row outside the bound")
    say(f"elapsed {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
