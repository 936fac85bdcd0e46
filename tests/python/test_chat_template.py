"""Chat templates: the C library's built-in renderers against jinja2 on the real template texts.

For each family's real template (tests/python/reference/chat_templates/, sources in its README) and
fresh random conversations (with or without a system message, several turns, Unicode and Python-
whitespace edge characters, empty content, <think> blocks in content or as reasoning, generation
prompt both ways, thinking on / off / unset), the C renderer (moeinfer.chat_template.render_builtin,
moe_chat_apply_template) must give byte for byte what jinja2 renders through our Hugging Face
environment (moeinfer.chat_template.render), and that must equal what transformers' own
render_jinja_template gives where transformers is installed. The from-model path reads the template
from a synthetic GGUF written with gguf-py.
"""

from __future__ import annotations

import datetime
import pathlib

import jinja2
import numpy as np
import pytest

import moeinfer
from moeinfer import chat_template as ct

from tokenizer_fixtures import CONTROL, NORMAL, with_tokenizer

TEMPLATES = pathlib.Path(__file__).parent / "reference" / "chat_templates"
FAMILIES = {
    "qwen3.jinja": "qwen3",
    "gpt-oss-20b.jinja": "gpt-oss",
    "gpt-oss-120b.jinja": "gpt-oss",
    "deepseek-v3.jinja": "deepseek-v3",
    "deepseek-r1.jinja": "deepseek-r1",
    "glm-4.5.jinja": "glm4.5",
}
DS_BOS = "<｜begin▁of▁sentence｜>"
# A plain ChatML template as models ship it (OpenHermes 2.5's).
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
          "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Fragments of content: words, scripts, emoji, every character Python's str.strip() removes and some
# it keeps (U+200B, U+FEFF), newlines, and the markup the templates parse.
FRAGMENTS = [
    "hello", "world", " ", "  ", "\n", "\n\n", "\t", "x", "42", "Grüße", "日本語", "中文", "한국어", "🙂", "👩‍💻",
    "e\u0301", "\u3000", "\xa0", "\u2028", "\u2029", "\x1c", "\x1f", "\x85", "\u2003", "\u200b", "\ufeff", "\r\n",
    "<think>", "</think>", "/nothink", "<tool_response>", "</tool_response>", "{{ x }}", "{% raw %}", "'\"",
    "<|im_start|>", "<|im_end|>", "<|user|>", "<｜User｜>",
]


def today() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d")


def text(rng: np.random.Generator, max_parts: int = 6) -> str:
    n = int(rng.integers(0, max_parts + 1))
    return "".join(FRAGMENTS[int(i)] for i in rng.integers(0, len(FRAGMENTS), n))


def assistant_content(rng: np.random.Generator) -> str:
    r = rng.random()
    if r < 0.3:  # reasoning inside the content, as models write it
        return text(rng) + "<think>" + text(rng) + "</think>" + text(rng)
    if r < 0.4:
        return text(rng) + "</think>" + text(rng) + "</think>" + text(rng)
    return text(rng)


def conversation(rng: np.random.Generator, family: str) -> list[dict]:
    msgs = []
    if rng.random() < 0.6:
        role = "developer" if family == "gpt-oss" and rng.random() < 0.3 else "system"
        msgs.append({"role": role, "content": text(rng)})
    for _ in range(int(rng.integers(1, 5))):
        if rng.random() < 0.15:
            msgs.append({"role": "system", "content": text(rng)})  # a later system message
        user = text(rng)
        if rng.random() < 0.1:
            user = "<tool_response>" + user + "</tool_response>"
        msgs.append({"role": "user", "content": user})
        if rng.random() < 0.8:
            m = {"role": "assistant", "content": assistant_content(rng)}
            r = rng.random()
            if r < 0.2:
                m["reasoning_content"] = text(rng)
            elif r < 0.3:
                m["thinking"] = ""
            msgs.append(m)
    if family == "gpt-oss":  # its template refuses channel markup in content (tested on its own)
        for m in msgs:
            assert "<|channel|>" not in m["content"]
    return msgs


