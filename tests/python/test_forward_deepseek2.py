"""deepseek2: moeinfer.Context (the C++ CPU forward pass) against the float64 numpy reference (reference/deepseek2.py).

Both tiny deepseek2 presets (moeinfer.synth_write, fresh random weights): "tiny" as DeepSeek-V3 (q LoRA, sigmoid
routing with the exp_probs_b selection bias over 2 of 4 expert groups, normalised weights times 2.5, YaRN) and
"tiny-lite" as DeepSeek-V2 (plain q, softmax routing over the 2 best of 4 groups by their maximum, two shared
experts, weights times 1.5); each has a leading dense layer. moeinfer runs the absorbed latent attention below 32
tokens and HF's form (keys and values up-projected per head, in F16) from 32 on, the reference the plain HF
formula from the same cached latent and rope key, so the forms check each other. The comparisons and bounds are
test_forward_reference.py's (see its docstring: F16 KV cache modelled by the reference, per-token relative errors,
tokens whose routing nearly ties excused); here a token's router
margin is the smaller of the gap between the k-th and (k+1)-th choice and, with a group limit, the gap between
the last kept and the first dropped group's score: for the sigmoid router relative to the RMS of the choices,
for the softmax router between log-probabilities relative to the RMS of the logits (reference/routing.py
router_gaps: a probability's noise grows with it, so V2's group scores, its largest probabilities, flipped
past a probability margin).
Tried on purpose against the reference: NeoX instead of interleaved RoPE, no YaRN softmax scale, no group limit,
no selection bias, no weight scale, and the shared experts left out each move the F32 logits by 0.01 to 0.5
relative, 100x to 5000x the 1e-4 bound.

Random data is fresh on every run; the seed is printed and MOEINFER_TEST_SEED=<seed> replays it.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import moeinfer
import shared_expert_checks
from reference import KVCache, deepseek2
from reference import load as load_reference
from test_forward_reference import (QUANTISED, UBATCH_TOL, UNQUANTISED, F16KVCache, Weights, flip_bounds,
                                    per_token_error, prompt)

pytestmark = pytest.mark.fast

ARCH = "deepseek2"
PRESETS = ("tiny", "tiny-lite")
WEIGHTS = UNQUANTISED + [QUANTISED[0], QUANTISED[1], QUANTISED[3]]


# moeinfer's prefill form (model_graph.h: kMlaDecompressMinTokens) holds the per-head keys and values in F16.
PREFILL_FORM_TOKENS = 32


def reference(ref, tokens, f16_kv=True):
    cache = F16KVCache(ref.hparams.n_layer) if f16_kv else KVCache(ref.hparams.n_layer)
    trace: dict = {}
    f16_heads = f16_kv and len(tokens) >= PREFILL_FORM_TOKENS
    logits = deepseek2.forward(ref, tokens, cache=cache, trace=trace, f16_heads=f16_heads)
    return logits, np.min(np.stack(trace["router_margin"]), axis=0)


def write_model(path, preset: str, w: Weights, rng: np.random.Generator, **kwargs):
    return shared_expert_checks.write_model(path, ARCH, preset, w, rng, **kwargs)


# A prompt of 29 tokens runs the absorbed attention; one of 40 (>= kMlaDecompressMinTokens, model_graph.h) the
# prefill form that up-projects the cached latents into per-head keys and values.
PROMPTS = (29, 40)


@pytest.mark.parametrize("n_tokens", PROMPTS)
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("w", WEIGHTS, ids=lambda w: w.id)
def test_logits_match_reference(preset, w, n_tokens, tmp_path, rng):
    shared_expert_checks.check_logits_match_reference(ARCH, preset, w, tmp_path, rng, reference, n_tokens)


# Between the two attention forms: the prefill form rounds each per-head key and value to F16 (2^-11 relative),
# which moves the logits by ~1e-3 of their largest (seen: 0.6e-3 to 1.5e-3); relative, as UBATCH_TOL.
FORM_TOL = 5e-3


@pytest.mark.parametrize("preset", PRESETS)
def test_ubatch_splits_and_token_by_token_agree(preset, tmp_path, rng):
    """29 tokens (the absorbed form throughout): one ubatch, ubatches of 3 and 7 and token by token agree."""
    model = moeinfer.Model(write_model(tmp_path / "m.gguf", preset, QUANTISED[0], rng))
    shared_expert_checks.check_ubatch_splits_and_token_by_token_agree(model, rng)


@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_form_agrees_with_absorbed_form(preset, tmp_path, rng):
    """40 tokens. Token by token and in ubatches of 7 (absorbed) agree within UBATCH_TOL; one ubatch of 40
    (prefill form) agrees with them within FORM_TOL per token; a ubatch of 33 (prefill form) then one of 7 over the
    cached 33 (absorbed) agrees with the one ubatch of 40 within UBATCH_TOL on its first 33 tokens (the same form
    over the same keys) and within FORM_TOL on the last 7. Between the forms, tokens whose routing nearly ties in
    some layer (the reference's margins below QUANTISED[0].min_margin) are excused: a flip there moves the row by
    O(0.1), and the tokens after a flipped one are held to its error (flip_bounds)."""
    w = QUANTISED[0]
    path = write_model(tmp_path / "m.gguf", preset, w, rng)
    model = moeinfer.Model(path)
    tokens = prompt(rng, model.info.n_vocab, 40)
    _, margins = reference(load_reference(path), tokens)
    stable = margins >= w.min_margin
    decode = lambda n_ubatch: moeinfer.Context(model, device="cpu", n_ctx=64, n_ubatch=n_ubatch).decode(  # noqa: E731
        tokens, logits_all=True)
    ctx = moeinfer.Context(model, device="cpu", n_ctx=64)
    one_by_one = np.concatenate([ctx.decode(tokens[i:i + 1], logits_all=True) for i in range(len(tokens))])
    scale = np.abs(one_by_one).max()
    np.testing.assert_allclose(decode(7), one_by_one, rtol=0, atol=UBATCH_TOL * scale, err_msg="n_ubatch=7")

    whole = decode(40)
    err = per_token_error(whole, one_by_one)
    bound = flip_bounds(~stable, err, FORM_TOL)
    print(f"{preset}: prefill form vs absorbed form, max relative difference {err[stable].max():.2e} "
          f"(bound {FORM_TOL:g}; {np.count_nonzero(~stable)} near-tie tokens excused, "
          f"{np.count_nonzero(stable & (bound > FORM_TOL))} after a flip held to its error)")
    assert np.all(err[stable] <= bound[stable]), (err, bound)
    # Runs of one form differ by UBATCH_TOL at most; the F16 heads move the logits by ~1e-3 (FORM_TOL's note).
    assert err[stable].max() > 10 * UBATCH_TOL, "both runs took the same form"
    split = decode(33)
    np.testing.assert_allclose(split[:33], whole[:33], rtol=0, atol=UBATCH_TOL * scale, err_msg="first 33")
    tail = per_token_error(split[33:], whole[33:])
    assert np.all((tail <= flip_bounds(~stable[33:], tail, FORM_TOL))[stable[33:]]), tail


def test_truncated_presets_keep_dense_and_moe_layers(tmp_path):
    """n_layer below the preset's keeps its share of leading dense layers, at least one of each kind (4 layers of
    DeepSeek-V3's 61 with 3 dense: 1 dense + 3 MoE); the file says so and holds exactly those tensors."""
    for preset, n_layer, dense in (("tiny", 2, 1), ("tiny", 3, 1), ("tiny-lite", 2, 1)):
        path = tmp_path / f"{preset}-{n_layer}.gguf"
        moeinfer.synth_write(path, ARCH, preset=preset, n_layer=n_layer, seed=3)
        r = gguf.GGUFReader(str(path))
        assert int(r.fields["deepseek2.leading_dense_block_count"].contents()) == dense
        names = {t.name for t in r.tensors}
        for il in range(n_layer):
            assert (f"blk.{il}.ffn_up.weight" in names) == (il < dense), (preset, il)
            assert (f"blk.{il}.ffn_up_exps.weight" in names) == (il >= dense), (preset, il)
        assert moeinfer.Model(path).info.n_layer == n_layer


@pytest.mark.parametrize("preset, expect", [
    ("deepseek-v3", dict(q_lora=1536, kv_lora=512, experts=256, used=8, groups=(8, 4), shared=1, sigmoid=2,
                         scale=2.5)),
    ("kimi-k2", dict(q_lora=1536, kv_lora=512, experts=384, used=8, groups=(1, 1), shared=1, sigmoid=2,
                     scale=2.827)),
    ("deepseek-v2-lite", dict(q_lora=None, kv_lora=512, experts=64, used=6, groups=(1, 1), shared=2, sigmoid=1,
                              scale=1.0)),
])
def test_real_shape_presets(preset, expect, tmp_path):
    """The real configs' routing, MLA and layer shapes in the file's metadata; written as a 2-layer cut with a
    small vocabulary, hidden size, head count and expert FFN (overrides), which leave the rest as the preset
    has it."""
    path = tmp_path / "m.gguf"
    moeinfer.synth_write(path, ARCH, preset=preset, n_layer=2, n_vocab=512, n_embd=64, n_head=2, n_ff_expert=32,
                         expert_type="q4_0", dense_type="q4_0")
    md = {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if k.startswith("deepseek2.")}
    a = "deepseek2."
    assert md.get(a + "attention.q_lora_rank") == expect["q_lora"]
    assert md[a + "attention.kv_lora_rank"] == expect["kv_lora"]
    assert (md[a + "attention.key_length"], md[a + "attention.value_length"]) == (expect["kv_lora"] + 64,
                                                                                  expect["kv_lora"])
    assert (md[a + "attention.key_length_mla"], md[a + "attention.value_length_mla"]) == (192, 128)
    assert md[a + "attention.head_count"] == 2 and md[a + "attention.head_count_kv"] == 1
    assert (md[a + "expert_count"], md[a + "expert_used_count"]) == (expect["experts"], expect["used"])
    assert (md[a + "expert_group_count"], md[a + "expert_group_used_count"]) == expect["groups"]
    assert md[a + "expert_shared_count"] == expect["shared"]
    assert md[a + "expert_gating_func"] == expect["sigmoid"]
    assert md[a + "expert_weights_scale"] == pytest.approx(expect["scale"])
    assert md[a + "context_length"] >= 131072 and md[a + "feed_forward_length"] > 0
    assert md[a + "leading_dense_block_count"] == 1  # of 2 layers
    assert md[a + "rope.scaling.type"] == "yarn"
    info = moeinfer.Model(path).info
    assert (info.architecture, info.n_layer, info.n_head, info.head_dim) == (ARCH, 2, 2, 192)


# --- named errors at load ---------------------------------------------------------------------------------------

def edit(src, dst, meta=None, drop=(), add=None):
    """Copies the model src to dst with gguf-py: metadata keys set (None removes), tensors dropped or added (F32)."""
    meta = meta or {}
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in meta:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, value in meta.items():
        if value is not None:
            w.add_key_value(key, value, gguf.GGUFValueType.UINT32)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, arr in (add or {}).items():
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds2") / "tiny.gguf"
    moeinfer.synth_write(path, ARCH, preset="tiny", expert_type="f32", dense_type="f32", seed=7)
    return path


@pytest.mark.parametrize("meta, words", [
    ({"deepseek2.attention.key_length": 100}, ["deepseek2.attention.key_length", "100", "kv_lora_rank"]),
    ({"deepseek2.attention.value_length": 63}, ["deepseek2.attention.value_length", "63"]),
    ({"deepseek2.rope.dimension_count": 64}, ["deepseek2.rope.dimension_count", "64"]),
    ({"deepseek2.attention.head_count_kv": 2}, ["deepseek2.attention.head_count_kv", "2"]),
    ({"deepseek2.expert_group_count": 3}, ["deepseek2.expert_group_count", "3", "expert_count"]),
    ({"deepseek2.expert_group_used_count": 5}, ["deepseek2.expert_group_used_count", "5"]),
    ({"deepseek2.expert_group_used_count": 1, "deepseek2.expert_used_count": 5},
     ["deepseek2.expert_used_count", "5", "4 experts"]),
    ({"deepseek2.expert_gating_func": 3}, ["deepseek2.expert_gating_func", "3"]),
    ({"deepseek2.leading_dense_block_count": 4}, ["deepseek2.leading_dense_block_count", "4"]),
    ({"deepseek2.attention.kv_lora_rank": None}, ["deepseek2.attention.kv_lora_rank"]),
    ({"deepseek2.expert_shared_count": None}, ["deepseek2.expert_shared_count"]),
])
def test_inconsistent_hyper_parameters_are_named(tiny_f32, tmp_path, meta, words):
    bad = edit(tiny_f32, tmp_path / "bad.gguf", meta=meta)
    with pytest.raises(ValueError) as e:
        moeinfer.Model(bad)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_missing_and_misshaped_tensors_are_named(tiny_f32, tmp_path):
    model = moeinfer.Model(tiny_f32)
    with pytest.raises(FileNotFoundError, match=r"blk\.1\.attn_k_b\.weight.*attn_kv_b"):
        moeinfer.Context(moeinfer.Model(edit(tiny_f32, tmp_path / "a.gguf", drop={"blk.1.attn_k_b.weight"})),
                         device="cpu")
    with pytest.raises(FileNotFoundError, match=r"blk\.2\.ffn_up_shexp\.weight"):
        moeinfer.Context(moeinfer.Model(edit(tiny_f32, tmp_path / "b.gguf", drop={"blk.2.ffn_up_shexp.weight"})),
                         device="cpu")
    wrong = {"blk.0.attn_kv_a_norm.weight": np.ones(65)}
    with pytest.raises(ValueError, match=r"blk\.0\.attn_kv_a_norm\.weight.*\[64\].*\[65\]"):
        moeinfer.Context(moeinfer.Model(edit(tiny_f32, tmp_path / "c.gguf", drop=set(wrong), add=wrong)),
                         device="cpu")
    del model


def test_files_with_the_joint_kv_b_load_and_match_split_files(tiny_f32, tmp_path, rng):
    """A file as converted before llama.cpp split attn_kv_b (per-head sizes in key_length / value_length, no
    _mla keys, head_count_kv = n_head, the joint [kv_lora, n_head * (nope + v)] tensor instead of attn_k_b /
    attn_v_b): moeinfer splits it at load, so on F32 weights the logits are those of the split file (within the
    ubatch bound: the old file is decoded in ubatches of 5); and the other way, for the prefill form."""
    r = gguf.GGUFReader(str(tiny_f32))
    md = {k: f.contents() for k, f in r.fields.items()}
    n_layer, heads = md["deepseek2.block_count"], md["deepseek2.attention.head_count"]
    nope = md["deepseek2.attention.key_length_mla"] - md["deepseek2.rope.dimension_count"]
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    joint, drop = {}, set()
    for il in range(n_layer):
        k_b = tensors[f"blk.{il}.attn_k_b.weight"]        # numpy [H, C, nope]
        v_b = tensors[f"blk.{il}.attn_v_b.weight"]        # numpy [H, v, C]
        per_head = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)  # [H, nope + v, C]
        assert per_head.shape[1] == nope + md["deepseek2.attention.value_length_mla"]
        joint[f"blk.{il}.attn_kv_b.weight"] = per_head.reshape(heads * per_head.shape[1], -1)
        drop |= {f"blk.{il}.attn_k_b.weight", f"blk.{il}.attn_v_b.weight"}
    old = edit(tiny_f32, tmp_path / "old.gguf", drop=drop, add=joint, meta={
        "deepseek2.attention.key_length": md["deepseek2.attention.key_length_mla"],
        "deepseek2.attention.value_length": md["deepseek2.attention.value_length_mla"],
        "deepseek2.attention.key_length_mla": None, "deepseek2.attention.value_length_mla": None,
        "deepseek2.attention.head_count_kv": heads})
    tokens = prompt(rng, moeinfer.Model(tiny_f32).info.n_vocab, 13)
    want = moeinfer.Context(moeinfer.Model(tiny_f32), device="cpu", n_ctx=32).decode(tokens, logits_all=True)
    old_model = moeinfer.Model(old)
    assert old_model.info.n_head_kv == heads
    got = moeinfer.Context(old_model, device="cpu", n_ctx=32, n_ubatch=5).decode(tokens, logits_all=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=UBATCH_TOL * np.abs(want).max())
    # 40 tokens in one ubatch take the prefill form: the old file's own attn_kv_b against the one moeinfer joins
    # from the split file's attn_k_b / attn_v_b (mla_split.h join_kv_b), F32 both.
    tokens = prompt(rng, moeinfer.Model(tiny_f32).info.n_vocab, 40)
    want = moeinfer.Context(moeinfer.Model(tiny_f32), device="cpu", n_ctx=64).decode(tokens, logits_all=True)
    got = moeinfer.Context(old_model, device="cpu", n_ctx=64).decode(tokens, logits_all=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=UBATCH_TOL * np.abs(want).max())


