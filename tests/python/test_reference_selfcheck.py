"""Self-checks of the float64 numpy reference forward passes (tests/python/reference).

The reference is what moeinfer's C++ logits are later compared with, so it is checked here on its own:
  (a) incremental decoding through the KV cache (token by token, chunks of 3, uneven chunks) equals the
      full-prompt forward within 1e-10 relative;
  (b) a deliberately naive per-token, per-head, per-expert loop implementation written below, sharing no
      attention / MoE / RoPE / norm code with the reference, gives the same logits;
  (c) gpt-oss sliding window: with a prompt longer than the window, a token just outside the window of layer 0
      (sliding) does not change that layer's output for the last query, while it changes layer 1 (full), and
      a token just inside does; sinks change the result and obey out = plain_out * (1 - p_sink);
  (d) routing sanity: every expert is selectable, ids distinct, weights positive and summing to 1.
Tiny models are written by reference.make_tiny with gguf.GGUFWriter and read back with gguf.GGUFReader.
Weights and prompts are fresh random data on every run; the seed is printed (pytest shows it with a failure)
and MOEINFER_TEST_SEED=<seed> replays it. These tests need numpy, gguf and pytest only, not moeinfer.
"""

from __future__ import annotations

import math
import os
import secrets

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from reference import KVCache, forward_for, gguf_model, gpt_oss, make_tiny, qwen3moe
from reference.ops import attention, rms_norm, yarn_inv_freq

pytestmark = pytest.mark.fast

ARCHS = ["qwen3moe", "gpt-oss"]
INCREMENTAL_TOL = 1e-10
NAIVE_TOL = 1e-10
SEED = int(os.environ.get("MOEINFER_TEST_SEED", secrets.randbits(32)))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(autouse=True)
def _show_seed():
    print(f"MOEINFER_TEST_SEED={SEED}")   # shown by pytest with any failure of this module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(arch, expert_type='f32', dense_type='f32') -> (Model, float32 source tensors); files cached."""
    made: dict = {}
    root = tmp_path_factory.mktemp("tiny_models")

    def get(arch: str, expert_type: str = "f32", dense_type: str = "f32"):
        key = (arch, expert_type, dense_type)
        if key not in made:
            path = root / f"{arch}-{expert_type}-{dense_type}.gguf"
            src = make_tiny.make(arch, path, seed=SEED, expert_type=expert_type, dense_type=dense_type)
            made[key] = (gguf_model.load(path), src, path)
        return made[key][:2]

    get.path = lambda *key: made[key][2]
    return get


def prompt(model, n: int, salt: int = 1) -> np.ndarray:
    return np.random.default_rng([SEED, salt]).integers(0, model.hparams.n_vocab, n)


# --- GGUF loading -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_layout_and_hparams(tiny, arch):
    model, src = tiny(arch)
    hp = model.hparams
    cfg = make_tiny.QWEN3MOE_DEFAULT if arch == "qwen3moe" else make_tiny.GPT_OSS_DEFAULT
    assert (hp.arch, hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim) == \
        (arch, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_vocab) == \
        (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_vocab)
    if arch == "gpt-oss":
        assert (hp.sliding_window, hp.rope_scaling_type, hp.rope_scaling_factor, hp.rope_orig_ctx) == \
            (cfg.sliding_window, "yarn", cfg.rope_scaling_factor, cfg.rope_orig_ctx)

    # GGUF ne is fastest-first: the file must say [n_embd, n_ff, n_expert] for gate/up experts and
    # [n_in, n_out] for a projection; the loaded numpy arrays are the reverse.
    ne = {t.name: [int(d) for d in t.shape] for t in GGUFReader(tiny.path(arch, "f32", "f32")).tensors}
    assert ne["blk.0.ffn_gate_exps.weight"] == [hp.n_embd, hp.n_ff_exp, hp.n_expert]
    assert ne["blk.0.ffn_down_exps.weight"] == [hp.n_ff_exp, hp.n_embd, hp.n_expert]
    assert ne["blk.0.ffn_gate_inp.weight"] == [hp.n_embd, hp.n_expert]
    assert ne["blk.0.attn_q.weight"] == [hp.n_embd, hp.n_head * hp.head_dim]
    assert ne["token_embd.weight"] == [hp.n_embd, hp.n_vocab]
    for name, arr in src.items():
        assert model.types[name] == GGMLQuantizationType.F32
        np.testing.assert_array_equal(model.get(name), arr.astype(np.float64), err_msg=name)


