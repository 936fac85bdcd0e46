"""moeinfer: Mixture-of-Experts inference on one machine whose GPU is too small for the model.

The Python face of the moeinfer C library (every call goes through its C API)::

    import numpy as np
    import moeinfer

    moeinfer.synth_write("tiny.gguf", preset="tiny")      # a synthetic model for experiments
    model = moeinfer.Model("tiny.gguf")
    print(model.info.n_layer, model.info.n_expert)
    for t in model.tensors:
        print(t.name, t.type, t.shape)
    w = model.tensor("token_embd.weight")                 # float32, numpy order
    arch = model.meta("general.architecture")
    vocab = model.meta("tokenizer.ggml.tokens")           # arrays as lists

    ids = model.tokenize("Hello, world", parse_special=True)  # the model's own tokenizer
    text = model.detokenize(ids)                          # and back; Detokenizer(model).feed() streams

    ctx = moeinfer.Context(model, n_ctx=256)             # KV cache, ubatches; keeps `model` alive
    logits = ctx.decode(np.array([1, 2, 3], np.int32))   # float32 [1, n_vocab]: the last token's
    logits = ctx.decode([4, 5], logits_all=True)         # [2, n_vocab], continuing at ctx.n_past

    # Hybrid scheduling: experts in host RAM, the rest on the GPU ("emulated" plays the GPU in host memory).
    policy = moeinfer.Policy(expert_copy="active").parse_offload("mul_mat_id=256,moe_up_gate=256")
    hctx = moeinfer.Context(model, device="cuda", tensor_overrides="exps=CPU", policy=policy)
    hctx.decode(np.arange(300, dtype=np.int32))
    print(hctx.stats()["bytes_weights_experts"], hctx.expert_counts().shape)  # [n_layer, n_expert]
    print(hctx.tensor_location("blk.0.ffn_up_exps.weight"))                  # ("host", False)

    q = moeinfer.quantize("q8_0", w)                      # bit-exact with ggml
    w2 = moeinfer.dequantize("q8_0", q).reshape(w.shape)

    bw = moeinfer.measure_bandwidth("cuda")               # GB/s: host_read, h2d_pinned, ...

    smpl = moeinfer.Sampler(model.info.n_vocab, temperature=0.7, seed=1)  # top-k/p, min-p, penalties
    smpl.accept([1, 2, 3])                                # the penalties' history
    tok = smpl.sample(logits[-1])                         # a token id; smpl.accept(tok) to keep it

Errors raise Python exceptions carrying the library's message: ValueError (bad arguments),
FileNotFoundError, KeyError (missing tensor or metadata key), MemoryError, NotImplementedError,
OSError, DataCorruptError (a malformed file; a ValueError), CancelledError (a progress callback
returned False) and RuntimeError (anything else).

Long calls (loading, writing synthetic models, quantising, decoding, measuring bandwidth) release
the GIL.
"""

from ._moeinfer import (
    CancelledError,
    Context,
    DataCorruptError,
    Detokenizer,
    Model,
    ModelInfo,
    Policy,
    Sampler,
    TensorInfo,
    __version__,
    backend_options_help,
    dequantize,
    has_cuda,
    measure_bandwidth,
    quantize,
    row_bytes,
    synth_write,
    type_info,
)
from ._moeinfer import (  # token types (GGUF's tokenizer.ggml.token_type numbers)
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNDEFINED,
    TOKEN_UNKNOWN,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
)

__all__ = [
    "CancelledError",
    "Context",
    "DataCorruptError",
    "Detokenizer",
    "Model",
    "ModelInfo",
    "Policy",
    "Sampler",
    "TensorInfo",
    "__version__",
    "backend_options_help",
    "dequantize",
    "has_cuda",
    "measure_bandwidth",
    "quantize",
    "row_bytes",
    "synth_write",
    "type_info",
    "TOKEN_BYTE",
    "TOKEN_CONTROL",
    "TOKEN_NORMAL",
    "TOKEN_UNDEFINED",
    "TOKEN_UNKNOWN",
    "TOKEN_UNUSED",
    "TOKEN_USER_DEFINED",
]

# Chat templates: moeinfer.chat_template (jinja2 as Hugging Face runs it, and the C library's built-in
# renderers) and Model.apply_chat_template.
from . import chat_template  # noqa: E402

Model.apply_chat_template = chat_template._model_method
__all__.append("chat_template")

# Text generation: Context.generate / Context.chat over moe_generate (moeinfer/generation.py).
from . import generation  # noqa: E402

Context.generate = generation.generate
Context.chat = generation.chat