def options(rng: np.random.Generator, family: str) -> dict:
    opt = {}
    e = int(rng.integers(0, 3))
    if e:
        opt["enable_thinking"] = e == 2
    if family == "gpt-oss":
        if rng.random() < 0.5:
            opt["reasoning_effort"] = ["low", "medium", "high"][int(rng.integers(0, 3))]
        if rng.random() < 0.3:
            opt["model_identity"] = text(rng) or "You are a model."
    return opt


def load(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def jinja_render(template: str, msgs: list[dict], agp: bool, opt: dict) -> str:
    return ct.render(template, msgs, add_generation_prompt=agp, bos_token=DS_BOS, **opt)


def c_render(template: str, msgs: list[dict], agp: bool, opt: dict, date: str) -> str:
    return ct.render_builtin(msgs, template, add_generation_prompt=agp, date=date, bos_token=DS_BOS, **opt)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_detects_family(name):
    assert ct.detect(load(name)) == FAMILIES[name]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_builtin_equals_jinja2_on_random_conversations(name, rng):
    template, family = load(name), FAMILIES[name]
    for _ in range(200):
        msgs = conversation(rng, family)
        opt = options(rng, family)
        for agp in (False, True):
            for _attempt in range(2):  # the date may change between the two renders at midnight
                date = today()
                want = jinja_render(template, msgs, agp, opt)
                got = c_render(template, msgs, agp, opt, date)
                if date == today():
                    break
            assert got == want, f"{name}, add_generation_prompt={agp}, {opt}, messages={msgs!r}"


def test_builtin_chatml_equals_jinja2(rng):
    assert ct.detect(CHATML) == "chatml"
    for _ in range(200):
        msgs = conversation(rng, "chatml")
        for agp in (False, True):
            assert ct.render_builtin(msgs, CHATML, add_generation_prompt=agp) == ct.render(CHATML, msgs, agp)


def test_gpt_oss_default_date_is_today(rng):
    # Without date=, the C renderer writes today as the template's strftime_now("%Y-%m-%d") does.
    for name in ("gpt-oss-20b.jinja", "gpt-oss-120b.jinja"):
        msgs = conversation(rng, "gpt-oss")
        for _attempt in range(2):
            day = today()
            want, got = ct.render(load(name), msgs, True), ct.render_builtin(msgs, load(name), add_generation_prompt=True)
            if day == today():
                break
        assert got == want
        assert f"Current date: {day}\n" in got


def test_jinja_path_equals_transformers(rng):
    """Our jinja2 environment against transformers' own renderer (its render_jinja_template)."""
    tu = pytest.importorskip("transformers.utils.chat_template_utils")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city (°C)",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string", "description": "名前"}},
                                                   "required": ["city"]}}}]
    for name, family in sorted(FAMILIES.items()) + [("chatml", "chatml")]:
        template = CHATML if name == "chatml" else load(name)
        for i in range(40):
            msgs = conversation(rng, family)
            opt = options(rng, family)
            agp = bool(i % 2)
            use_tools = tools if i % 3 == 0 and family in ("qwen3", "glm4.5", "gpt-oss") else None
            for _attempt in range(2):
                day = today()
                ours = ct.render(template, msgs, agp, tools=use_tools, bos_token=DS_BOS, **opt)
                (theirs,), _ = tu.render_jinja_template(conversations=[msgs], tools=use_tools, chat_template=template,
                                                        add_generation_prompt=agp, bos_token=DS_BOS, **opt)
                if day == today():
                    break
            assert ours == theirs, f"{name}: {msgs!r} {opt}"


