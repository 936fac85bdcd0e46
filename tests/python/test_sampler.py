"""moeinfer.Sampler against a numpy float64 reference of each stage, on fresh random logits.

The reference follows the semantics documented in moeinfer.h ("Sampling"), written independently of the
C++ code: penalties, logit bias, top-k, top-p, min-p, temperature, and the draw (an inverse-CDF walk in
ascending id order with u from a pure-Python mt19937_64, checked here against the C++ standard's value).

Tolerances: the surviving candidate set must be equal; probabilities (float32 out of the library)
within rtol 1e-5 / atol 1e-6 of float64; greedy choices and seeded draws exactly equal. A random case
whose top-p mass or min-p logit lies within 1e-9 of its threshold is drawn again, since summation order
may then rightly decide either way (in practice this never happens).
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

import moeinfer

NEUTRAL = dict(
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    min_keep=0,
    repeat_last_n=64,
    repeat_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
)
RTOL, ATOL = 1e-5, 1e-6
EDGE = 1e-9  # a top-p mass or min-p logit this close to its threshold: float64 summation order may decide


class Ambiguous(Exception):
    """The reference cannot decide this case robustly (a value within rounding of a threshold)."""


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def reference(logits, history=(), logit_bias=None, **kw):
    """(ids, probs) left after the chain, ids ascending; raises Ambiguous near a threshold."""
    f32 = np.float32
    # The parameters as the library sees them: float fields are float32 (0.999 is 0.99900001287...).
    p = {k: float(f32(v)) if isinstance(v, float) else v for k, v in {**NEUTRAL, **kw}.items()}
    # Penalties and bias in float32, as the library applies them to float logits (IEEE float32 operations
    # round the same everywhere); every later stage in float64.
    lg = logits.astype(f32).copy()
    n = p["repeat_last_n"]
    window = list(history) if n < 0 else list(history)[-n:] if n > 0 else []
    for tok, c in collections.Counter(window).items():
        lg[tok] = lg[tok] / f32(p["repeat_penalty"]) if lg[tok] > 0 else lg[tok] * f32(p["repeat_penalty"])
        lg[tok] -= f32(c) * f32(p["frequency_penalty"]) + f32(p["presence_penalty"])
    for tok, b in (logit_bias or {}).items():
        lg[tok] += f32(b)
    lg = lg.astype(np.float64)
    ids = np.nonzero(lg != -np.inf)[0]
    if p["temperature"] <= 0:
        best = ids[np.argmax(lg[ids])]  # argmax: the first (lowest id) of equal maxima
        return np.array([best]), np.array([1.0])
    order = ids[np.lexsort((ids, -lg[ids]))]  # descending logit, ascending id
    if 0 < p["top_k"] < len(order):
        order = order[: p["top_k"]]
    if p["top_p"] < 1:
        cum = np.cumsum(softmax(lg[order]))
        m = max(int(np.argmax(cum >= p["top_p"])) + 1 if cum[-1] >= p["top_p"] else len(order), p["min_keep"], 1)
        if np.any(np.abs(cum[max(m - 2, 0) : m] - p["top_p"]) < EDGE):
            raise Ambiguous("top-p mass at the threshold")
        order = order[:m]
    if p["min_p"] > 0:
        thr = lg[order].max() + math.log(p["min_p"])
        gap = np.abs(lg[order] - thr)
        if np.any((gap > 0) & (gap < EDGE)):  # 0: exactly at it (the maximum, for min_p = 1), kept by both
            raise Ambiguous("min-p ratio at the threshold")
        keep = lg[order] >= thr
        order = order[keep] if keep.sum() >= p["min_keep"] else order[: p["min_keep"]]
    probs = softmax(lg[order] / p["temperature"])
    by_id = np.argsort(order)
    return order[by_id], probs[by_id]


def random_logits(rng, n_vocab, scale=3.0):
    return (rng.standard_normal(n_vocab) * scale).astype(np.float32)


def check_chain(rng, n_vocab, history=(), logit_bias=None, **kw):
    """Sampler.apply on fresh logits equals the reference (redrawing ambiguous cases)."""
    params = {**NEUTRAL, **kw}
    for _ in range(20):
        logits = random_logits(rng, n_vocab)
        try:
            want_ids, want_probs = reference(logits, history, logit_bias, **params)
        except Ambiguous:
            continue
        smpl = moeinfer.Sampler(n_vocab, logit_bias=logit_bias, seed=1, **params)
        smpl.accept(list(history))
        ids, probs = smpl.apply(logits)
        assert ids.dtype == np.int32 and probs.dtype == np.float32
        # Most probable first; equal probabilities by ascending id.
        assert np.all(np.diff(probs) <= 0)
        by_id = np.argsort(ids)
        np.testing.assert_array_equal(ids[by_id], want_ids)
        np.testing.assert_allclose(probs[by_id], want_probs, rtol=RTOL, atol=ATOL)
        assert abs(float(probs.astype(np.float64).sum()) - 1.0) < 1e-5
        return ids, probs
    pytest.fail("20 random cases in a row sat on a threshold")


@pytest.mark.parametrize("top_k", [1, 2, 40, 999, 1000, 5000])
def test_top_k(rng, top_k):
    ids, _ = check_chain(rng, 1000, top_k=top_k)
    assert len(ids) == min(top_k, 1000)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("n_vocab", [300, 151936])  # the large one grows the ranked prefix many times
def test_top_p(rng, top_p, n_vocab):
    check_chain(rng, n_vocab, top_p=top_p)


@pytest.mark.parametrize("min_p", [0.01, 0.2, 0.9, 1.0])
@pytest.mark.parametrize("min_keep", [0, 5])
def test_min_p(rng, min_p, min_keep):
    check_chain(rng, 800, min_p=min_p, min_keep=min_keep)


def test_min_keep_holds_top_p_open(rng):
    ids, _ = check_chain(rng, 500, top_p=0.01, min_keep=7)
    assert len(ids) == 7


@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_temperature(rng, temperature):
    check_chain(rng, 600, temperature=temperature)


@pytest.mark.parametrize("repeat_last_n", [0, 1, 16, 64, -1])
def test_penalties(rng, repeat_last_n):
    # Repeats of few tokens, so that counts above 1 and both logit signs occur.
    history = rng.integers(0, 40, size=120).tolist()
    check_chain(
        rng,
        400,
        history,
        repeat_last_n=repeat_last_n,
        repeat_penalty=1.7,
        frequency_penalty=0.4,
        presence_penalty=0.9,
    )


def test_logit_bias_adds_and_bans(rng):
    bias = {3: 2.5, 17: -1.25, 250: float("-inf"), 0: float("-inf")}
    ids, _ = check_chain(rng, 300, logit_bias=bias)
    assert 250 not in ids and 0 not in ids


def test_full_chain(rng):
    history = rng.integers(0, 100, size=200).tolist()
    bias = {int(t): float(b) for t, b in zip(rng.integers(0, 4000, 20), rng.normal(0, 2, 20))}
    check_chain(
        rng,
        4000,
        history,
        bias,
        temperature=0.7,
        top_k=60,
        top_p=0.9,
        min_p=0.02,
        repeat_last_n=32,
        repeat_penalty=1.3,
        frequency_penalty=0.2,
        presence_penalty=0.3,
    )


def test_library_defaults_are_documented_ones(rng):
    smpl = moeinfer.Sampler(50)
    for name, value in dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_last_n=64).items():
        assert f"{name}={value!r}" in repr(smpl)
    check_chain(rng, 2000, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_greedy_is_the_argmax_after_penalties_and_bias(rng, temperature):
    for _ in range(20):
        logits = random_logits(rng, 1000)
        history = rng.integers(0, 1000, size=30).tolist()
        top = int(np.argmax(logits))
        bias = {top: float("-inf"), int(rng.integers(0, 1000)): 1.5}
        kw = dict(temperature=temperature, repeat_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25)
        want, _ = reference(logits, history, bias, **kw)
        filters = dict(top_k=3, top_p=0.5, min_p=0.3)  # they cannot change a greedy choice
        smpl = moeinfer.Sampler(1000, logit_bias=bias, **{**NEUTRAL, **kw, **filters})
        smpl.accept(history)
        assert smpl.sample(logits) == want[0]
        ids, probs = smpl.apply(logits)
        assert ids.tolist() == [want[0]] and probs.tolist() == [1.0]


def test_greedy_picks_the_lowest_id_among_equal_maxima():
    logits = np.zeros(10, np.float32)
    logits[[7, 4, 9]] = 2.0
    assert moeinfer.Sampler(10, temperature=0).sample(logits) == 4


class MT19937_64:
    """std::mt19937_64 as the C++ standard defines it ([rand.predef]), in pure Python."""

    MASK = (1 << 64) - 1

    def __init__(self, seed: int):
        self.mt = [seed & self.MASK]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.MASK)
        self.i = 312

    def __call__(self) -> int:
        mt = self.mt
        if self.i == 312:
            for k in range(312):
                x = (mt[k] & 0xFFFFFFFF80000000) | (mt[(k + 1) % 312] & 0x7FFFFFFF)
                mt[k] = mt[(k + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.i = 0
        x = mt[self.i]
        self.i += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & self.MASK


def test_python_mt19937_64_matches_the_standard():
    gen = MT19937_64(5489)  # the default seed; the standard gives the 10000th output
    for _ in range(9999):
        gen()
    assert gen() == 9981545732273789042


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**64 - 2])
def test_draws_follow_the_documented_prng(rng, seed):
    """Each draw: u = (next mt19937_64 output >> 11) / 2^53; the first id (ascending) whose running
    probability sum exceeds u."""
    n_vocab = 500
    kw = dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.01)
    smpl = moeinfer.Sampler(n_vocab, seed=seed, **{**NEUTRAL, **kw})
    gen = MT19937_64(seed)
    for step in range(64):
        logits = random_logits(rng, n_vocab)
        try:
            ids, probs = reference(logits, **kw)
        except Ambiguous:
            # The sampler still draws (taking one output); keep the Python generator in step.
            smpl.sample(logits)
            gen()
            continue
        u = (gen() >> 11) / 2.0**53
        cum = np.cumsum(probs)
        want = int(ids[min(int(np.searchsorted(cum, u * cum[-1], side="right")), len(ids) - 1)])
        assert smpl.sample(logits) == want, f"draw {step}"


def test_same_seed_same_tokens_and_reset_replays(rng):
    logits = [random_logits(rng, 1000, scale=1.0) for _ in range(100)]

    def run(smpl):
        out = []
        for lg in logits:
            t = smpl.sample(lg)
            smpl.accept(t)
            out.append(t)
        return out

    kw = dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.2)
    a = moeinfer.Sampler(1000, seed=42, **kw)
    first = run(a)
    assert run(moeinfer.Sampler(1000, seed=42, **kw)) == first
    assert run(a) != first  # the PRNG and the history moved on
    a.reset()
    assert run(a) == first
    assert run(moeinfer.Sampler(1000, seed=43, **kw)) != first


def test_random_seed_is_reported_and_reproduces(rng):
    a = moeinfer.Sampler(300)
    assert a.seed != 2**64 - 1
    assert moeinfer.Sampler(300).seed != a.seed
    b = moeinfer.Sampler(300, seed=a.seed)
    for _ in range(30):
        lg = random_logits(rng, 300, scale=0.5)
        assert a.sample(lg) == b.sample(lg)


def test_apply_does_not_move_the_prng(rng):
    lg = random_logits(rng, 300, scale=0.5)
    a, b = moeinfer.Sampler(300, seed=9), moeinfer.Sampler(300, seed=9)
    for _ in range(5):
        a.apply(lg)
    assert [a.sample(lg) for _ in range(20)] == [b.sample(lg) for _ in range(20)]


def test_draws_follow_the_final_distribution(rng):
    """Chi-square goodness of fit of 40000 draws (fixed seed) against the reference probabilities.

    Threshold: the chi-square critical value at p = 1e-6 for df = k - 1 (Wilson-Hilferty approximation,
    z = 4.753), so a correct sampler fails about once in a million runs."""
    kw = dict(temperature=0.8, top_k=12)
    logits = random_logits(rng, 2000, scale=1.0)
    ids, probs = reference(logits, **kw)
    smpl = moeinfer.Sampler(2000, seed=2024, **{**NEUTRAL, **kw})
    n = 40000
    counts = collections.Counter(smpl.sample(logits) for _ in range(n))
    assert set(counts) <= set(ids.tolist())
    expected = probs * n
    observed = np.array([counts.get(int(i), 0) for i in ids])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    df = len(ids) - 1
    z = 4.753
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < critical, f"chi2 {chi2:.1f} >= {critical:.1f} (df {df})"


def test_accept_window_slides(rng):
    """Only the last repeat_last_n accepted tokens count, accepted one by one or in batches."""
    history = rng.integers(0, 30, size=50).tolist()
    logits = random_logits(rng, 100)
    kw = dict(repeat_last_n=8, repeat_penalty=2.0, frequency_penalty=0.5)
    want_ids, want_probs = reference(logits, history, **kw)
    smpl = moeinfer.Sampler(100, **{**NEUTRAL, **kw})
    for t in history[:20]:
        smpl.accept(t)
    smpl.accept(np.array(history[20:], dtype=np.int64))
    ids, probs = smpl.apply(logits)
    order = np.argsort(ids)
    np.testing.assert_array_equal(ids[order], want_ids)
    np.testing.assert_allclose(probs[order], want_probs, rtol=RTOL, atol=ATOL)
    smpl.reset()
    ids, probs = smpl.apply(logits)
    order = np.argsort(ids)
    np.testing.assert_allclose(probs[order], reference(logits, **kw)[1], rtol=RTOL, atol=ATOL)


def test_apply_max_n_and_decode_row_shape(rng):
    lg = random_logits(rng, 200)
    smpl = moeinfer.Sampler(200, top_k=20)
    ids, probs = smpl.apply(lg)
    ids3, probs3 = smpl.apply(lg[None, :], max_n=3)  # a (1, n_vocab) row, as Context.decode returns
    np.testing.assert_array_equal(ids3, ids[:3])
    np.testing.assert_array_equal(probs3, probs[:3])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.01), "min_p"),
        (dict(min_keep=-1), "min_keep"),
        (dict(repeat_last_n=-2), "repeat_last_n"),
        (dict(repeat_penalty=0.0), "repeat_penalty"),
        (dict(repeat_penalty=float("nan")), "repeat_penalty"),
        (dict(frequency_penalty=float("inf")), "frequency_penalty"),
        (dict(presence_penalty=float("nan")), "presence_penalty"),
        (dict(logit_bias={100: 1.0}), "logit_bias[0].token"),
        (dict(logit_bias={-1: 1.0}), "logit_bias[0].token"),
        (dict(logit_bias={5: float("nan")}), "logit_bias[0].bias"),
        (dict(logit_bias={5: float("inf")}), "logit_bias[0].bias"),
    ],
)
def test_bad_parameters_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"params->{field}".replace("[", r"\[").replace("]", r"\]")):
        moeinfer.Sampler(100, **kwargs)


def test_bad_calls(rng):
    with pytest.raises(ValueError, match="n_vocab"):
        moeinfer.Sampler(0)
    smpl = moeinfer.Sampler(100, repeat_penalty=3.0)
    lg = random_logits(rng, 100)
    with pytest.raises(ValueError, match=r"n_vocab \(99\)"):
        smpl.sample(lg[:99])
    bad = lg.copy()
    bad[17] = np.nan
    with pytest.raises(ValueError, match=r"logits\[17\]"):
        smpl.sample(bad)
    bad[17] = np.inf
    with pytest.raises(ValueError, match=r"logits\[17\]"):
        smpl.apply(bad)
    with pytest.raises(ValueError, match="-inf"):
        smpl.sample(np.full(100, -np.inf, np.float32))
    with pytest.raises(ValueError, match="shape"):
        smpl.sample(np.zeros((2, 50), np.float32))
    # A failed accept appends nothing: the distribution is the one without history.
    before = smpl.apply(lg)
    with pytest.raises(ValueError, match=r"tokens\[1\] = 100"):
        smpl.accept([5, 100])
    with pytest.raises(ValueError, match=r"tokens\[0\] = -3"):
        smpl.accept(-3)
    after = smpl.apply(lg)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
