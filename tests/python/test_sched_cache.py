"""The expert cache (Policy.expert_cache), expert_copy "auto" and ACTIVE copies of the expert split's device
part, on the emulated device (a host-memory backend playing the GPU, computing with the CPU kernels).

What is checked, against what:
* Logits with the cache on against the same context with it off, bit for bit (np.array_equal): the kernels
  read the same bytes, from a cache entry or an upload slot. Over a prompt of several ubatches, then
  token-by-token decode, for full, active and auto copies, with and without the expert split.
* The cache's counts (stats() and expert_cache_layers()) against a prediction computed here from the router's
  choices (the per-ubatch deltas of expert_counts(): the experts each layer selected) and the documented
  policy: each use of an expert matrix reads the selected experts (active) or all of them (full); hits are those
  already in its entry. With a tiny budget, a simulation of the documented eviction (LFU aged per ubatch,
  strict win, lowest score then lowest entry evicted) predicts every hit and miss.
* The split's device part under active copies: it uploads exactly the selected experts of its group (before
  the fix it uploaded the whole group).

Random data is fresh on every run; MOEINFER_TEST_SEED=<seed> replays the prompts (the model seed is printed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import moeinfer
from test_sched_emulated import decode_ubatches, emulated, expert_bytes

ARCHS = ("qwen3moe", "gpt-oss")
# The expert matrices of a layer in the order the scheduler prepares them: MOE_UP_GATE's up (src0) and gate
# (src1), then MUL_MAT_ID's down.
MATRICES = ("ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight")


@pytest.fixture(scope="module", params=ARCHS)
def skewed(request, tmp_path_factory) -> moeinfer.Model:
    """A tiny model of each architecture with fresh random weights and skewed routing, so that small ubatches
    leave several experts unselected."""
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("cache") / f"{request.param}.gguf"
    moeinfer.synth_write(str(path), request.param, preset="tiny", seed=seed, routing_skew=0.6)
    return moeinfer.Model(str(path))


def matrix_bytes(model: moeinfer.Model) -> dict[str, int]:
    """Bytes of each expert matrix kind (the same in every layer of a synthetic model)."""
    sizes = {name: {t.n_bytes for t in model.tensors if t.name.endswith("." + name)} for name in MATRICES}
    assert all(len(s) == 1 for s in sizes.values()), sizes
    return {name: s.pop() for name, s in sizes.items()}


def policy(expert_copy: str, cache: int, split: int = 0, offload: str = "all=1") -> moeinfer.Policy:
    return moeinfer.Policy(expert_copy=expert_copy, expert_cache=cache, expert_split=split).parse_offload(offload)


def run_prompt_and_decode(ctx, prompt, steps) -> list[np.ndarray]:
    """The prompt's logits (several ubatches), then those of each decode step."""
    out = [ctx.decode(prompt, logits_all=True).copy()]
    for t in steps:
        out.append(ctx.decode(np.array([t], dtype=np.int32)).copy())
    return out


@pytest.mark.parametrize("expert_copy", ["full", "active", "auto"])
@pytest.mark.parametrize("split", [0, 2])
def test_cache_gives_the_logits_of_no_cache_bit_for_bit(skewed, rng, expert_copy, split):
    m = skewed
    on = emulated(m, policy(expert_copy, -1, split), n_ubatch=8, tensor_overrides="exps=CPU")
    off = emulated(m, policy(expert_copy, 0, split), n_ubatch=8, tensor_overrides="exps=CPU")
    prompt = rng.integers(0, m.info.n_vocab, size=21, dtype=np.int32)  # ubatches of 8, 8 and 5
    steps = rng.integers(0, m.info.n_vocab, size=6, dtype=np.int32)
    for got, want in zip(run_prompt_and_decode(on, prompt, steps), run_prompt_and_decode(off, prompt, steps)):
        assert np.array_equal(got, want)
    np.testing.assert_array_equal(on.expert_counts(), off.expert_counts())
    s_on, s_off = on.stats(), off.stats()
    assert s_on["n_cache_hits"] > 0 and s_on["bytes_cache_saved"] > 0
    assert s_off["n_cache_hits"] == s_off["n_cache_misses"] == s_off["bytes_cache_saved"] == 0
    # What the cache saved is what was not uploaded.
    sent = lambda s: s["bytes_weights_full"] + s["bytes_weights_experts"]  # noqa: E731
    assert sent(s_off) - sent(s_on) == s_on["bytes_cache_saved"]


