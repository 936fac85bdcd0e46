"""moeinfer-run, end to end on a tiny synthetic model: greedy output equals the manual decode + argmax
loop of the Python bindings, chat and interactive (-i, piped stdin) output equal Context.chat turn by turn
with the prefix reused, the speed line, and bad arguments give one line on stderr with exit status 2.

The binary is found through $MOEINFER_TOOLS_DIR, else the newest <repo>/build*/tools/moeinfer-run; every
test is skipped (with the reason) when there is none.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import moeinfer

REPO = Path(__file__).resolve().parents[2]
TOOL = "moeinfer-run"


def _find_tool() -> Path | None:
    env = os.environ.get("MOEINFER_TOOLS_DIR")
    if env:
        p = Path(env) / TOOL
        return p if p.is_file() else None
    found = [p for p in REPO.glob(f"build*/tools/{TOOL}") if p.is_file() and os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


BIN = _find_tool()
pytestmark = pytest.mark.skipif(BIN is None, reason=f"no {TOOL} binary (set MOEINFER_TOOLS_DIR or build tools)")

SPEED = re.compile(r"moeinfer-run: prompt (\d+) tokens \((\d+) reused\) in [0-9.]+ s, [0-9.]+ t/s \| "
                   r"generation (\d+) tokens in [0-9.]+ s, [0-9.]+ t/s \| (.+)")


class Result:
    """A run: stdout as bytes (random models write byte tokens that are not UTF-8), stderr as text."""

    def __init__(self, p: subprocess.CompletedProcess):
        self.returncode, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def tool(*args, stdin: str | None = None) -> Result:
    return Result(subprocess.run([str(BIN), *map(str, args)], input=None if stdin is None else stdin.encode(),
                                 capture_output=True, timeout=300))


def greedy_reference(model, prompt_ids, n):
    ctx = moeinfer.Context(model, n_ctx=256, n_threads=1, device="cpu")
    logits = ctx.decode(np.asarray(prompt_ids, np.int32))
    out = []
    while len(out) < n:
        tok = int(np.argmax(logits[-1]))
        if model.is_eog(tok):
            break
        out.append(tok)
        logits = ctx.decode([tok])
    return model.detokenize_bytes(out)


def test_greedy_equals_the_reference(tiny_model):
    model = moeinfer.Model(tiny_model)
    prompt = "Once upon a time"
    ref = greedy_reference(model, model.tokenize(prompt, parse_special=True), 10)
    r = tool("-m", tiny_model, "-p", prompt, "-n", 10, "--temp", 0, "--device", "cpu", "-t", 1, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ref + b"\n"
    m = SPEED.search(r.stderr)
    assert m, r.stderr
    assert int(m.group(1)) == len(model.tokenize(prompt)) and int(m.group(2)) == 0
    # -f reads the prompt from a file; the result is the same.
    f = tiny_model.parent / "prompt.txt"
    f.write_text(prompt)
    r2 = tool("-m", tiny_model, "-f", f, "-n", 10, "--temp", 0, "--device", "cpu", "--no-progress")
    assert r2.returncode == 0 and r2.stdout == r.stdout


def test_interactive_chat_equals_context_chat(tiny_qwen):
    model = moeinfer.Model(tiny_qwen)
    ctx = moeinfer.Context(model, n_ctx=512, n_threads=1, device="cpu")
    messages, answers = [], []
    for user in ["Hello there", "And then?"]:
        messages.append({"role": "user", "content": user})
        answer = "".join(ctx.chat(messages, max_tokens=6, template_name="chatml"))
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer})
    r = tool("-m", tiny_qwen, "-i", "--chat-template", "chatml", "-n", 6, "--temp", 0, "--device", "cpu",
             "-c", 512, "--no-progress", stdin="Hello there\n\nAnd then?\n")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode("utf-8", "replace").split("\n")
    assert out[0] == answers[0] and len(out) == 3 and out[2] == ""
    # The conversation keeps the answer as text: Python's holds U+FFFD where the model wrote bytes that are
    # not UTF-8, the tool's the bytes, so the second turns agree only when the first answer is valid text.
    if "\ufffd" not in answers[0]:
        assert out[1] == answers[1]
    speeds = SPEED.findall(r.stderr)
    assert len(speeds) == 2
    assert int(speeds[0][1]) == 0 and int(speeds[1][1]) > 0  # the second turn reuses the first's prefix
    # --chat with -p: one turn, as the first one above.
    r1 = tool("-m", tiny_qwen, "--chat", "--chat-template", "chatml", "-p", "Hello there", "-n", 6, "--temp", 0,
              "--device", "cpu", "--no-progress")
    assert r1.returncode == 0 and r1.stdout.decode("utf-8", "replace") == answers[0] + "\n"


def test_sampled_run_is_reproducible_with_a_seed(tiny_qwen):
    args = ["-m", tiny_qwen, "-p", "abc", "-n", 8, "--temp", 1.2, "--top-k", 0, "--seed", 7, "--repeat-penalty",
            1.1, "--device", "cpu", "--no-progress"]
    a, b = tool(*args), tool(*args)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_model_without_chat_template_says_so(tiny_qwen):
    r = tool("-m", tiny_qwen, "--chat", "-p", "hi", "--device", "cpu", "--no-progress")
    assert r.returncode == 1
    assert "chat template" in r.stderr and "--chat-template" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--bogus"], "unknown option '--bogus'"),
    (["-p", "x", "--temp", "warm"], "--temp"),
    (["-p", "x", "--top-p", "2"], "--top-p"),
    (["-p", "x", "-n", "-5"], "-n"),
    ([], "no prompt"),
    (["-p", "x", "-f", "y"], "either -p or -f"),
    (["-f", "/nonexistent/file"], "cannot read"),
    (["-p", "x", "--device", "cpu", "-ngl", "2"], "--n-gpu-layers"),
    (["-p", "x", "--sweep"], "unknown option '--sweep'"),
    (["-p", "x", "extra"], "unexpected argument"),
])
def test_bad_arguments_exit_2_with_one_line(tiny_qwen, args, needle):
    r = tool("-m", tiny_qwen, *args)
    assert r.returncode == 2, r.stderr
    assert r.stdout == b""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("moeinfer-run: ")


def test_help_lists_the_shared_and_own_flags():
    r = tool("--help")
    assert r.returncode == 0
    text = r.stdout.decode()
    for flag in ["--prompt", "--n-predict", "--chat", "--interactive", "--temp", "--top-k", "--top-p", "--min-p",
                 "--repeat-penalty", "--repeat-last-n", "--presence-penalty", "--frequency-penalty", "--seed",
                 "--override-tensor", "--n-cpu-moe", "--offload-policy", "--expert-copy", "--device", "--progress"]:
        assert flag in text, flag