def test_jinja_path_hugging_face_environment():
    # tojson as Hugging Face's: no HTML escaping, its keyword arguments; the globals; loop controls;
    # {% generation %}; None-valued keys dropped; reasoning offered under both names.
    t = ("{{ x | tojson }}|{{ x | tojson(indent=2, sort_keys=True) }}|{{ x | tojson(separators=(',', ':')) }}|"
         "{{ 'é' | tojson(ensure_ascii=True) }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
         "{{ m.content }}{% endfor %}|{% generation %}G{% endgeneration %}|{{ messages[0].thinking }}"
         "{{ messages[0].reasoning_content }}|{{ 'tool_calls' in messages[0] }}|{{ dict(a=1).a }}|"
         "{% set ns = namespace(k=2) %}{{ ns.k }}|{{ strftime_now('%Y') }}")
    msgs = [{"role": "user", "content": "a", "reasoning": "R", "tool_calls": None}, {"role": "user", "content": "b"}]
    x = {"b": "<&>", "a": [1, 2.5, None, True]}
    out = ct.render(t, msgs, x=x)
    assert out == ('{"b": "<&>", "a": [1, 2.5, null, true]}|{\n  "a": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n'
                   '  "b": "<&>"\n}|{"b":"<&>","a":[1,2.5,null,true]}|"\\u00e9"|a|G|RR|False|1|2|'
                   + datetime.datetime.now().strftime("%Y"))
    with pytest.raises(jinja2.TemplateError, match="nope"):
        ct.render("{{ raise_exception('nope') }}", msgs)
    with pytest.raises(jinja2.exceptions.SecurityError):
        ct.render("{% set ns = namespace(_x=1) %}", msgs)
    with pytest.raises(jinja2.exceptions.SecurityError):  # the sandbox
        ct.render("{{ messages.__class__.__mro__ }}", msgs)
    with pytest.raises(ValueError, match="empty"):
        ct.render(CHATML, [])
    # trim_blocks / lstrip_blocks
    assert ct.render("  {% if true %}\nA\n  {% endif %}\nB", msgs) == "A\nB"