def selected_per_ubatch(ctx, rng, n_vocab, sizes):
    """Per ubatch: [n_layer] sets of the experts the router selected (from the expert_counts deltas)."""
    return [[set(np.flatnonzero(row)) for row in delta] for _, delta in decode_ubatches(ctx, rng, n_vocab, sizes)]


@pytest.mark.parametrize("expert_copy", ["active", "full"])
def test_cache_hits_and_misses_as_predicted_from_the_router(skewed, rng, expert_copy):
    """A cache that holds every matrix: each use reads the selected experts (active) or all (full); those its
    entry already holds are hits, the others are uploaded into it (misses)."""
    m = skewed
    n_layer, n_expert = m.info.n_layer, m.info.n_expert
    eb = expert_bytes(m)
    per_layer = eb.up_gate + eb.down  # one expert of each matrix
    ctx = emulated(m, policy(expert_copy, -1), n_ubatch=4, tensor_overrides="exps=CPU")
    ctx.reset_stats()
    sizes = [4, 4, 1, 1, 3, 1, 4, 1]
    hits, misses, saved = np.zeros(n_layer, np.uint64), np.zeros(n_layer, np.uint64), np.zeros(n_layer, np.uint64)
    valid = [set() for _ in range(n_layer)]  # the experts in the layer's entries (the same for its 3 matrices)
    uploaded = skipped = readbacks = 0
    for n_tokens, selected in zip(sizes, selected_per_ubatch(ctx, rng, m.info.n_vocab, sizes)):
        for layer, s in enumerate(selected):
            # Active copies read the ids back, but for one token when the cache already holds every expert of the
            # layer: that step reads the matrices there whole (12ee562, Transfers::operand), whatever it chose.
            readbacks += expert_copy == "active" and not (n_tokens == 1 and len(valid[layer]) == n_expert)
            read = s if expert_copy == "active" else set(range(n_expert))
            h, new = len(read & valid[layer]), len(read - valid[layer])
            hits[layer] += len(MATRICES) * h
            misses[layer] += len(MATRICES) * new
            saved[layer] += h * per_layer
            uploaded += new * per_layer
            skipped += (n_expert - len(read)) * per_layer
            valid[layer] |= read
    got = ctx.expert_cache_layers()
    np.testing.assert_array_equal(got["hits"], hits)
    np.testing.assert_array_equal(got["misses"], misses)
    np.testing.assert_array_equal(got["bytes_saved"], saved)
    s = ctx.stats()
    assert (s["n_cache_hits"], s["n_cache_misses"], s["bytes_cache_saved"]) == (hits.sum(), misses.sum(), saved.sum())
    # Only the misses crossed (whole matrices on a full entry's first use, expert runs otherwise; gpt-oss's
    # expert biases are duplicated on the device by default, so they do not travel).
    assert s["bytes_weights_full"] + s["bytes_weights_experts"] == uploaded
    assert s["bytes_weights_skipped"] == skipped
    assert s["n_id_readbacks"] == readbacks
    if expert_copy == "active":
        assert skipped > 0, "every expert selected: the test would not see an unselected one"
    ctx.reset_stats()
    zero = ctx.expert_cache_layers()
    assert all(not a.any() and a.shape == (n_layer,) for a in zero.values())