def test_trailing_mtp_layer_is_counted_out_and_not_run(tiny_f32, tmp_path, rng):
    """Files converted with DeepSeek-V3's multi-token-prediction layer append it as blk.<n_layer> (its own
    tensors and nextn.*) with block_count one larger and nextn_predict_layers = 1: moeinfer runs the other
    layers only, so the logits are the original file's exactly (the MTP layer holds NaNs that any use spreads)."""
    r = gguf.GGUFReader(str(tiny_f32))
    n_layer = int(r.fields["deepseek2.block_count"].contents())
    last = f"blk.{n_layer - 1}."
    mtp = {t.name.replace(last, f"blk.{n_layer}."): np.full(np.asarray(t.data).shape, np.nan, np.float32)
           for t in r.tensors if t.name.startswith(last)}
    mtp[f"blk.{n_layer}.nextn.eh_proj.weight"] = np.full((64, 128), np.nan, np.float32)
    path = edit(tiny_f32, tmp_path / "mtp.gguf", add=mtp, meta={
        "deepseek2.block_count": n_layer + 1, "deepseek2.nextn_predict_layers": 1})
    model = moeinfer.Model(path)
    assert model.info.n_layer == n_layer
    tokens = prompt(rng, model.info.n_vocab, 11)
    want = moeinfer.Context(moeinfer.Model(tiny_f32), device="cpu", n_ctx=16).decode(tokens, logits_all=True)
    np.testing.assert_array_equal(moeinfer.Context(model, device="cpu", n_ctx=16).decode(tokens, logits_all=True),
                                  want)


def test_synth_names_a_deepseek2_row_the_dense_type_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match=r"q_lora_rank \(preset\): 32 is not a multiple of 256.*q4_K"):
        moeinfer.synth_write(tmp_path / "x.gguf", ARCH, preset="tiny", n_embd=256, dense_type="q4_K")
    with pytest.raises(ValueError, match=r"n_head_kv: 2 must be 1 for deepseek2"):
        moeinfer.synth_write(tmp_path / "x.gguf", ARCH, preset="tiny", n_head_kv=2)
    with pytest.raises(ValueError, match=r"head_dim: 32 must exceed the preset's 32 rope dims"):
        moeinfer.synth_write(tmp_path / "x.gguf", ARCH, preset="tiny", head_dim=32)
