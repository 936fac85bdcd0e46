"""Load a GGUF model into float64 numpy arrays for the reference forward passes.

Conventions (llama.cpp / ggml): a GGUF tensor's dimensions `ne` are listed fastest-varying first, so the numpy
array (C order) has shape `reversed(ne)`. A 2-D weight with ne = [n_in, n_out] is numpy [n_out, n_in] and
computes y = W @ x; an expert tensor with ne = [n_in, n_out, n_expert] is numpy [n_expert, n_out, n_in].
Every tensor, whatever its GGUF type, is dequantised with gguf.quants.dequantize and widened to float64, so the
reference computes exactly on the values the file holds.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


@dataclasses.dataclass(frozen=True)
class HParams:
    """Hyper-parameters read from GGUF metadata (<arch>.* keys, names as in llama.cpp's llama-arch.cpp)."""

    arch: str
    n_layer: int           # block_count less nextn_predict_layers (the layers a forward pass runs)
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int          # attention.key_length (default n_embd / n_head)
    head_dim_v: int        # attention.value_length (default head_dim)
    n_rot: int             # rope.dimension_count (default head_dim)
    rms_eps: float
    rope_freq_base: float
    n_expert: int
    n_expert_used: int
    n_ff_exp: int          # expert_feed_forward_length
    n_vocab: int           # rows of token_embd.weight
    sliding_window: int | None = None             # gpt-oss: attention.sliding_window
    rope_scaling_type: str | None = None          # rope.scaling.type ("yarn" for gpt-oss)
    rope_scaling_factor: float | None = None      # rope.scaling.factor
    rope_orig_ctx: int | None = None              # rope.scaling.original_context_length
    yarn_beta_fast: float = 32.0                  # rope.scaling.yarn_beta_fast (YaRN paper default)
    yarn_beta_slow: float = 1.0                   # rope.scaling.yarn_beta_slow


@dataclasses.dataclass(frozen=True)
class Model:
    """Hyper-parameters plus every tensor as float64 in numpy order; `types` keeps each tensor's GGUF type."""

    hparams: HParams
    tensors: dict[str, np.ndarray]
    types: dict[str, GGMLQuantizationType]
    metadata: dict[str, Any]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` (numpy order); with `shape`, a mismatch is a ValueError naming the tensor."""
        try:
            arr = self.tensors[name]
        except KeyError:
            raise KeyError(f"tensor '{name}' is missing from the model") from None
        if shape is not None and arr.shape != tuple(shape):
            raise ValueError(f"tensor '{name}' has numpy shape {arr.shape} (GGUF ne {list(arr.shape[::-1])}), "
                             f"expected {tuple(shape)} (GGUF ne {list(shape)[::-1]})")
        return arr

    def blk(self, il: int, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Layer tensor blk.<il>.<name>."""
        return self.get(f"blk.{il}.{name}", shape)

    def output_weight(self) -> np.ndarray:
        """output.weight, or token_embd.weight when the model ties them (llama.cpp falls back the same way)."""
        shape = (self.hparams.n_vocab, self.hparams.n_embd)
        return self.get("output.weight" if self.has("output.weight") else "token_embd.weight", shape)

    def with_tensors(self, updates: dict[str, np.ndarray]) -> "Model":
        """A copy with some tensors replaced (same shapes), for perturbation tests."""
        tensors = dict(self.tensors)
        for name, arr in updates.items():
            old = self.get(name)
            new = np.asarray(arr, dtype=np.float64)
            if new.shape != old.shape:
                raise ValueError(f"replacement for '{name}' has shape {new.shape}, expected {old.shape}")
            tensors[name] = new
        return dataclasses.replace(self, tensors=tensors)


def _read_metadata(reader: GGUFReader) -> dict[str, Any]:
    # GGUFReader also exposes the header as pseudo-fields (GGUF.version, ...); keep only real KVs.
    return {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}


class _Meta:
    """Typed access to <arch>.* keys with errors that name the missing or malformed key."""

    def __init__(self, md: dict[str, Any], arch: str, path: str):
        self.md, self.arch, self.path = md, arch, path

    def _raw(self, key: str, default: Any, required: bool) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.md:
            if required:
                raise ValueError(f"{self.path}: metadata key '{full}' is missing")
            return default
        return self.md[full]

    def get_int(self, key: str, default: int | None = None, required: bool = True) -> int | None:
        v = self._raw(key, default, required and default is None)
        if v is None:
            return None
        if isinstance(v, (list, np.ndarray)) or isinstance(v, bool) or int(v) != v:
            raise ValueError(f"{self.path}: metadata key '{self.arch}.{key}' must be an integer scalar, got {v!r}")
        return int(v)

    def get_float(self, key: str, default: float | None = None, required: bool = True) -> float | None:
        v = self._raw(key, default, required and default is None)
        if v is None:
            return None
        if isinstance(v, (list, np.ndarray, str)):
            raise ValueError(f"{self.path}: metadata key '{self.arch}.{key}' must be a number, got {v!r}")
        return float(v)

    def get_str(self, key: str) -> str | None:
        v = self._raw(key, None, False)
        if v is not None and not isinstance(v, str):
            raise ValueError(f"{self.path}: metadata key '{self.arch}.{key}' must be a string, got {v!r}")
        return v


def _dequantize(t) -> np.ndarray:
    ne = [int(d) for d in t.shape]
    shape = tuple(reversed(ne))
    values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"tensor '{t.name}' ({t.tensor_type.name}) decodes to {values.size} values, "
                         f"but its GGUF ne {ne} holds {int(np.prod(shape))}")
    return values.reshape(shape)


def load(path: str | os.PathLike) -> Model:
    """Read `path` with gguf.GGUFReader: hyper-parameters from metadata, every tensor dequantised to float64."""
    path = os.fspath(path)
    reader = GGUFReader(path, "r")
    md = _read_metadata(reader)
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: metadata key 'general.architecture' is missing or not a string")

    tensors: dict[str, np.ndarray] = {}
    types: dict[str, GGMLQuantizationType] = {}
    for t in reader.tensors:
        if t.name in tensors:
            raise ValueError(f"{path}: tensor '{t.name}' appears twice")
        tensors[t.name] = _dequantize(t)
        types[t.name] = GGMLQuantizationType(t.tensor_type)
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: tensor 'token_embd.weight' is missing")

    m = _Meta(md, arch, path)
    n_embd = m.get_int("embedding_length")
    n_head = m.get_int("attention.head_count")
    if n_head <= 0:
        raise ValueError(f"{path}: metadata key '{arch}.attention.head_count' must be positive, got {n_head}")
    head_dim = m.get_int("attention.key_length", default=n_embd // n_head)
    hp = HParams(
        arch=arch,
        # The layers run: glm4moe (and deepseek2) files append nextn_predict_layers multi-token-prediction
        # layers, counted in block_count, which llama.cpp loads but does not run.
        n_layer=m.get_int("block_count") - m.get_int("nextn_predict_layers", default=0),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=m.get_int("attention.head_count_kv", default=n_head),
        head_dim=head_dim,
        head_dim_v=m.get_int("attention.value_length", default=head_dim),
        n_rot=m.get_int("rope.dimension_count", default=head_dim),
        rms_eps=m.get_float("attention.layer_norm_rms_epsilon"),
        rope_freq_base=m.get_float("rope.freq_base", default=10000.0),
        n_expert=m.get_int("expert_count"),
        n_expert_used=m.get_int("expert_used_count"),
        n_ff_exp=m.get_int("expert_feed_forward_length"),
        n_vocab=tensors["token_embd.weight"].shape[0],
        sliding_window=m.get_int("attention.sliding_window", required=False),
        rope_scaling_type=m.get_str("rope.scaling.type"),
        rope_scaling_factor=m.get_float("rope.scaling.factor", required=False),
        rope_orig_ctx=m.get_int("rope.scaling.original_context_length", required=False),
        yarn_beta_fast=m.get_float("rope.scaling.yarn_beta_fast", default=32.0),
        yarn_beta_slow=m.get_float("rope.scaling.yarn_beta_slow", default=1.0),
    )
    _validate(hp, path)
    return Model(hparams=hp, tensors=tensors, types=types, metadata=md)


def _validate(hp: HParams, path: str) -> None:
    checks = [
        (hp.n_layer > 0, "block_count must be positive"),
        (hp.n_embd > 0, "embedding_length must be positive"),
        (hp.n_head_kv > 0 and hp.n_head % hp.n_head_kv == 0,
         f"attention.head_count ({hp.n_head}) must be a multiple of attention.head_count_kv ({hp.n_head_kv})"),
        (hp.head_dim > 0 and hp.head_dim_v > 0, "attention.key_length / value_length must be positive"),
        (0 < hp.n_rot <= hp.head_dim and hp.n_rot % 2 == 0,
         f"rope.dimension_count ({hp.n_rot}) must be even and in (0, key_length={hp.head_dim}]"),
        (hp.rms_eps > 0, "attention.layer_norm_rms_epsilon must be positive"),
        (hp.rope_freq_base > 0, "rope.freq_base must be positive"),
        (0 < hp.n_expert_used <= hp.n_expert,
         f"expert_used_count ({hp.n_expert_used}) must be in [1, expert_count={hp.n_expert}]"),
        (hp.n_ff_exp > 0, "expert_feed_forward_length must be positive"),
        (hp.sliding_window is None or hp.sliding_window > 0, "attention.sliding_window must be positive"),
    ]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"{path}: {hp.arch}.{what}")
