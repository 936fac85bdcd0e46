"""Context.generate / Context.chat (moe_generate through the bindings) on tiny synthetic models.

References: a manual loop of Context.decode + numpy argmax (greedy), the same loop drawing with a second
Sampler of the same seed (sampled), Model.detokenize of the ids (the streamed text), and a fresh context
(prefix reuse). Prompts are fresh random ids per run (conftest's rng fixture prints the seed).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import moeinfer

REPO = Path(__file__).resolve().parents[2]


def manual_loop(model, prompt, n, sampler=None):
    """Decode the prompt, then draw (argmax, lowest id on ties, or `sampler`) and decode, up to n tokens
    or an end-of-generation token."""
    ctx = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    if sampler is not None:
        sampler.accept(list(prompt))
    logits = ctx.decode(np.asarray(prompt, np.int32))
    out = []
    while len(out) < n:
        tok = int(np.argmax(logits[-1])) if sampler is None else sampler.sample(logits[-1])
        if model.is_eog(tok):
            break
        out.append(tok)
        if sampler is not None:
            sampler.accept(tok)
        if len(out) < n:
            logits = ctx.decode([tok])
    return out


def run(gen):
    """Drains a generate()/chat() generator: (the pieces, the result dict)."""
    pieces = []
    while True:
        try:
            pieces.append(next(gen))
        except StopIteration as stop:
            return pieces, stop.value


def random_prompt(rng, n=8):
    return [int(t) for t in rng.integers(300, 500, size=n)]


@pytest.fixture
def model(tiny_model):
    return moeinfer.Model(tiny_model)


def test_greedy_equals_manual_loop(model, rng):
    prompt = random_prompt(rng)
    ref = manual_loop(model, prompt, 12)
    ctx = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    pieces, r = run(ctx.generate(prompt, max_tokens=12))
    assert r["tokens"] == ref
    assert r["n_generated"] == len(ref) and r["n_prompt_decoded"] == len(prompt) and r["n_prompt_reused"] == 0
    assert r["stop_reason"] == ("max_tokens" if len(ref) == 12 else "eog")
    assert "".join(pieces) == model.detokenize(ref)
    assert all(p for p in pieces)


def test_sampled_equals_manual_loop_with_the_same_seed(model, rng):
    prompt = random_prompt(rng)
    seed = int(rng.integers(1, 2**31))
    kw = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3, seed=seed)
    ref = manual_loop(model, prompt, 16, moeinfer.Sampler(model.info.n_vocab, **kw))
    ctx = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    _, r = run(ctx.generate(prompt, max_tokens=16, sampler=moeinfer.Sampler(model.info.n_vocab, **kw)))
    assert r["tokens"] == ref


def test_prefix_reuse_matches_a_fresh_context(model, rng):
    prompt = random_prompt(rng)
    ctx = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    _, first = run(ctx.generate(prompt, max_tokens=6))
    extended = prompt + first["tokens"][:4] + random_prompt(rng, 3)
    _, again = run(ctx.generate(extended, max_tokens=8))
    # The cache holds the generated tokens but the last one when max_tokens ended the generation (it is
    # never decoded), all of them after an end-of-generation token.
    in_cache = first["n_generated"] - (1 if first["stop_reason"] == "max_tokens" else 0)
    cached = prompt + first["tokens"][:in_cache]
    # The common prefix of the new prompt and the cache: at least the prompt and 4 generated tokens, more when
    # the first random token happens to equal the next cached one (the tiny vocabularies make that likely).
    common = next((i for i, (a, b) in enumerate(zip(extended, cached)) if a != b), min(len(extended), len(cached)))
    assert common >= len(prompt) + min(4, in_cache)
    assert again["n_prompt_reused"] == common
    assert again["n_prompt_decoded"] == len(extended) - again["n_prompt_reused"]
    fresh = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    _, ref = run(fresh.generate(extended, max_tokens=8))
    assert ref["n_prompt_reused"] == 0
    assert again["tokens"] == ref["tokens"]
    # Text prompts: the same through the tokenizer, and a prompt that shares nothing reuses nothing.
    _, t1 = run(ctx.generate("hello there", max_tokens=2))
    _, t2 = run(ctx.generate("hello there, again", max_tokens=2))
    assert t1["n_prompt_reused"] == 0 and t2["n_prompt_reused"] >= len(model.tokenize("hello there")) - 1


def test_stop_string_across_pieces(model, rng):
    for _ in range(20):  # a prompt whose greedy continuation is long enough to test with
        prompt = random_prompt(rng)
        ref = manual_loop(model, prompt, 12)
        if len(ref) >= 5:
            break
    assert len(ref) >= 5, "the random model stopped too early for this test"
    # The last 2 characters of the text before token k and the first (up to 2) of token k's piece, at
    # the first k where both are whole characters.
    for k in range(1, len(ref)):
        before, piece = model.detokenize(ref[:k]), model.detokenize(ref[k:k + 1])
        if len(before) >= 2 and piece and "\ufffd" not in before[-2:] + piece[:2]:
            break
    else:
        pytest.fail(f"no piece boundary to test in {model.detokenize(ref)!r}")
    stop = before[-2:] + piece[:2]
    full = model.detokenize(ref)
    ctx = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    pieces, r = run(ctx.generate(prompt, max_tokens=12, stop=["never\x01appears", stop]))
    assert r["stop_reason"] == "stop"
    assert "".join(pieces) == full[: full.index(stop)]


def test_closing_the_generator_stops_it(model, rng):
    ctx = moeinfer.Context(model, n_ctx=128, n_threads=1, device="cpu")
    gen = ctx.generate(random_prompt(rng), max_tokens=50)
    first = next(gen)
    assert first
    gen.close()
    # The context is free again and usable.
    _, r = run(ctx.generate([300, 301], max_tokens=1))
    assert r["n_generated"] <= 1


def test_callback_exception_and_bad_arguments(model):
    ctx = moeinfer.Context(model, n_ctx=32, n_threads=1, device="cpu")
    with pytest.raises(ValueError, match="max_tokens"):
        ctx.generate([1, 2], max_tokens=-1)
    with pytest.raises(TypeError, match="Sampler"):
        run(ctx.generate([1, 2], sampler="greedy"))
    with pytest.raises(ValueError, match=r"stop\[0\]"):
        run(ctx.generate([1, 2], stop=[""]))
    with pytest.raises(ValueError, match="prompt"):
        run(ctx.generate([]))
    with pytest.raises(ValueError, match="outside"):
        run(ctx.generate([1, model.info.n_vocab]))
    with pytest.raises(ValueError, match="n_ctx"):
        run(ctx.generate(list(range(300, 340))))

    def boom(_text):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        ctx._generate([300, 301], None, 4, [], False, boom)


def test_chat_equals_generate_on_the_rendered_template(model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    ctx = moeinfer.Context(model, n_ctx=256, n_threads=1, device="cpu")
    pieces, r = run(ctx.chat(messages, max_tokens=6, template_name="chatml"))
    text = model.apply_chat_template(messages, add_generation_prompt=True, engine="c", template_name="chatml")
    assert text.endswith("<|im_start|>assistant\n")
    fresh = moeinfer.Context(model, n_ctx=256, n_threads=1, device="cpu")
    ref_pieces, ref = run(fresh.generate(text, max_tokens=6, add_special=False))
    assert r["tokens"] == ref["tokens"] and "".join(pieces) == "".join(ref_pieces)
    # The next turn decodes only what the conversation added.
    messages += [{"role": "assistant", "content": "".join(pieces)}, {"role": "user", "content": "More."}]
    _, r2 = run(ctx.chat(messages, max_tokens=2, template_name="chatml"))
    assert r2["n_prompt_reused"] >= len(model.tokenize(text, add_special=False, parse_special=True)) - 1


def test_readme_generation_example(tmp_path, monkeypatch):
    """The README's generation example runs as written (in a temporary directory)."""
    readme = (REPO / "README.md").read_text()
    m = re.search(r"<!-- generate-example -->\s*```python\n(.*?)```", readme, re.S)
    assert m, "README.md has no <!-- generate-example --> block"
    monkeypatch.chdir(tmp_path)
    exec(compile(m.group(1), "README.md", "exec"), {})
