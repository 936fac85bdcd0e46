"""Chat templates: a conversation to the prompt text a model was trained on.

Two engines:

* ``render`` runs a template's jinja text with jinja2 exactly as Hugging Face's
  ``apply_chat_template`` does, so any model's template works, tools included: a sandboxed
  environment (ImmutableSandboxedEnvironment) with trim_blocks and lstrip_blocks, the loop-control
  extension and the ``{% generation %}`` tag, Hugging Face's ``tojson`` filter (ensure_ascii=False,
  indent, separators, sort_keys, no HTML escaping), the globals ``raise_exception``,
  ``strftime_now``, a plain ``dict`` and a ``namespace`` that refuses underscore names; messages
  lose keys whose value is None and a message's reasoning is offered under every name templates
  read (reasoning_content and thinking).
* ``render_builtin`` calls the C library's built-in renderers (moe_chat_apply_template), which
  reproduce the families moeinfer runs (chatml, qwen3, gpt-oss, deepseek-v3, deepseek-r1, glm4.5)
  for plain system / user / assistant messages, without jinja2.

``Model.apply_chat_template`` reads the model's own ``tokenizer.chat_template`` (or a named
``tokenizer.chat_template.NAME``) and fills ``bos_token``, ``eos_token``, ... from its vocabulary::

    prompt = model.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = model.tokenize(prompt, add_special=False, parse_special=True)
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from typing import Any, Iterable, Mapping

from . import _moeinfer

__all__ = ["render", "render_builtin", "detect", "apply_chat_template", "BUILTIN_NAMES"]

BUILTIN_NAMES = ("chatml", "qwen3", "gpt-oss", "deepseek-v3", "deepseek-r1", "glm4.5")

# Names a message's reasoning is passed under; the first is the one most templates read, gpt-oss reads
# "thinking" (Hugging Face fills both from whichever is given).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# GGUF metadata of the special tokens Hugging Face passes to templates (special_tokens_map).
_SPECIAL_TOKEN_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "sep_token": "tokenizer.ggml.seperator_token_id",  # sic: llama.cpp's spelling
    "pad_token": "tokenizer.ggml.padding_token_id",
    "cls_token": "tokenizer.ggml.cls_token_id",
    "mask_token": "tokenizer.ggml.mask_token_id",
}

# Keyword arguments the C renderers understand (moe_chat_params).
_BUILTIN_OPTIONS = ("enable_thinking", "reasoning_effort", "model_identity", "date", "bos_token")


@functools.lru_cache(maxsize=32)
def _compile(template: str):
    """The template compiled in Hugging Face's environment (cached by text, as Hugging Face does)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        import jinja2.utils
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError("moeinfer.chat_template.render needs jinja2 >= 3.1.6 (pip install jinja2)") from e
    if tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit()) < (3, 1, 6):
        # Earlier versions have known sandbox escapes, and templates come from model files.
        raise ImportError(f"moeinfer.chat_template.render needs jinja2 >= 3.1.6, found {jinja2.__version__}")

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; rendering
        keeps its body as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Hugging Face's: no HTML escaping (jinja2's own tojson escapes <, >, &, ').
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    class TemplateDict:
        # dict() and dict.fromkeys() only: no attribute access to the dict type itself.
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # noqa: N805 - jinja2's signature trick, so namespace(self=...) works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types: the sandbox then sees no methods of the caller's objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (OpenAI SDK messages)
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalize(messages: Iterable[Any]) -> list[dict]:
    """Messages as Hugging Face hands them to templates: plain dicts without None values, the
    reasoning under each name templates read."""
    out = []
    for i, message in enumerate(_plain(list(messages))):
        if not isinstance(message, dict):
            raise TypeError(f"messages[{i}] is a {type(message).__name__}, not a dict with 'role' and 'content'")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    if not out:
        raise ValueError("the conversation is empty: give at least one message")
    return out


def render(template: str, messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = False,
           tools: list[Mapping[str, Any]] | None = None, documents: list[Mapping[str, Any]] | None = None,
           **kwargs: Any) -> str:
    """Renders `template` (a chat template's jinja text) for `messages` as Hugging Face does.

    messages: dicts with "role" and "content" (and whatever else the template reads: tool_calls,
    reasoning_content / thinking, ...). tools: JSON schemas (dicts), passed as `tools`. Other keyword
    arguments become template variables (bos_token, enable_thinking, reasoning_effort, ...).
    jinja2.TemplateError when the template refuses the input (its raise_exception), ValueError for an
    empty conversation.
    """
    if not isinstance(template, str):
        raise TypeError(f"template must be str, not {type(template).__name__}")
    if tools is not None:
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise TypeError(f"tools[{i}] is a {type(tool).__name__}: pass tools as JSON schema dicts")
    if documents is not None:
        for i, doc in enumerate(documents):
            if not isinstance(doc, Mapping):
                raise TypeError(f"documents[{i}] is a {type(doc).__name__}, not a dict with 'title' and 'text'")
    compiled = _compile(template)
    return compiled.render(messages=_normalize(messages), tools=_plain(tools), documents=_plain(documents),
                           add_generation_prompt=add_generation_prompt, **_plain(kwargs))


def detect(template: str) -> str:
    """The built-in renderer `template` selects ("qwen3", "gpt-oss", ...); NotImplementedError naming
    the families when none matches."""
    return _moeinfer.chat_template_detect(template)


