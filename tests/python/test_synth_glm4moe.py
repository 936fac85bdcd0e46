"""moeinfer-synth for glm4moe: a GLM preset name picks the architecture, and a 2-layer cut of GLM-4.5-Air holds
what a converted GLM file holds (metadata keys and tensors as llama.cpp's glm4moe loader reads them, the NextN
layer counted in block_count) and loads in moeinfer with the NextN layer left out. Read back with gguf-py.
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer
from test_synth_gguf import TOOL, synth, write

pytestmark = pytest.mark.skipif(TOOL is None, reason="moeinfer-synth not found")


def test_help_lists_the_glm_presets():
    out = synth("--help").stdout
    for word in ("glm4moe", "glm-4.5-air", "glm-4.5", "tiny-air"):
        assert word in out, word


def test_glm_45_air_cut_to_two_layers(tmp_path):
    path = tmp_path / "air.gguf"
    # The real attention, dense and shared-expert shapes at n_embd 256 (the dense FFN stays 10944 wide).
    reader = write(path, "--preset", "glm-4.5-air", "--layers", "2", "--embd", "256", "--vocab", "300",
                   "--n-expert", "8", "--n-expert-used", "2")
    md = {f.name: f for f in reader.fields.values()}

    def value(key):
        f = md[key]
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]][0]

    assert value("general.architecture") == "glm4moe"
    want = {"block_count": 3, "leading_dense_block_count": 1, "nextn_predict_layers": 1, "feed_forward_length": 10944,
            "expert_feed_forward_length": 1408, "expert_shared_count": 1, "rope.dimension_count": 64,
            "attention.key_length": 128, "attention.head_count": 96, "attention.head_count_kv": 8,
            "expert_gating_func": 2}
    for k, v in want.items():
        assert int(value(f"glm4moe.{k}")) == v, k
    assert bool(value("glm4moe.expert_weights_norm"))
    assert float(value("glm4moe.expert_weights_scale")) == 1.0
    shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    assert shapes["blk.0.ffn_up.weight"] == [256, 10944]
    assert shapes["blk.1.ffn_up_shexp.weight"] == [256, 1408]
    assert shapes["blk.1.attn_q.weight"] == [256, 96 * 128]
    assert shapes["blk.2.nextn.eh_proj.weight"] == [512, 256]
    assert "blk.0.ffn_gate_inp.weight" not in shapes and "blk.1.attn_q_norm.weight" not in shapes
    del reader

    model = moeinfer.Model(str(path))
    assert (model.info.architecture, model.info.n_layer) == ("glm4moe", 2)
    logits = moeinfer.Context(model, device="cpu", n_ctx=16).decode(np.array([1, 5, 9], dtype=np.int32))
    assert logits.shape == (1, 300) and np.all(np.isfinite(logits))