@pytest.mark.parametrize("qtype,tol", [("f16", 1e-3), ("bf16", 1e-2), ("q8_0", 1e-2), ("q4_0", 0.2),
                                       ("mxfp4", 0.35)])
def test_quantized_tensors_decode_close_to_source(tiny, qtype, tol):
    model, src = tiny("gpt-oss", qtype, "f32")
    name = "blk.1.ffn_up_exps.weight"
    assert model.types[name] == make_tiny.WEIGHT_TYPES[qtype]
    assert model.get(name).shape == src[name].shape
    assert rel_err(model.get(name), src[name].astype(np.float64)) < tol


# --- (a) KV cache / ubatching ------------------------------------------------------------------------------------

def run_in_chunks(model, tokens, sizes) -> np.ndarray:
    forward = forward_for(model)
    cache, out, start = KVCache(model.hparams.n_layer), [], 0
    for size in sizes:
        out.append(forward(model, tokens[start:start + size], cache=cache))
        start += size
    assert start == len(tokens) and cache.n_past == len(tokens)
    return np.concatenate(out)


@pytest.mark.parametrize("arch,expert_type,dense_type", [("qwen3moe", "f32", "f32"), ("qwen3moe", "q8_0", "f16"),
                                                         ("gpt-oss", "f32", "f32"), ("gpt-oss", "mxfp4", "q8_0")])
def test_incremental_decoding_matches_full_prompt(tiny, arch, expert_type, dense_type):
    model, _ = tiny(arch, expert_type, dense_type)
    n = 16  # > the gpt-oss window (6), so cached decoding crosses it
    tokens = prompt(model, n)
    full = forward_for(model)(model, tokens)
    assert full.shape == (n, model.hparams.n_vocab) and full.dtype == np.float64
    for sizes in ([1] * n, [3, 3, 3, 3, 3, 1], [5, 1, 7, 2, 1]):
        assert rel_err(run_in_chunks(model, tokens, sizes), full) < INCREMENTAL_TOL, sizes


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_invariant_to_position_shift(tiny, arch):
    # RoPE (plain or YaRN) only rotates, so q.k and the causal/sliding masks depend on relative positions.
    model, _ = tiny(arch)
    tokens = prompt(model, 12)
    forward = forward_for(model)
    shifted = forward(model, tokens, positions=np.arange(12) + 37)
    assert rel_err(shifted, forward(model, tokens)) < INCREMENTAL_TOL


# --- (b) naive loop implementation, independent of the reference's attention / MoE / RoPE ---------------------

def naive_rms(v, w, eps):
    ms = sum(float(t) * float(t) for t in v) / len(v)
    return np.array([float(v[i]) / math.sqrt(ms + eps) * float(w[i]) for i in range(len(v))])


def naive_rope_table(hp, yarn: bool, truncate: bool):
    """Per pair j: (frequency, cos/sin gain). YaRN derived from 'pair j turns orig*f_j/(2 pi) times'."""
    half = hp.n_rot // 2
    gain = 1.0
    if yarn:
        # dimension index at which a pair completes exactly `turns` turns over the original context
        def dim_at(turns):
            return hp.n_rot * math.log(hp.rope_orig_ctx / (2 * math.pi * turns)) / (2 * math.log(hp.rope_freq_base))
        lo, hi = dim_at(hp.yarn_beta_fast), dim_at(hp.yarn_beta_slow)
        if truncate:
            lo, hi = float(math.floor(lo)), float(math.ceil(hi))
        lo, hi = max(lo, 0.0), min(hi, hp.n_rot - 1.0)
        gain = 1.0 + 0.1 * math.log(hp.rope_scaling_factor)
    table = []
    for j in range(half):
        f = hp.rope_freq_base ** (-2.0 * j / hp.n_rot)
        if yarn:
            t = 0.0 if j <= lo else 1.0 if j >= hi else (j - lo) / (hi - lo)
            f = (1 - t) * f + t * f / hp.rope_scaling_factor
        table.append(f)
    return table, gain


def naive_rotate(vec, pos, table, gain):
    out = np.array(vec, dtype=np.float64)
    half = len(table)
    for j, f in enumerate(table):
        a, b = float(vec[j]), float(vec[j + half])
        c, s = math.cos(pos * f) * gain, math.sin(pos * f) * gain
        out[j], out[j + half] = a * c - b * s, b * c + a * s
    return out


def naive_attention_one(q_vec, keys, vals, scale, sink):
    """One query head over a list of visible (key, value) vectors, with an optional sink logit."""
    logits = [float(np.dot(q_vec, k)) * scale for k in keys]
    top = max(logits + ([sink] if sink is not None else []))
    weights = [math.exp(s - top) for s in logits]
    denom = sum(weights) + (math.exp(sink - top) if sink is not None else 0.0)
    out = np.zeros(len(vals[0]))
    for wgt, v in zip(weights, vals):
        out += (wgt / denom) * v
    return out