def render_builtin(messages: Iterable[Mapping[str, Any]], template: str | None = None, *, model=None,
                   name: str | None = None, add_generation_prompt: bool = False, enable_thinking: bool | None = None,
                   reasoning_effort: str | None = None, model_identity: str | None = None, date: str | None = None,
                   bos_token: str | None = None) -> str:
    """Renders with the C library's built-in renderer (moe_chat_apply_template).

    The renderer is `name` (one of BUILTIN_NAMES), else the one `template` selects, else the one the
    model's tokenizer.chat_template selects. messages: dicts with "role" ("system", "user",
    "assistant"; "developer" first for gpt-oss) and "content", optionally the reasoning
    (reasoning_content / thinking / reasoning). None of the options given leaves the template
    variable undefined, as the jinja2 path does; date defaults to today (gpt-oss), bos_token to the
    model's BOS text (DeepSeek). NotImplementedError when no built-in renderer matches the template,
    ValueError for a role they do not write (tools: use render()).
    """
    rows = []
    for i, m in enumerate(_normalize(messages)):
        if "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] needs 'role' and 'content'")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}]['content'] is a {type(m['content']).__name__}: the built-in renderers "
                             "take text content only (render() handles content parts)")
        if "tool_calls" in m:
            raise ValueError(f"messages[{i}] has tool_calls: the built-in renderers do not write tool calls "
                             "(use render())")
        reasoning = m.get("reasoning_content")
        rows.append((str(m["role"]), m["content"], None if reasoning is None else str(reasoning)))
    return _moeinfer.chat_render_builtin(rows, template, model, add_generation_prompt, name, enable_thinking,
                                         reasoning_effort, model_identity, date, bos_token)


def _special_tokens(model) -> dict[str, str]:
    """bos_token, eos_token, ... as text, for the tokens the model's vocabulary names."""
    out = {}
    for name, key in _SPECIAL_TOKEN_KEYS.items():
        try:
            token = model.meta(key)
        except KeyError:
            continue
        if isinstance(token, int) and 0 <= token < model.vocab["n_tokens"]:
            out[name] = model.token_to_piece(token, render_special=True).decode("utf-8", "replace")
    return out


def _model_templates(model) -> dict[str, str]:
    """The model's templates: "default" (tokenizer.chat_template) and each tokenizer.chat_template.NAME."""
    out = {}
    try:
        out["default"] = model.meta("tokenizer.chat_template")
    except KeyError:
        pass
    try:
        names = model.meta("tokenizer.chat_templates")
    except KeyError:
        names = []
    for name in names if isinstance(names, list) else []:
        try:
            out[name] = model.meta(f"tokenizer.chat_template.{name}")
        except KeyError:
            continue
    return out


def _select_template(model, chat_template: str | None, tools) -> str:
    """Hugging Face's choice: a named template when `chat_template` names one, the "tool_use" one when
    tools are given and it exists, else the default; `chat_template` itself when it is template text."""
    templates = _model_templates(model)
    if chat_template is not None:
        return templates.get(chat_template, chat_template)
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ValueError("the model has no tokenizer.chat_template; pass chat_template= (a template text"
                     + (", or one of " + ", ".join(sorted(templates)) if templates else "") + ")")


def apply_chat_template(model, messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = False,
                        tools: list[Mapping[str, Any]] | None = None, chat_template: str | None = None,
                        engine: str = "jinja", **kwargs: Any) -> str:
    """The prompt text of `messages` by the model's chat template (see Model.apply_chat_template)."""
    if engine == "jinja":
        template = _select_template(model, chat_template, tools)
        variables = {**_special_tokens(model), **kwargs}  # explicit arguments win, as in Hugging Face
        return render(template, messages, add_generation_prompt=add_generation_prompt, tools=tools, **variables)
    if engine == "c":
        if tools is not None:
            raise NotImplementedError("engine='c': the built-in renderers do not write tools (use engine='jinja')")
        unknown = sorted(set(kwargs) - set(_BUILTIN_OPTIONS) - {"template_name"})
        if unknown:
            raise TypeError(f"engine='c' does not take {', '.join(unknown)} (it takes "
                            f"{', '.join(_BUILTIN_OPTIONS)}, template_name)")
        name = kwargs.pop("template_name", None)
        template = None
        if name is None and chat_template is not None:
            template = _select_template(model, chat_template, None)
        return render_builtin(messages, template, model=model, name=name,
                              add_generation_prompt=add_generation_prompt, **kwargs)
    raise ValueError(f"engine must be 'jinja' or 'c', not {engine!r}")


def _model_method(self, messages, add_generation_prompt=False, tools=None, chat_template=None, engine="jinja",
                  **kwargs):
    return apply_chat_template(self, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                               chat_template=chat_template, engine=engine, **kwargs)


_model_method.__name__ = "apply_chat_template"
_model_method.__doc__ = """The prompt text of `messages` by the model's own chat template.

engine="jinja" (default): the template (tokenizer.chat_template, or `chat_template`: the name of a
tokenizer.chat_template.NAME of the model, or a template text) rendered with jinja2 as Hugging Face's
apply_chat_template does (see moeinfer.chat_template.render), with bos_token / eos_token / unk_token /
sep_token / pad_token / cls_token / mask_token from the vocabulary; keyword arguments become template
variables (enable_thinking=False, reasoning_effort="high", ...). Tools are JSON schema dicts.

engine="c": the C library's built-in renderer for the template's family (no jinja2; plain system /
user / assistant messages; options enable_thinking, reasoning_effort, model_identity, date, bos_token,
template_name to choose the family when detection fails).

Tokenize the result with add_special=False, parse_special=True: the template writes BOS and the turn
markers itself.
"""
