"""Independent float64 numpy reference forward passes for moeinfer's architectures.

Written from the model math (Hugging Face transformers' modeling_qwen3_moe.py / modeling_gpt_oss.py) and
llama.cpp's GGUF naming conventions, never from moeinfer's C++, so tests can check the C++ logits against it.

    from reference import gguf_model, qwen3moe, gpt_oss
    model = gguf_model.load("tiny.gguf")
    cache = KVCache(model.hparams.n_layer)
    logits = gpt_oss.forward(model, tokens, cache=cache)   # [n_tokens, n_vocab] float64
"""

from .gguf_model import HParams, Model, load
from .ops import KVCache

__all__ = ["HParams", "KVCache", "Model", "load", "forward_for"]


def forward_for(model):
    """The forward function of `model`'s architecture (qwen3moe.forward or gpt_oss.forward)."""
    from . import deepseek2, glm4moe, gpt_oss, qwen3moe

    by_arch = {qwen3moe.ARCH: qwen3moe.forward, gpt_oss.ARCH: gpt_oss.forward, deepseek2.ARCH: deepseek2.forward,
               glm4moe.ARCH: glm4moe.forward}
    try:
        return by_arch[model.hparams.arch]
    except KeyError:
        raise ValueError(f"general.architecture '{model.hparams.arch}' has no reference forward "
                         f"(known: {sorted(by_arch)})") from None