def naive_moe_one(model, il, h, arch):
    hp = model.hparams
    router_w = model.get(f"blk.{il}.ffn_gate_inp.weight")
    logits = [float(np.dot(router_w[e], h)) for e in range(hp.n_expert)]
    if arch == "gpt-oss":
        router_b = model.get(f"blk.{il}.ffn_gate_inp.bias")
        logits = [logits[e] + float(router_b[e]) for e in range(hp.n_expert)]
    chosen = sorted(range(hp.n_expert), key=lambda e: -logits[e])[:hp.n_expert_used]
    if arch == "gpt-oss":   # softmax over the chosen logits
        top = max(logits[e] for e in chosen)
        ex = {e: math.exp(logits[e] - top) for e in chosen}
    else:                   # softmax over all experts, keep the chosen, renormalise
        top = max(logits)
        ex = {e: math.exp(logits[e] - top) for e in chosen}   # the full denominator cancels on renormalising
    total = sum(ex.values())
    out = np.zeros(hp.n_embd)
    for e in chosen:
        wg = model.get(f"blk.{il}.ffn_gate_exps.weight")[e]
        wu = model.get(f"blk.{il}.ffn_up_exps.weight")[e]
        wd = model.get(f"blk.{il}.ffn_down_exps.weight")[e]
        act = np.zeros(hp.n_ff_exp)
        for r in range(hp.n_ff_exp):
            g, u = float(np.dot(wg[r], h)), float(np.dot(wu[r], h))
            if arch == "gpt-oss":
                g += float(model.get(f"blk.{il}.ffn_gate_exps.bias")[e][r])
                u += float(model.get(f"blk.{il}.ffn_up_exps.bias")[e][r])
                g = min(g, 7.0)
                u = max(-7.0, min(7.0, u))
                act[r] = (u + 1.0) * g / (1.0 + math.exp(-1.702 * g))
            else:
                act[r] = g / (1.0 + math.exp(-g)) * u
        y = np.array([float(np.dot(wd[c], act)) for c in range(hp.n_embd)])
        if arch == "gpt-oss":
            y = y + model.get(f"blk.{il}.ffn_down_exps.bias")[e]
        out += (ex[e] / total) * y
    return out


def naive_forward(model, tokens, yarn_truncate: bool = False) -> np.ndarray:
    hp, arch = model.hparams, model.hparams.arch
    g = lambda name: model.get(name)  # noqa: E731
    bias = (lambda il, n: g(f"blk.{il}.{n}.bias")) if arch == "gpt-oss" else (lambda il, n: 0.0)
    table, gain = naive_rope_table(hp, yarn=arch == "gpt-oss", truncate=yarn_truncate)
    group = hp.n_head // hp.n_head_kv
    xs = [g("token_embd.weight")[t].astype(np.float64) for t in tokens]
    for il in range(hp.n_layer):
        qs, ks, vs = [], [], []
        for p, x in enumerate(xs):
            h = naive_rms(x, g(f"blk.{il}.attn_norm.weight"), hp.rms_eps)
            q = g(f"blk.{il}.attn_q.weight") @ h + bias(il, "attn_q")
            k = g(f"blk.{il}.attn_k.weight") @ h + bias(il, "attn_k")
            v = g(f"blk.{il}.attn_v.weight") @ h + bias(il, "attn_v")
            q_heads, k_heads, v_heads = [], [], []
            for hd in range(hp.n_head):
                qh = q[hd * hp.head_dim:(hd + 1) * hp.head_dim]
                if arch == "qwen3moe":
                    qh = naive_rms(qh, g(f"blk.{il}.attn_q_norm.weight"), hp.rms_eps)
                q_heads.append(naive_rotate(qh, p, table, gain))
            for hd in range(hp.n_head_kv):
                kh = k[hd * hp.head_dim:(hd + 1) * hp.head_dim]
                if arch == "qwen3moe":
                    kh = naive_rms(kh, g(f"blk.{il}.attn_k_norm.weight"), hp.rms_eps)
                k_heads.append(naive_rotate(kh, p, table, gain))
                v_heads.append(v[hd * hp.head_dim_v:(hd + 1) * hp.head_dim_v])
            qs.append(q_heads), ks.append(k_heads), vs.append(v_heads)
        sliding = arch == "gpt-oss" and il % 2 == 0
        new_xs = []
        for p, x in enumerate(xs):
            first = max(0, p - hp.sliding_window + 1) if sliding else 0
            heads = []
            for hd in range(hp.n_head):
                kv = hd // group
                sink = float(g(f"blk.{il}.attn_sinks.weight")[hd]) if arch == "gpt-oss" else None
                heads.append(naive_attention_one(qs[p][hd], [ks[j][kv] for j in range(first, p + 1)],
                                                 [vs[j][kv] for j in range(first, p + 1)],
                                                 1.0 / math.sqrt(hp.head_dim), sink))
            x = x + g(f"blk.{il}.attn_output.weight") @ np.concatenate(heads) + bias(il, "attn_output")
            norm = "post_attention_norm" if arch == "gpt-oss" else "ffn_norm"
            h = naive_rms(x, g(f"blk.{il}.{norm}.weight"), hp.rms_eps)
            new_xs.append(x + naive_moe_one(model, il, h, arch))
        xs = new_xs
    out_w = g("output.weight")
    return np.array([out_w @ naive_rms(x, g("output_norm.weight"), hp.rms_eps) for x in xs])