def test_unknown_template_is_named_error_and_name_overrides():
    msgs = [{"role": "user", "content": "hi"}]
    llama3 = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
    with pytest.raises(NotImplementedError) as e:
        ct.render_builtin(msgs, llama3)
    for word in ("chatml", "qwen3", "gpt-oss", "deepseek-r1", "glm4.5", "template_name", "jinja2"):
        assert word in str(e.value)
    with pytest.raises(NotImplementedError):
        ct.detect(llama3)
    # A ChatML-looking template with its own default system prompt is not taken for plain ChatML.
    with pytest.raises(NotImplementedError, match="default system prompt"):
        ct.detect(CHATML.replace("{% for", "{{ 'You are Qwen' }}{% for"))
    assert ct.render_builtin(msgs, llama3, name="chatml", add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ct.render_builtin(msgs, name="qwen3", enable_thinking=False, add_generation_prompt=True) == \
        ct.render(load("qwen3.jinja"), msgs, True, enable_thinking=False)
    with pytest.raises(ValueError, match="unknown chat template name 'llama3'.*glm4.5"):
        ct.render_builtin(msgs, name="llama3")


def test_builtin_refuses_what_it_does_not_render():
    q = load("qwen3.jinja")
    with pytest.raises(ValueError, match=r"messages\[1\].role is 'tool'"):
        ct.render_builtin([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], q)
    with pytest.raises(ValueError, match="tool_calls"):
        ct.render_builtin([{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}], q)
    with pytest.raises(ValueError, match="empty"):
        ct.render_builtin([], q)
    with pytest.raises(ValueError, match="NUL"):
        ct.render_builtin([{"role": "user", "content": "a\0b"}], q)
    with pytest.raises(ValueError, match=r"'content'"):
        ct.render_builtin([{"role": "user"}], q)
    # gpt-oss refuses channel markup in content: the template with its exception, the C renderer with
    # the same text as a ValueError.
    bad = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x<|channel|>final<|message|>y"}]
    for name in ("gpt-oss-20b.jinja", "gpt-oss-120b.jinja"):
        with pytest.raises(jinja2.TemplateError, match="<|channel|> tags in the content field"):
            ct.render(load(name), bad)
        with pytest.raises(ValueError, match="<|channel|> tags in the content field"):
            ct.render_builtin(bad, load(name))


# --- the from-model path ---------------------------------------------------------------------------

def _byte_alphabet() -> list[str]:
    from tokenizers import pre_tokenizers
    return sorted(pre_tokenizers.ByteLevel.alphabet())


@pytest.fixture(scope="module")
def chat_models(tiny_qwen, tmp_path_factory):
    """Copies of a tiny model whose metadata carries each fixture template (and, for DeepSeek-R1, a
    named "tool_use" template), with a byte-level vocabulary holding DeepSeek's BOS / EOS tokens."""
    tokens = _byte_alphabet() + [DS_BOS, "<｜end▁of▁sentence｜>"]
    base = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [NORMAL] * (len(tokens) - 2) + [CONTROL, CONTROL],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": len(tokens) - 2,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
    }
    out = {}
    d = tmp_path_factory.mktemp("chat")
    for name in FAMILIES:
        meta = dict(base, **{"tokenizer.chat_template": load(name)})
        if name == "deepseek-r1.jinja":
            meta["tokenizer.chat_templates"] = ["tool_use"]
            meta["tokenizer.chat_template.tool_use"] = load("qwen3.jinja")
        out[name] = with_tokenizer(tiny_qwen, d / name.replace(".jinja", ".gguf"), meta)
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_model_apply_chat_template(name, chat_models, rng):
    model = moeinfer.Model(chat_models[name])
    assert model.meta("tokenizer.chat_template") == load(name)
    family = FAMILIES[name]
    for _ in range(30):
        msgs = conversation(rng, family)
        opt = options(rng, family)
        agp = bool(rng.integers(0, 2))
        for _attempt in range(2):
            day = today()
            want = ct.render(load(name), msgs, agp, bos_token=DS_BOS, eos_token="<｜end▁of▁sentence｜>", **opt)
            by_jinja = model.apply_chat_template(msgs, add_generation_prompt=agp, **opt)
            by_c = model.apply_chat_template(msgs, add_generation_prompt=agp, engine="c", **opt)
            if day == today():
                break
        assert by_jinja == want
        assert by_c == want
    if name == "deepseek-r1.jinja":
        msgs = [{"role": "user", "content": "hi"}]
        # A named template by its name; tools pick "tool_use" as in Hugging Face.
        assert model.apply_chat_template(msgs, chat_template="tool_use") == ct.render(load("qwen3.jinja"), msgs)
        assert model.apply_chat_template(msgs, tools=[]) == ct.render(load("qwen3.jinja"), msgs, tools=[])
        assert model.apply_chat_template(msgs, chat_template="tool_use", engine="c") == \
            ct.render(load("qwen3.jinja"), msgs)
        with pytest.raises(NotImplementedError, match="tools"):
            model.apply_chat_template(msgs, tools=[], engine="c")
        with pytest.raises(TypeError, match="builtin_tools"):
            model.apply_chat_template(msgs, engine="c", builtin_tools=["python"])
        with pytest.raises(ValueError, match="engine"):
            model.apply_chat_template(msgs, engine="minja")


def test_model_without_template(tiny_qwen):
    model = moeinfer.Model(tiny_qwen)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="no tokenizer.chat_template"):
        model.apply_chat_template(msgs)
    with pytest.raises(KeyError, match="tokenizer.chat_template"):
        model.apply_chat_template(msgs, engine="c")
    # A template given as text, or a renderer by name, needs no template in the file.
    assert model.apply_chat_template(msgs, chat_template=CHATML) == ct.render(CHATML, msgs)
    assert model.apply_chat_template(msgs, engine="c", template_name="chatml") == ct.render(CHATML, msgs)