class LfuCache:
    """The documented eviction policy (sched/expert_cache.h), written again with the same arithmetic: a matrix's
    score in a ubatch is the expert bytes it asked for in the ubatches before, those of k ubatches ago halved k
    times; a matrix takes a free entry, else the entry of the lowest-scored resident (the first on ties) if its
    own score is strictly higher."""

    def __init__(self, entries: int):
        self.entries: list[str | None] = [None] * entries
        self.valid: list[set[int]] = [set() for _ in range(entries)]
        self.asked: dict[str, list] = {}  # matrix -> [past, current, ubatch of its last use]
        self.ubatch = 0
        self.evictions = 0

    def score(self, key: str) -> float:
        if key not in self.asked:
            return 0.0
        past, current, ubatch = self.asked[key]
        if ubatch == self.ubatch:
            return past
        age = self.ubatch - ubatch
        return 0.0 if age >= 1024 else math.ldexp(past + current, -age)

    def use(self, key: str, requested: int, busy: set[int]) -> int | None:
        own = self.score(key)
        if key not in self.asked or self.asked[key][2] != self.ubatch:
            self.asked[key] = [own, 0.0, self.ubatch]
        self.asked[key][1] += float(requested)
        if key in self.entries:
            return self.entries.index(key)
        victim, victim_score = None, 0.0
        for e, k in enumerate(self.entries):
            if e in busy:
                continue
            if k is None:
                victim = e
                break
            s = self.score(k)
            if victim is None or s < victim_score:
                victim, victim_score = e, s
        if victim is None:
            return None
        if self.entries[victim] is not None:
            if victim_score >= own:
                return None
            self.evictions += 1
        self.entries[victim] = key
        self.valid[victim] = set()
        return victim