@pytest.mark.parametrize("arch,expert_type", [("qwen3moe", "f32"), ("gpt-oss", "f32"), ("gpt-oss", "mxfp4")])
def test_naive_loops_match_vectorised_reference(tiny, arch, expert_type):
    model, _ = tiny(arch, expert_type)
    tokens = prompt(model, 11, salt=3)   # > the gpt-oss window (6)
    assert rel_err(naive_forward(model, tokens), forward_for(model)(model, tokens)) < NAIVE_TOL


def test_naive_matches_with_ggml_style_yarn_truncation(tiny):
    model, _ = tiny("gpt-oss")
    tokens = prompt(model, 9, salt=5)
    ref = gpt_oss.forward(model, tokens, yarn_truncate=True)
    assert rel_err(naive_forward(model, tokens, yarn_truncate=True), ref) < NAIVE_TOL
    # the tiny config's blend bounds (2.02, 4.35) are not integers, so truncation must matter
    assert rel_err(gpt_oss.forward(model, tokens, yarn_truncate=False), ref) > 1e-6


def test_swiglu_oai_clamps_are_exercised(tiny):
    model, _ = tiny("gpt-oss")
    trace: dict = {}
    tokens = prompt(model, 16)
    gpt_oss.forward(model, tokens, trace=trace)
    # pre-activations of the chosen experts for layer 0's MoE input; some must pass the +-7 limits
    x = model.get("token_embd.weight")[tokens] + trace["attn_out"][0]
    h = rms_norm(x, model.get("blk.0.post_attention_norm.weight"), model.hparams.rms_eps)
    ids = trace["expert_ids"][0]
    gates = np.stack([model.get("blk.0.ffn_gate_exps.weight")[e] @ h[t] + model.get("blk.0.ffn_gate_exps.bias")[e]
                      for t in range(len(tokens)) for e in ids[t]])
    assert np.mean(gates > 7.0) > 0.01


# --- (c) gpt-oss sliding window and sinks ------------------------------------------------------------------------

def test_gpt_oss_sliding_window_boundary(tiny):
    model, _ = tiny("gpt-oss")
    window, n = model.hparams.sliding_window, 16
    assert gpt_oss.is_sliding_layer(0) and not gpt_oss.is_sliding_layer(1)
    tokens = prompt(model, n)
    last = n - 1

    def layer_outs(toks):
        trace: dict = {}
        gpt_oss.forward(model, toks, trace=trace)
        return trace["layer_out"]

    base = layer_outs(tokens)
    outside, inside = tokens.copy(), tokens.copy()
    outside[last - window] = (tokens[last - window] + 1) % model.hparams.n_vocab   # position p - window: masked
    inside[last - window + 1] = (tokens[last - window + 1] + 1) % model.hparams.n_vocab  # p - window + 1: seen
    out_o, out_i = layer_outs(outside), layer_outs(inside)
    # layer 0 (sliding) is blind to it; only rounding differs (BLAS groups the MoE rows differently)
    assert rel_err(out_o[0][last], base[0][last]) < 1e-13
    assert rel_err(out_o[1][last], base[1][last]) > 1e-6                           # layer 1 (full) sees it
    assert rel_err(out_i[0][last], base[0][last]) > 1e-6                           # inside the window


def test_gpt_oss_sinks_change_the_result(tiny):
    model, _ = tiny("gpt-oss")
    tokens = prompt(model, 10)
    base = gpt_oss.forward(model, tokens)
    zero = model.with_tensors({f"blk.{il}.attn_sinks.weight": np.zeros(model.hparams.n_head)
                               for il in range(model.hparams.n_layer)})
    assert rel_err(gpt_oss.forward(zero, tokens), base) > 1e-3


