"""Context.generate and Context.chat: text generation over moe_generate (moeinfer.h, "Generation").

moe_generate runs the whole loop in C and streams pieces through a callback; to hand them out as a
Python generator, the call runs in a worker thread (it releases the GIL while computing) and the
pieces travel through a queue. Closing the generator early stops the generation at its next piece.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator, Mapping, Sequence

_DONE = object()


def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, sampler=None,
             stop: Iterable[str] | None = None, *, add_special: bool = True, render_special: bool = False
             ) -> Iterator[str]:
    """Generates after `prompt`, yielding the text piece by piece.

    prompt: text (tokenized with the model's tokenizer; add_special adds the BOS token the model asks
    for, and special-token text such as "<|im_start|>" becomes its token) or token ids. max_tokens:
    most tokens to generate (>= 0). sampler: a moeinfer.Sampler (its history receives the prompt tokens
    decoded and each generated token), or None for greedy decoding (the largest logit). stop: strings
    that end the generation where the text first contains one (not yielded; text that may begin one is
    held back until it is known not to). Generation also ends at an end-of-generation token of the
    vocabulary and when the context is full.

    The KV cache is reused: the part of the prompt that the context already holds (the previous
    prompt and generated text, as ids) is not decoded again. The generator's return value
    (StopIteration.value, or `result = yield from ...`) is a dict: tokens (the generated ids),
    n_prompt_reused, n_prompt_decoded, n_generated, stop_reason ("max_tokens", "eog", "stop",
    "callback", "context_full"), t_prompt_s, t_gen_s. Errors raise as Context.decode's do (ValueError
    for bad arguments, ...), from the generator.
    """
    if isinstance(prompt, str):
        ids = self.model.tokenize(prompt, add_special=add_special, parse_special=True)
    else:
        ids = [int(t) for t in prompt]
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0 (got {max_tokens})")
    stops = list(stop or [])
    pieces: queue.Queue = queue.Queue()
    cancelled = threading.Event()

    def on_piece(text: str) -> bool:
        if cancelled.is_set():
            return False
        pieces.put(text)
        return True

    def work() -> None:
        try:
            pieces.put((_DONE, self._generate(ids, sampler, max_tokens, stops, render_special, on_piece)))
        except BaseException as e:  # handed to the consumer, raised there
            pieces.put((_DONE, e))

    def run() -> Iterator[str]:
        worker = threading.Thread(target=work, name="moeinfer-generate", daemon=True)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if isinstance(item, tuple) and item[0] is _DONE:
                    if isinstance(item[1], BaseException):
                        raise item[1]
                    return item[1]
                yield item
        finally:
            cancelled.set()
            worker.join()

    return run()


def chat(self, messages: Iterable[Mapping[str, Any]], max_tokens: int = 128, sampler=None,
         stop: Iterable[str] | None = None, *, template_name: str | None = None, **template_options: Any
         ) -> Iterator[str]:
    """Answers a conversation: the messages ({"role", "content"} dicts) rendered with the model's chat
    template by the C renderer (Model.apply_chat_template(engine="c"); template_name picks a built-in
    one such as "chatml"; template_options are its enable_thinking, reasoning_effort, ...), with the
    assistant's turn opened, then generate() on that text. Yields the answer's pieces; the return value
    is generate()'s dict. Keep the conversation (append the answer as an assistant message and the next
    user message) and the next call decodes only what was added.
    """
    options = dict(template_options)
    if template_name is not None:
        options["template_name"] = template_name
    text = self.model.apply_chat_template(list(messages), add_generation_prompt=True, engine="c", **options)
    return generate(self, text, max_tokens=max_tokens, sampler=sampler, stop=stop, add_special=False)