def test_tiny_cache_evicts_as_documented(skewed, rng):
    """Two entries for 3 * n_layer matrices, active copies: which matrices stay, and so every hit and miss,
    follow from the router's choices and the documented policy. Ubatches run until a few evictions were seen
    (skewed routing makes the layers ask for different numbers of experts)."""
    m = skewed
    n_layer, n_expert = m.info.n_layer, m.info.n_expert
    sizes_of = matrix_bytes(m)
    largest = max(sizes_of.values())
    per_expert = {name: b // n_expert for name, b in sizes_of.items()}
    kw = dict(n_ubatch=4, n_ctx=1024, tensor_overrides="exps=CPU")
    ctx = emulated(m, policy("active", 2 * largest + largest // 2), **kw)
    cold = emulated(m, policy("active", 0), **kw)
    sizes = [4, 1, 1, 4, 2, 1, 3, 1]
    sim = LfuCache(2)
    hits, misses = np.zeros(n_layer, np.uint64), np.zeros(n_layer, np.uint64)
    before = ctx.expert_counts()
    for i in range(96):
        if sim.evictions >= 3 and i >= 12:
            break
        tokens = rng.integers(0, m.info.n_vocab, size=sizes[i % len(sizes)], dtype=np.int32)
        assert np.array_equal(ctx.decode(tokens, logits_all=True), cold.decode(tokens, logits_all=True))
        after = ctx.expert_counts()
        sim.ubatch += 1
        for layer in range(n_layer):
            read = set(np.flatnonzero(after[layer] - before[layer]))
            busy: set[int] = set()
            for name in MATRICES:
                if name == "ffn_down_exps.weight":
                    busy = set()  # a node of its own
                e = sim.use(f"{layer}.{name}", len(read) * per_expert[name], busy)
                if e is None:
                    misses[layer] += len(read)
                    continue
                busy.add(e)
                hits[layer] += len(read & sim.valid[e])
                misses[layer] += len(read - sim.valid[e])
                sim.valid[e] |= read
        before = after
    got = ctx.expert_cache_layers()
    np.testing.assert_array_equal(got["hits"], hits)
    np.testing.assert_array_equal(got["misses"], misses)
    assert hits.sum() > 0
    assert sim.evictions >= 3, "too few evictions: the test would not see the policy evict"


def test_split_device_part_uploads_only_its_selected_experts(skewed, rng):
    """expert_split=2 with active copies: the device part of each split layer uploads the experts of its group
    that the router selected, not its whole group. Ubatches of 4 tokens (fewer than n_expert) give the
    splitter no counts to learn from, so its host group is experts 0 and 1 (the first of equal expectations)."""
    m = skewed
    n_layer, n_expert = m.info.n_layer, m.info.n_expert
    assert 4 < n_expert
    eb = expert_bytes(m)
    cpu = moeinfer.Context(m, device="cpu", n_ctx=128, n_ubatch=4)
    emu = emulated(m, policy("active", 0, split=2, offload="all=3"), n_ubatch=4, tensor_overrides="exps=CPU")
    sizes = [4, 2, 4, 4, 1, 4]
    want_experts = split_layers = 0
    before = emu.expert_counts()
    for n in sizes:
        tokens = rng.integers(0, m.info.n_vocab, size=n, dtype=np.int32)
        got, want = emu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True)
        err = np.max(np.abs(got - want), axis=1) / np.max(np.abs(want), axis=1)
        assert np.all(err <= 1e-4), err.max()  # see test_sched_emulated.py for the bound
        after = emu.expert_counts()
        if n >= 3:
            for layer in range(n_layer):
                device_selected = set(np.flatnonzero(after[layer] - before[layer])) - {0, 1}
                want_experts += len(device_selected) * (eb.up_gate + eb.down)
                split_layers += 1
        before = after
    s = emu.stats()
    assert s["n_split_layers"] == split_layers and s["n_split_host_experts"] == 2 * split_layers
    assert s["bytes_weights_experts"] == want_experts
    assert s["bytes_weights_skipped"] == split_layers * n_expert * (eb.up_gate + eb.down) - want_experts
    assert want_experts < split_layers * (n_expert - 2) * (eb.up_gate + eb.down), \
        "every device expert selected: the test would not tell the group from the selection"
    # One readback of the device part's ids per split layer (shared by up/gate and down).
    assert s["n_id_readbacks"] == split_layers


@pytest.mark.parametrize("n,active", [(1, True), (7, True), (8, False), (12, False)])
def test_auto_copies_active_below_two_pairs_per_expert(skewed, rng, n, active):
    """expert_copy "auto": active while n_tokens * n_expert_used < 2 * n_expert, full from there on."""
    m = skewed
    assert (n * m.info.n_expert_used < 2 * m.info.n_expert) == active  # the tiny preset: 8 experts, 2 used
    ctx = emulated(m, policy("auto", 0), n_ubatch=16, tensor_overrides="exps=CPU")
    ctx.decode(rng.integers(0, m.info.n_vocab, size=n, dtype=np.int32))
    s = ctx.stats()
    assert (s["n_id_readbacks"] > 0) == active
    assert (s["bytes_weights_experts"] > 0) == active
    assert s["n_offloaded"]["moe_up_gate"] == m.info.n_layer


def test_policy_expert_cache_and_auto_round_trip(skewed):
    p = moeinfer.Policy()
    assert p.expert_copy == "auto" and p.expert_cache == -1
    ctx = emulated(skewed, moeinfer.Policy(expert_cache=0, expert_copy="auto"), tensor_overrides="exps=CPU")
    assert ctx.policy.expert_cache == 0 and ctx.policy.expert_copy == "auto"
    with pytest.raises(ValueError, match="expert_cache"):
        moeinfer.Policy(expert_cache=-2)
    # An explicit cache smaller than one expert matrix is refused, naming the field.
    largest = max(matrix_bytes(skewed).values())
    with pytest.raises(ValueError, match="expert_cache"):
        emulated(skewed, moeinfer.Policy(expert_cache=largest - 1), tensor_overrides="exps=CPU")
    with pytest.raises(ValueError, match="expert_cache"):
        ctx.set_policy(moeinfer.Policy(expert_cache=largest - 1))
    assert ctx.policy.expert_cache == 0


@pytest.fixture(scope="module")
def skewed_cuda_shape(tmp_path_factory) -> moeinfer.Model:
    """qwen3moe with skewed routing and head_dim 64 (the tiny preset's 16 is below the CUDA attention kernels)."""
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("cache") / "qwen3moe-hd64.gguf"
    moeinfer.synth_write(str(path), "qwen3moe", preset="tiny", seed=seed, routing_skew=0.6, head_dim=64)
    return moeinfer.Model(str(path))


@pytest.mark.parametrize("expert_copy", ["full", "active", "auto"])
def test_cache_on_cuda_gives_the_logits_of_no_cache_bit_for_bit(skewed_cuda_shape, rng, expert_copy):
    """The same on the GPU: cache entries are device buffers filled by copies ordered after their last readers;
    the kernels read the same bytes from an entry as from an upload slot. Hits and misses as predicted."""
    from test_forward_cuda import _cuda_context

    m = skewed_cuda_shape
    kw = dict(n_ctx=128, n_ubatch=8, tensor_overrides="exps=CPU")
    on = _cuda_context(m, policy=policy(expert_copy, -1), **kw)
    off = _cuda_context(m, policy=policy(expert_copy, 0), **kw)
    prompt = rng.integers(0, m.info.n_vocab, size=21, dtype=np.int32)
    steps = rng.integers(0, m.info.n_vocab, size=6, dtype=np.int32)
    for got, want in zip(run_prompt_and_decode(on, prompt, steps), run_prompt_and_decode(off, prompt, steps)):
        assert np.array_equal(got, want)
    np.testing.assert_array_equal(on.expert_counts(), off.expert_counts())
    s_on, s_off = on.stats(), off.stats()
    sent = lambda s: s["bytes_weights_full"] + s["bytes_weights_experts"]  # noqa: E731
    assert s_on["n_cache_hits"] > 0 and sent(s_off) - sent(s_on) == s_on["bytes_cache_saved"]


@pytest.mark.parametrize("expert_copy", ["full", "auto"])
def test_decode_reads_matrices_the_cache_holds_whole_on_the_device(skewed, rng, expert_copy):
    """A prompt's ubatches of 8 (offloaded; whole copies, "auto" included at 8 tokens) leave every expert matrix
    whole in the cache. A one-token decode step then runs its expert ops on the device from the cache although the
    offload threshold (5 tokens) keeps one token on the host: nothing crosses PCIe, no ids are read back, the hits
    are the experts it reads (every one under whole copies, the token's k under "auto", which copies the selected
    experts of small ubatches), and the logits are a cache-off context's bit for bit. Emptying the cache (a new
    policy) sends decode back to the host."""
    m = skewed
    n_moe, n_expert, k = m.info.n_layer, m.info.n_expert, m.info.n_expert_used
    sizes = matrix_bytes(m)
    on = emulated(m, policy(expert_copy, -1, offload="all=5"), n_ubatch=8, tensor_overrides="exps=CPU")
    off = emulated(m, policy(expert_copy, 0, offload="all=5"), n_ubatch=8, tensor_overrides="exps=CPU")
    prompt = rng.integers(0, m.info.n_vocab, size=16, dtype=np.int32)
    assert np.array_equal(on.decode(prompt, logits_all=True), off.decode(prompt, logits_all=True))
    assert on.stats()["n_offloaded"]["mul_mat_id"] == 2 * n_moe

    for step in range(3):
        if step == 2:
            on.set_policy(on.policy)  # empties the cache
        on.reset_stats()
        tok = rng.integers(0, m.info.n_vocab, size=1, dtype=np.int32)
        assert np.array_equal(on.decode(tok), off.decode(tok))
        s = on.stats()
        on_device = step < 2
        for op in ("mul_mat_id", "moe_up_gate"):
            assert s["n_offloaded"][op] == (n_moe if on_device else 0), (step, op, s)
            assert s["n_kept_host"][op] == (0 if on_device else n_moe), (step, op, s)
        assert s["bytes_weights_full"] + s["bytes_weights_experts"] == 0, s
        read = n_expert if expert_copy == "full" else k
        assert s["n_cache_hits"] == (3 * n_moe * read if on_device else 0), s
        assert s["n_cache_misses"] == 0
        assert s["bytes_cache_saved"] == (n_moe * read * sum(sizes.values()) // n_expert if on_device else 0), s
        if on_device:
            assert s["n_id_readbacks"] == 0, s
