"""Write tiny random qwen3moe / gpt-oss GGUF models with gguf.GGUFWriter, to self-test the reference.

Tensor names, shapes and metadata keys follow llama.cpp (the same as moeinfer's C++ synthetic-model writer).
Weights are float32 random normals scaled by 1/sqrt(fan_in) so activations stay O(1); gpt-oss expert gate/up
rows are scaled up so that the SWIGLU_OAI clamps (gate <= 7, |up| <= 7) are actually hit. Expert tensors and
the dense 2-D weights can be stored quantised (gguf.quants.quantize): the reference reads them back with the
values the file holds, so any type is exact for the reference; only the original float32 values are lost.

    python -m reference.make_tiny --arch gpt-oss --out tiny.gguf --expert-type mxfp4
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

WEIGHT_TYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "mxfp4": GGMLQuantizationType.MXFP4,
}


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    n_layer: int = 3
    n_expert: int = 16
    n_expert_used: int = 4
    n_embd: int = 64
    n_head: int = 6              # n_head * head_dim != n_embd on purpose, as in the real models
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff_exp: int = 32
    n_vocab: int = 96
    context_length: int = 4096
    rms_eps: float = 1e-6
    rope_freq_base: float = 10000.0
    # gpt-oss only
    sliding_window: int = 6
    rope_scaling_factor: float = 32.0
    rope_orig_ctx: int = 4096


QWEN3MOE_DEFAULT = TinyConfig(n_layer=2, n_expert=8, n_expert_used=2)
GPT_OSS_DEFAULT = TinyConfig(n_layer=3, n_expert=16, n_expert_used=4, rms_eps=1e-5, rope_freq_base=150000.0)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _norm_weight(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)


def _proj(rng: np.random.Generator, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
    """numpy [n_out, n_in] = GGUF ne [n_in, n_out]."""
    return _normal(rng, (n_out, n_in), gain / np.sqrt(n_in))


def qwen3moe_tensors(cfg: TinyConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    c = cfg
    t = {
        "token_embd.weight": _normal(rng, (c.n_vocab, c.n_embd), 1.0),
        "output_norm.weight": _norm_weight(rng, c.n_embd),
        "output.weight": _proj(rng, c.n_vocab, c.n_embd),
    }
    for il in range(c.n_layer):
        b = f"blk.{il}."
        t[b + "attn_norm.weight"] = _norm_weight(rng, c.n_embd)
        t[b + "attn_q.weight"] = _proj(rng, c.n_head * c.head_dim, c.n_embd)
        t[b + "attn_k.weight"] = _proj(rng, c.n_head_kv * c.head_dim, c.n_embd)
        t[b + "attn_v.weight"] = _proj(rng, c.n_head_kv * c.head_dim, c.n_embd)
        t[b + "attn_q_norm.weight"] = _norm_weight(rng, c.head_dim)
        t[b + "attn_k_norm.weight"] = _norm_weight(rng, c.head_dim)
        t[b + "attn_output.weight"] = _proj(rng, c.n_embd, c.n_head * c.head_dim)
        t[b + "ffn_norm.weight"] = _norm_weight(rng, c.n_embd)
        t[b + "ffn_gate_inp.weight"] = _proj(rng, c.n_expert, c.n_embd, gain=2.0)
        t[b + "ffn_gate_exps.weight"] = _normal(rng, (c.n_expert, c.n_ff_exp, c.n_embd), 1 / np.sqrt(c.n_embd))
        t[b + "ffn_up_exps.weight"] = _normal(rng, (c.n_expert, c.n_ff_exp, c.n_embd), 1 / np.sqrt(c.n_embd))
        t[b + "ffn_down_exps.weight"] = _normal(rng, (c.n_expert, c.n_embd, c.n_ff_exp), 1 / np.sqrt(c.n_ff_exp))
    return t


def gpt_oss_tensors(cfg: TinyConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    c = cfg
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    t = {
        "token_embd.weight": _normal(rng, (c.n_vocab, c.n_embd), 1.0),
        "output_norm.weight": _norm_weight(rng, c.n_embd),
        "output.weight": _proj(rng, c.n_vocab, c.n_embd),
    }
    for il in range(c.n_layer):
        b = f"blk.{il}."
        t[b + "attn_norm.weight"] = _norm_weight(rng, c.n_embd)
        t[b + "attn_q.weight"] = _proj(rng, q_dim, c.n_embd)
        t[b + "attn_q.bias"] = _normal(rng, (q_dim,), 0.1)
        t[b + "attn_k.weight"] = _proj(rng, kv_dim, c.n_embd)
        t[b + "attn_k.bias"] = _normal(rng, (kv_dim,), 0.1)
        t[b + "attn_v.weight"] = _proj(rng, kv_dim, c.n_embd)
        t[b + "attn_v.bias"] = _normal(rng, (kv_dim,), 0.1)
        t[b + "attn_output.weight"] = _proj(rng, c.n_embd, q_dim)
        t[b + "attn_output.bias"] = _normal(rng, (c.n_embd,), 0.1)
        t[b + "attn_sinks.weight"] = _normal(rng, (c.n_head,), 1.0)
        t[b + "post_attention_norm.weight"] = _norm_weight(rng, c.n_embd)
        t[b + "ffn_gate_inp.weight"] = _proj(rng, c.n_expert, c.n_embd, gain=2.0)
        t[b + "ffn_gate_inp.bias"] = _normal(rng, (c.n_expert,), 0.3)
        # gain 4: gate/up pre-activations have std ~4, so roughly 8% exceed the +-7 clamps.
        t[b + "ffn_gate_exps.weight"] = _normal(rng, (c.n_expert, c.n_ff_exp, c.n_embd), 4 / np.sqrt(c.n_embd))
        t[b + "ffn_gate_exps.bias"] = _normal(rng, (c.n_expert, c.n_ff_exp), 0.3)
        t[b + "ffn_up_exps.weight"] = _normal(rng, (c.n_expert, c.n_ff_exp, c.n_embd), 4 / np.sqrt(c.n_embd))
        t[b + "ffn_up_exps.bias"] = _normal(rng, (c.n_expert, c.n_ff_exp), 0.3)
        t[b + "ffn_down_exps.weight"] = _normal(rng, (c.n_expert, c.n_embd, c.n_ff_exp), 0.5 / np.sqrt(c.n_ff_exp))
        t[b + "ffn_down_exps.bias"] = _normal(rng, (c.n_expert, c.n_embd), 0.1)
    return t


def _is_expert_weight(name: str) -> bool:
    return name.endswith("_exps.weight")


def _is_dense_weight(name: str) -> bool:
    """2-D projection weights that real GGUFs store quantised (norms, biases, sinks and router stay F32)."""
    dense = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
    return name in ("token_embd.weight", "output.weight") or name.endswith(dense)


def _encode(name: str, arr: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    if qtype == GGMLQuantizationType.F32:
        return arr
    try:
        return quantize(arr, qtype)
    except Exception as exc:  # gguf raises its own QuantError / NotImplementedError / ValueError
        raise ValueError(f"cannot store '{name}' (numpy shape {arr.shape}) as {qtype.name}: {exc}") from exc


def write_gguf(path: str | os.PathLike, arch: str, cfg: TinyConfig, tensors: dict[str, np.ndarray],
               expert_type: str = "f32", dense_type: str = "f32") -> None:
    for what, kind in (("expert_type", expert_type), ("dense_type", dense_type)):
        if kind not in WEIGHT_TYPES:
            raise ValueError(f"{what} '{kind}' is not one of {sorted(WEIGHT_TYPES)}")
    w = GGUFWriter(os.fspath(path), arch)
    w.add_string("general.name", f"tiny-{arch}")
    u32 = {
        "block_count": cfg.n_layer, "context_length": cfg.context_length, "embedding_length": cfg.n_embd,
        "feed_forward_length": cfg.n_ff_exp, "expert_feed_forward_length": cfg.n_ff_exp,
        "attention.head_count": cfg.n_head, "attention.head_count_kv": cfg.n_head_kv,
        "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
        "rope.dimension_count": cfg.head_dim,
        "expert_count": cfg.n_expert, "expert_used_count": cfg.n_expert_used,
    }
    f32 = {"attention.layer_norm_rms_epsilon": cfg.rms_eps, "rope.freq_base": cfg.rope_freq_base}
    if arch == "gpt-oss":
        u32["attention.sliding_window"] = cfg.sliding_window
        u32["rope.scaling.original_context_length"] = cfg.rope_orig_ctx
        f32["rope.scaling.factor"] = cfg.rope_scaling_factor
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
    for key, val in u32.items():
        w.add_uint32(f"{arch}.{key}", int(val))
    for key, val in f32.items():
        w.add_float32(f"{arch}.{key}", float(val))

    for name, arr in tensors.items():
        if _is_expert_weight(name):
            qtype = WEIGHT_TYPES[expert_type]
        elif _is_dense_weight(name):
            qtype = WEIGHT_TYPES[dense_type]
        else:
            qtype = GGMLQuantizationType.F32
        data = _encode(name, arr, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype == GGMLQuantizationType.F32 else qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make(arch: str, path: str | os.PathLike, seed: int = 0, expert_type: str = "f32", dense_type: str = "f32",
         **overrides) -> dict[str, np.ndarray]:
    """Write a tiny `arch` model to `path`; returns the float32 tensors before any quantisation."""
    builders = {"qwen3moe": (QWEN3MOE_DEFAULT, qwen3moe_tensors), "gpt-oss": (GPT_OSS_DEFAULT, gpt_oss_tensors)}
    if arch not in builders:
        raise ValueError(f"arch '{arch}' is not one of {sorted(builders)}")
    default, build = builders[arch]
    cfg = dataclasses.replace(default, **overrides)
    tensors = build(cfg, np.random.default_rng(seed))
    write_gguf(path, arch, cfg, tensors, expert_type=expert_type, dense_type=dense_type)
    return tensors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, choices=["qwen3moe", "gpt-oss"])
    ap.add_argument("--out", required=True, help="output .gguf path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expert-type", default="f32", choices=sorted(WEIGHT_TYPES))
    ap.add_argument("--dense-type", default="f32", choices=sorted(WEIGHT_TYPES))
    ap.add_argument("--layers", type=int, help="block_count (default: 2 qwen3moe, 3 gpt-oss)")
    ap.add_argument("--experts", type=int, help="expert_count (default: 8 qwen3moe, 16 gpt-oss)")
    args = ap.parse_args(argv)
    overrides = {}
    if args.layers is not None:
        overrides["n_layer"] = args.layers
    if args.experts is not None:
        overrides["n_expert"] = args.experts
    make(args.arch, args.out, seed=args.seed, expert_type=args.expert_type, dense_type=args.dense_type,
         **overrides)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