def test_attention_sink_scales_plain_softmax_output():
    rng = np.random.default_rng([SEED, 17])
    n, n_head, n_head_kv, d = 5, 4, 2, 8
    q, k, v = rng.standard_normal((n, n_head, d)), rng.standard_normal((n, n_head_kv, d)), \
        rng.standard_normal((n, n_head_kv, d))
    pos = np.arange(n)
    sinks = rng.standard_normal(n_head)
    plain = attention(q, k, v, pos, pos, 0.3)
    with_sink = attention(q, k, v, pos, pos, 0.3, sinks=sinks)
    for t in range(n):
        for h in range(n_head):
            logits = [0.3 * float(q[t, h] @ k[j, h // 2]) for j in range(t + 1)]
            total = sum(math.exp(s) for s in logits)
            p_sink = math.exp(sinks[h]) / (total + math.exp(sinks[h]))
            np.testing.assert_allclose(with_sink[t, h], plain[t, h] * (1 - p_sink), rtol=1e-12, atol=1e-14)


def test_yarn_matches_published_gpt_oss_bounds():
    # GPT-OSS: head_dim 64, rope_theta 150000, factor 32, original context 4096, truncate false.
    # HF/OpenAI (and vLLM after its fix) place the blend between dims 8.0928 and 17.3980.
    base, dim, factor = 150000.0, 64, 32.0
    inv, scale = yarn_inv_freq(base, dim, factor, 4096, 32.0, 1.0, truncate=False)
    orig = base ** (-np.arange(0, dim, 2) / dim)
    low, high = 8.092779115512402, 17.39802450158856
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    np.testing.assert_allclose(inv, orig * (1 - ramp) + orig / factor * ramp, rtol=1e-12)
    assert inv[8] == orig[8] and inv[18] == orig[18] / factor and orig[9] / factor < inv[9] < orig[9]
    assert scale == pytest.approx(0.1 * math.log(32) + 1)
    inv_t, _ = yarn_inv_freq(base, dim, factor, 4096, 32.0, 1.0, truncate=True)   # ggml: bounds 8 and 18
    ramp_t = np.clip((np.arange(dim // 2) - 8) / (18 - 8), 0, 1)
    np.testing.assert_allclose(inv_t, orig * (1 - ramp_t) + orig / factor * ramp_t, rtol=1e-12)


# --- (d) routing ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_routing_selects_every_expert_with_normalised_weights(tiny, arch):
    model, _ = tiny(arch)
    hp = model.hparams
    module = gpt_oss if arch == "gpt-oss" else qwen3moe
    h = np.random.default_rng([SEED, 11]).standard_normal((256, hp.n_embd))
    for il in range(hp.n_layer):
        ids, w = module.route(model, il, h)
        assert ids.shape == w.shape == (256, hp.n_expert_used)
        assert set(np.unique(ids)) == set(range(hp.n_expert)), f"layer {il}: some expert is never chosen"
        assert all(len(set(row)) == hp.n_expert_used for row in ids)
        assert np.all(w > 0) and np.allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-14)
        assert np.all(np.diff(w, axis=1) <= 0)   # ids come largest-first
        logits = h @ model.get(f"blk.{il}.ffn_gate_inp.weight").T
        if arch == "gpt-oss":
            logits = logits + model.get(f"blk.{il}.ffn_gate_inp.bias")
        kth = np.sort(logits, axis=1)[:, -hp.n_expert_used]
        assert np.all(np.take_along_axis(logits, ids, axis=1) >= kth[:, None])


# --- argument errors ---------------------------------------------------------------------------------------------

def test_argument_errors(tiny):
    qwen, _ = tiny("qwen3moe")
    oss, _ = tiny("gpt-oss")
    with pytest.raises(ValueError, match="gpt-oss"):
        qwen3moe.forward(oss, [1, 2])
    with pytest.raises(ValueError, match="token ids"):
        gpt_oss.forward(oss, [oss.hparams.n_vocab])
    with pytest.raises(ValueError, match="KV cache has"):
        gpt_oss.forward(oss, [1], cache=KVCache(oss.hparams.n_layer + 1))
    with pytest.raises(ValueError, match="positions has shape"):
        qwen3moe.forward(qwen, [1, 2], positions=[0])
    with pytest.raises(ValueError, match="expected"):
        qwen.get("blk.0.attn_q.weight", (1, 1))
