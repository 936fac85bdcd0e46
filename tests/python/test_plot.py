"""Pictures of a run (moeinfer.plot) and the data behind them: Context.expert_counts() against the router's
choice computed by the float64 numpy reference, Context.timeline() against the statistics, and the
rendered PNG (its size, and its pixels where they carry the data).

Expert counts vs the reference: the library and the reference run the same tiny F32 model on the same random
prompt; the reference's top-k ids per layer (its trace) are counted with numpy. Top-k routing is
discontinuous: a token whose k-th and (k+1)-th router logits nearly tie (relative margin < MARGIN, the bound
test_forward_reference.py uses for unquantised weights, times 10; 1e-2 on CUDA) may pick another expert under float32 vs
float64 rounding, and then differ in every later layer. Each such token can move at most 2 * top_k counts of
a layer (k ids out, k in), so per layer |counts - reference|_1 <= 2 * top_k * (tokens with a near-tie in that
layer or before); on most random models that is 0 and the counts are equal.

Random data is fresh on every run; MOEINFER_TEST_SEED=<seed> replays it (conftest.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import moeinfer
from reference import forward_for
from reference import load as load_reference
from test_forward_cuda import _cuda_context
from test_forward_reference import F16KVCache

import moeinfer.plot as mplot

pytestmark = pytest.mark.fast

MARGIN = 1e-3  # relative top-k router margin under which float32 and float64 may route differently
MARGIN_CUDA = 1e-2  # the same on the GPU (~2% of the tokens of these models, at most ~7%, fall under it)


# --- expert counts against the reference ------------------------------------------------------------------------

def reference_routing(ref, tokens):
    """(expert ids per layer [n_layer][n, k], relative top-k router margins per layer [n_layer][n])."""
    trace: dict = {}
    forward_for(ref)(ref, tokens, cache=F16KVCache(ref.hparams.n_layer), trace=trace)
    return trace["expert_ids"], trace["router_margin"]


# Where the ids come from: the host (cpu), host shadows and device copies of a hybrid context (emulated,
# cuda-hybrid: experts in RAM, offloaded), the device only (cuda: all on the GPU, gathered at the ubatch's end).
CONTEXTS = {
    "cpu": ("cpu", {}),
    # Hybrid contexts with FULL copies and without the expert cache, so that every offloaded ubatch uploads its
    # experts: AUTO, the default, copies only the selected experts of small ubatches, and those may all be in an
    # upload slot already from an earlier ubatch (counted in bytes_weights_skipped), so a ubatch can upload none.
    "emulated": ("emulated", {"tensor_overrides": "exps=CPU",
                              "policy": moeinfer.Policy(offload="all=1", expert_cache=0, expert_copy="full")}),
    "cuda": ("cuda", {}),
    "cuda-hybrid": ("cuda", {"tensor_overrides": "exps=CPU", "policy": moeinfer.Policy(offload="all=1", expert_cache=0, expert_copy="full")}),
}


def make_context(model, where: str, **kw):
    device, extra = CONTEXTS[where]
    if device == "cuda":
        return _cuda_context(model, **extra, **kw)
    return moeinfer.Context(model, device=device, **extra, **kw)


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
@pytest.mark.parametrize("where", list(CONTEXTS))
def test_expert_counts_match_reference_routing(arch, where, tmp_path, rng):
    path = tmp_path / "m.gguf"
    device = CONTEXTS[where][0]
    # head_dim 64 on the GPU: the tiny preset's 16 is below what the CUDA attention kernels cover.
    shape = {"head_dim": 64} if device == "cuda" else {}
    moeinfer.synth_write(path, arch, preset="tiny", expert_type="f32", dense_type="f32",
                         seed=int(rng.integers(1 << 62)), **shape)
    model, ref = moeinfer.Model(path), load_reference(path)
    hp = ref.hparams
    ctx = make_context(model, where, n_ctx=64, n_ubatch=8)
    # GPU kernels sum in other orders (and may round products to TF32): a wider band of near-ties.
    margin = MARGIN_CUDA if device == "cuda" else MARGIN
    tokens = rng.integers(0, hp.n_vocab, size=29).astype(np.int32)
    ctx.decode(tokens[:5])  # two calls, ubatches of 8 and a partial one: counts accumulate over all
    ctx.decode(tokens[5:])
    got = ctx.expert_counts()
    assert got.shape == (hp.n_layer, hp.n_expert) and got.dtype == np.uint64

    ids, margins = reference_routing(ref, tokens)
    want = np.stack([np.bincount(i.ravel(), minlength=hp.n_expert) for i in ids])
    unstable = np.zeros(len(tokens), dtype=bool)
    for il in range(hp.n_layer):
        unstable |= margins[il] < margin
        assert unstable.mean() <= 0.25, f"too many near-ties to check layer {il}: {unstable.sum()} tokens"
        diff = int(np.abs(got[il].astype(np.int64) - want[il]).sum())
        assert diff <= 2 * hp.n_expert_used * int(unstable.sum()), (
            f"layer {il}: counts {got[il].tolist()} vs reference {want[il].tolist()} "
            f"({int(unstable.sum())} tokens with a near-tie)")
    assert np.all(got.sum(axis=1) == len(tokens) * hp.n_expert_used)


# --- timeline ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "tiny.gguf"
    moeinfer.synth_write(path, "qwen3moe", preset="tiny", head_dim=64, seed=11)  # 64: the CUDA attention's sizes
    return moeinfer.Model(path)


@pytest.mark.parametrize("where", ["cpu", "emulated", "cuda-hybrid"])
def test_timeline_records_each_ubatch(tiny_model, where, rng):
    ctx = make_context(tiny_model, where, n_ctx=64, n_ubatch=8)
    ctx.decode(rng.integers(0, 100, size=3).astype(np.int32))
    assert ctx.timeline()["t_start"].size == 0  # off by default
    ctx.set_timeline(4)
    ctx.reset_stats()
    sizes = [8, 8, 4, 1, 1, 1]  # a 20-token call, then three decode steps
    ctx.decode(rng.integers(0, 100, size=20).astype(np.int32))
    for _ in range(3):
        ctx.decode(rng.integers(0, 100, size=1).astype(np.int32))
    tl = ctx.timeline()
    s = ctx.stats()
    assert s["n_ubatches"] == len(sizes)
    # The ring keeps the last 4, oldest first.
    assert tl["n_tokens"].tolist() == sizes[-4:] and tl["dropped"] == 2 and tl["ok"].all()
    assert np.all(tl["t_end"] >= tl["t_start"]) and np.all(tl["t_start"][1:] >= tl["t_end"][:-1])
    parts = tl["seconds_host_compute"] + tl["seconds_device_submit"] + tl["seconds_wait"]
    assert np.all(parts <= (tl["t_end"] - tl["t_start"]) * (1 + 1e-9) + 1e-9)
    if where != "cpu":
        # Every ubatch uploads the experts it routes to (FULL copies: the whole block of each layer).
        assert np.all(tl["bytes_weights"] > 0) and np.all(tl["bytes_activations"] > 0)
    else:
        assert not tl["bytes_weights"].any() and not tl["bytes_activations"].any()
    ctx.set_timeline(0)
    ctx.decode(rng.integers(0, 100, size=1).astype(np.int32))
    assert ctx.timeline()["t_start"].size == 0 and ctx.timeline()["dropped"] == 0


def test_timeline_bytes_sum_to_the_stats(tiny_model, rng):
    ctx = moeinfer.Context(tiny_model, device="emulated", n_ctx=64, n_ubatch=8, tensor_overrides="exps=CPU",
                           policy=moeinfer.Policy(offload="all=1", expert_copy="active"))
    ctx.set_timeline(64)
    ctx.decode(rng.integers(0, 100, size=19).astype(np.int32))
    tl, s = ctx.timeline(), ctx.stats()
    assert tl["bytes_weights"].sum() == s["bytes_weights_full"] + s["bytes_weights_experts"]
    assert tl["bytes_activations"].sum() == s["bytes_activations"]
    assert np.isclose(tl["seconds_wait"].sum(), s["seconds_wait"], rtol=1e-9, atol=1e-12)
    assert np.isclose(tl["seconds_host_compute"].sum(), s["seconds_host_compute"], rtol=1e-9, atol=1e-12)


def test_timeline_capacity_errors(tiny_model):
    ctx = moeinfer.Context(tiny_model, device="cpu", n_ctx=16)
    for bad in (-1, (1 << 20) + 1):
        with pytest.raises(ValueError, match="timeline capacity"):
            ctx.set_timeline(bad)
    ctx.set_timeline(1 << 20)


# --- rendering ---------------------------------------------------------------------------------------------------

@pytest.fixture
def matplotlib():
    """matplotlib, or the rendering tests skip (everything else here runs without it)."""
    return pytest.importorskip("matplotlib")


def read_png(path) -> np.ndarray:
    from matplotlib import image
    return image.imread(path)


def cell_pixel(fig, ax, x: float, y: float, height: int) -> tuple[int, int]:
    """(row, column) of the PNG pixel at data coordinates (x, y) of `ax`."""
    px, py = ax.transData.transform((x, y))
    return int(round(height - py)), int(round(px))


def test_render_heatmap_pixels(matplotlib, tmp_path, rng):
    n_layer, n_expert = 5, 12
    counts = rng.integers(0, 4, size=(n_layer, n_expert))
    hot, cold = (1, 7), (3, 2)
    counts[hot] = 5000
    counts[cold] = 0
    data = {"expert_counts": counts.tolist(), "resident_layers": [False, False, True, False, False]}
    png = tmp_path / "heat.png"
    fig = mplot.render(data, png, width=900, height=600)
    img = read_png(png)
    assert img.shape[:2] == (600, 900)
    ax = fig.axes[0]
    lum = lambda rc: float(np.dot(img[rc][:3], [0.2126, 0.7152, 0.0722]))  # noqa: E731
    hot_px = cell_pixel(fig, ax, hot[1], hot[0], 600)
    cold_px = cell_pixel(fig, ax, cold[1], cold[0], 600)
    # viridis runs from dark purple (log 1 = 0) to bright yellow (the largest count).
    assert lum(hot_px) > 0.8 and lum(cold_px) < 0.2, (lum(hot_px), lum(cold_px))
    # The resident layer's frame: its top edge is drawn in the mark's colour, a non-resident row's edge is not.
    red = np.array(matplotlib.colors.to_rgb(mplot.RESIDENT_COLOR))
    edge = cell_pixel(fig, ax, n_expert / 2 - 0.25, 1.5, 600)
    plain = cell_pixel(fig, ax, n_expert / 2 - 0.25, 0.5, 600)
    near = lambda rc: min(np.abs(img[r, rc[1]][:3] - red).max() for r in range(rc[0] - 2, rc[0] + 3))  # noqa: E731
    assert near(edge) < 0.1 and near(plain) > 0.2


def test_render_with_timeline_and_cli(matplotlib, tmp_path, rng):
    n = 6  # few, long ubatches: each part is tens of pixels wide
    t0 = 5e-3 + 1e-2 * np.arange(n)
    dur = rng.uniform(6e-3, 9e-3, size=n)
    tl = {"t_start": t0.tolist(), "t_end": (t0 + dur).tolist(), "n_tokens": [8] * n,
          "seconds_host_compute": (dur * 0.3).tolist(), "seconds_device_submit": (dur * 0.1).tolist(),
          "seconds_wait": (dur * 0.5).tolist(), "bytes_weights": rng.integers(0, 1 << 24, size=n).tolist()}
    data = {"expert_counts": rng.integers(0, 50, size=(3, 8)).tolist(), "timeline": tl, "title": "synthetic"}
    (tmp_path / "d.json").write_text(json.dumps(data))
    assert mplot.main([str(tmp_path / "d.json"), str(tmp_path / "d.png"), "--width", "640", "--height", "480"]) == 0
    img = read_png(tmp_path / "d.png")
    assert img.shape[:2] == (480, 640)
    fig = mplot.render(data, tmp_path / "again.png", width=640, height=480)
    ax_time = fig.axes[1]
    # Each ubatch's bar: host compute, device submit, wait, then the rest, each in its colour; the gaps
    # between ubatches are empty. (x in ms from the first ubatch's start.)
    colour = lambda name: np.array(matplotlib.colors.to_rgb(name))  # noqa: E731
    at = lambda x: img[cell_pixel(fig, ax_time, x, mplot.BAR_Y + 0.4, 480)][:3]  # noqa: E731
    for i in (0, n - 1):
        start, d = (t0[i] - t0[0]) * 1e3, dur[i] * 1e3
        for frac_mid, want in ((0.15, mplot.PARTS[0][2]), (0.35, mplot.PARTS[1][2]), (0.65, mplot.PARTS[2][2]),
                               (0.95, mplot.OTHER_COLOR)):
            assert np.abs(at(start + frac_mid * d) - colour(want)).max() < 0.1, (i, want, at(start + frac_mid * d))
        gap = start + d + (1e-2 * 1e3 - d) / 2
        if i + 1 < n:
            assert at(gap).min() > 0.9, at(gap)  # white


def test_context_data_renders(matplotlib, tiny_model, tmp_path, rng):
    # n_cpu_moe=1: layer 0's experts in host RAM, layer 1's resident on the (emulated) device.
    ctx = moeinfer.Context(tiny_model, device="emulated", n_ctx=64, n_ubatch=8, n_cpu_moe=1)
    ctx.set_timeline(16)
    ctx.decode(rng.integers(0, 100, size=20).astype(np.int32))
    data = mplot.context_data(ctx, title="tiny")
    assert data["resident_layers"] == [False, True]
    np.testing.assert_array_equal(np.array(data["expert_counts"]), ctx.expert_counts())
    assert data["timeline"]["n_tokens"] == [8, 8, 4] and data["title"] == "tiny"
    json.dumps(data)  # plain lists: what moeinfer-bench --plot writes too
    mplot.render(data, tmp_path / "ctx.png", width=800, height=500)
    assert read_png(tmp_path / "ctx.png").shape[:2] == (500, 800)


def test_render_errors(matplotlib, tmp_path):
    with pytest.raises(ValueError, match="expert_counts"):
        mplot.render({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="resident_layers has 1 entries for 2 layers"):
        mplot.render({"expert_counts": [[1, 2], [3, 4]], "resident_layers": [True]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="at least 200"):
        mplot.render({"expert_counts": [[1]]}, tmp_path / "x.png", width=100)
    (tmp_path / "bad.json").write_text("{")
    assert mplot.main([str(tmp_path / "bad.json"), str(tmp_path / "x.png")]) == 1
