"""moeinfer.quantize / dequantize against the independent numpy implementations in the PyPI `gguf`
package (llama.cpp's gguf-py, written to be bit-exact with ggml's reference quantisers).

Agreement is required bit for bit, on fresh random data of several sizes and scales, on values
placed exactly on (and one ulp either side of) each format's rounding ties, on tiny and large
magnitudes, with exact zeros inside non-zero data, and on random stored bytes for dequantisation.
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer

gguf = pytest.importorskip("gguf", reason="the `gguf` package is the reference: pip install gguf")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402

# Types gguf-py quantises: our quantisers must give its bytes.
TYPES = {
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
    "mxfp4": GGMLQuantizationType.MXFP4,
}
# Types gguf-py only dequantises (our quantisers for them are our own; tests/core/test_quant_formats.cpp
# bounds their error). Dequantisation must match gguf-py for these and for TYPES.
DEQUANT_ONLY = {
    "q2_K": GGMLQuantizationType.Q2_K,
    "q3_K": GGMLQuantizationType.Q3_K,
    "q4_K": GGMLQuantizationType.Q4_K,
    "q5_K": GGMLQuantizationType.Q5_K,
    "q6_K": GGMLQuantizationType.Q6_K,
    "iq4_nl": GGMLQuantizationType.IQ4_NL,
    "iq4_xs": GGMLQuantizationType.IQ4_XS,
}
DEQUANT_TYPES = {**TYPES, **DEQUANT_ONLY}
# Byte offsets of the fp16 scales (and mins) inside each block.
FP16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q2_K": (80, 82),
               "q3_K": (108,), "q4_K": (0, 2), "q5_K": (0, 2), "q6_K": (208,), "iq4_nl": (0,), "iq4_xs": (0,)}
BLOCKED = ("q8_0", "q4_0", "mxfp4")
SIZES = (32, 96, 4096, 32 * 1001)
SCALES = (1e-6, 1e-2, 1.0, 1e3)  # 1e-6 drives the fp16 block scales of q8_0 / q4_0 into subnormals


def ref_bytes(type_name: str, x: np.ndarray) -> np.ndarray:
    """gguf's quantisation of x, as the stored bytes (uint8), shaped (..., bytes per row)."""
    out = np.ascontiguousarray(ref_quantize(x, TYPES[type_name]))
    if out.dtype != np.uint8:  # F16 comes back as float16 values
        out = out.view(np.uint8)
    return out


def assert_same_bits(ours: np.ndarray, ref: np.ndarray, what: str, unit: int) -> None:
    """Bit-exact equality; on failure names the first differing `unit`-byte block."""
    ours_b = np.ascontiguousarray(ours).view(np.uint8).ravel()
    ref_b = np.ascontiguousarray(ref).view(np.uint8).ravel()
    assert ours_b.size == ref_b.size, f"{what}: {ours_b.size} bytes, reference has {ref_b.size}"
    diff = np.flatnonzero(ours_b != ref_b)
    if diff.size:
        b = int(diff[0]) // unit
        sl = slice(b * unit, (b + 1) * unit)
        pytest.fail(f"{what}: {diff.size} bytes differ; first in block {b}: "
                    f"ours {ours_b[sl].tolist()} vs reference {ref_b[sl].tolist()}")


def random_values(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Normal values times `scale`, with outliers, exact zeros and one all-zero block."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(scale)
    x[rng.random(n) < 0.02] *= np.float32(8)         # outliers set the block maxima
    x[rng.random(n) < 0.1] = 0.0                      # exact zeros inside non-zero blocks
    if n >= 64:
        start = 32 * int(rng.integers(0, n // 32))
        x[start:start + 32] = 0.0                      # one all-zero block (zero scale)
    assert np.count_nonzero(x) > n // 2
    return x


def tie_values(type_name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Values exactly on the format's rounding ties, some moved one float32 ulp either way."""
    if type_name == "f16":
        a = rng.uniform(-6e4, 6e4, n).astype(np.float16)
        a[: n // 4] = (rng.standard_normal(n // 4) * 1e-5).astype(np.float16)  # subnormal ties too
        b = np.nextafter(a, np.float16(np.inf))
        x = (a.astype(np.float32) + b.astype(np.float32)) / np.float32(2)  # exact midpoints
    elif type_name == "bf16":
        exp = rng.integers(1, 255, n, dtype=np.uint32) << 23
        mant = rng.integers(0, 1 << 7, n, dtype=np.uint32) << 16
        sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
        x = (sign | exp | mant | np.uint32(0x8000)).view(np.float32)  # halfway between two bf16
    else:
        blocks = n // 32
        e = rng.integers(-14, 14, (blocks, 1)).astype(np.float32)  # fp16 scales stay normal
        s = np.float32(2) ** e  # power-of-two steps: every product below is exact in float32
        sign = np.where(rng.random((blocks, 32)) < 0.5, -1, 1).astype(np.float32)
        if type_name == "q8_0":   # d = amax / 127 = s; x * (1/d) = k + 0.5
            x = (rng.integers(0, 127, (blocks, 32)) + 0.5).astype(np.float32) * s * sign
            x[:, 0] = 127 * s[:, 0] * sign[:, 0]
        elif type_name == "q4_0":  # d = max / -8 = -+s; x * (1/d) + 8.5 lands on integers
            x = (rng.integers(-8, 7, (blocks, 32)) + 0.5).astype(np.float32) * s
            x[:, 0] = 8 * s[:, 0] * sign[:, 0]
        elif type_name == "q5_0":  # d = max / -16 = -+s; x * (1/d) + 16.5 lands on integers
            x = (rng.integers(-16, 15, (blocks, 32)) + 0.5).astype(np.float32) * s
            x[:, 0] = 16 * s[:, 0] * sign[:, 0]
        elif type_name in ("q4_1", "q5_1"):  # min = -(L+1) s, max = L s: d = s; (x - min) / d + 0.5 integers
            top = 15 if type_name == "q4_1" else 31
            s = np.minimum(s, np.float32(2**10))  # the fp16 min -(L+1) s stays finite
            lo = -np.float32((top + 1) // 2) * s
            x = lo + (rng.integers(0, top, (blocks, 32)) + 0.5).astype(np.float32) * s
            x[:, 0] = lo[:, 0]
            x[:, 1] = lo[:, 0] + top * s[:, 0]
        else:                      # mxfp4: amax = 1.5 * 2^L gives d = 2^(L-3); midpoints of e2m1 levels
            mids = np.array([0.5, 1.5, 2.5, 3.5, 5, 7, 10], dtype=np.float32)
            x = mids[rng.integers(0, mids.size, (blocks, 32))] * (s / 8) * sign
            x[:, 0] = np.float32(1.5) * s[:, 0] * sign[:, 0]
        x = x.ravel()
    nudge = rng.random(n)
    x = np.where(nudge < 0.15, np.nextafter(x, np.float32(np.inf)), x)
    x = np.where(nudge > 0.85, np.nextafter(x, np.float32(-np.inf)), x)
    return x.astype(np.float32)


def finite_halves(h: np.ndarray, exp_mask: int) -> None:
    """In place: 16-bit floats whose exponent is all ones (inf / NaN) lose the exponent's top bit."""
    special = (h & np.uint16(exp_mask)) == np.uint16(exp_mask)
    h[special] &= np.uint16(0xBFFF)


def random_stored_bytes(type_name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Random stored data of n elements whose scales and values are all finite."""
    block_size, block_bytes = GGML_QUANT_SIZES[DEQUANT_TYPES[type_name]]
    raw = rng.integers(0, 256, n // block_size * block_bytes, dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    if type_name in ("f16", "bf16"):
        finite_halves(raw.view(np.uint16), 0x7C00 if type_name == "f16" else 0x7F80)
    elif type_name == "mxfp4":  # e8m0 scales up to 2^122, so that 12 * scale stays finite
        blocks[:, 0] %= 251
    else:
        for off in FP16_FIELDS[type_name]:
            d = blocks[:, off:off + 2].copy().view(np.uint16)
            finite_halves(d, 0x7C00)
            blocks[:, off:off + 2] = d.view(np.uint8)
    return raw


def block_sizes(type_name: str) -> tuple[int, ...]:
    """SIZES in whole blocks of the type (the K-quants take 256 elements a block)."""
    block = GGML_QUANT_SIZES[DEQUANT_TYPES[type_name]][0]
    return SIZES if block <= 32 else (256, 768, 4096, 256 * 101)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scale", SCALES)
def test_quantize_matches_gguf(type_name, n, scale, rng):
    x = random_values(rng, n, scale)
    ours = moeinfer.quantize(type_name, x)
    assert ours.dtype == np.uint8 and ours.shape == (moeinfer.row_bytes(type_name, n),)
    assert_same_bits(ours, ref_bytes(type_name, x), f"quantize {type_name} n={n} scale={scale}",
                     moeinfer.type_info(type_name)[1])


@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_ties_match_gguf(type_name, rng):
    x = tie_values(type_name, rng, 32 * 512)
    assert np.count_nonzero(x) > x.size // 2
    assert_same_bits(moeinfer.quantize(type_name, x), ref_bytes(type_name, x), f"quantize {type_name} ties",
                     moeinfer.type_info(type_name)[1])


@pytest.mark.parametrize("type_name", ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))
def test_quantize_extreme_magnitudes_match_gguf(type_name, rng):
    # Beyond fp16's range (f16 saturates to inf, the fp16 scales of q8_0 / q4_0 overflow) and tiny blocks
    # (zero scales); f16 / bf16 also get float32 subnormals.
    x = random_values(rng, 32 * 64, 1.0)
    x[: 32 * 16] *= np.float32(1e7)
    x[32 * 16: 32 * 32] *= np.float32(1e-30)
    if type_name in ("f16", "bf16"):
        x[32 * 32: 32 * 48] *= np.float32(1e-40)
    with np.errstate(over="ignore"):  # the reference warns when it saturates
        ref = ref_bytes(type_name, x)
    assert_same_bits(moeinfer.quantize(type_name, x), ref, f"quantize {type_name} extremes",
                     moeinfer.type_info(type_name)[1])


def test_quantize_mxfp4_wide_exponents_match_gguf(rng):
    # Block maxima from 1.75 * 2^-125 (e8m0 scale byte 0, subnormal scale) to ~2^122, with float32
    # subnormals among the values of the smallest blocks.
    p = np.arange(-125, 121)
    x = rng.standard_normal((p.size, 32)).astype(np.float32) * np.ldexp(np.float32(1), p)[:, None]
    x[:, 0] = np.ldexp(np.float32(1.75), p) * np.where(rng.random(p.size) < 0.5, -1, 1)
    x = x.astype(np.float32).ravel()
    assert_same_bits(moeinfer.quantize("mxfp4", x), ref_bytes("mxfp4", x), "quantize mxfp4 exponents", 17)


@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_rows_like_gguf(type_name, rng):
    x = random_values(rng, 7 * 96, 0.5).reshape(7, 96)
    ours = moeinfer.quantize(type_name, x)
    ref = ref_bytes(type_name, x)
    assert ours.shape == ref.shape
    assert_same_bits(ours, ref, f"quantize {type_name} rows", moeinfer.type_info(type_name)[1])


@pytest.mark.parametrize("type_name", DEQUANT_TYPES)
@pytest.mark.parametrize("size_index", range(len(SIZES)))
def test_dequantize_matches_gguf(type_name, size_index, rng):
    n = block_sizes(type_name)[size_index]
    raw = random_stored_bytes(type_name, rng, n)
    ours = moeinfer.dequantize(type_name, raw, n)
    ref = np.asarray(ref_dequantize(raw, DEQUANT_TYPES[type_name]), dtype=np.float32).ravel()
    assert ours.dtype == np.float32 and ours.shape == (n,)
    assert np.all(np.isfinite(ref))
    assert_same_bits(ours, ref, f"dequantize {type_name} n={n}", 4)
    # n defaults to everything the bytes hold
    assert_same_bits(moeinfer.dequantize(type_name, raw), ref, f"dequantize {type_name} default n", 4)


# Zero, -0, the smallest subnormal, the smallest normal, the largest finite of both signs: fp16 scale bits.
EXTREME_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x0400, 0x7BFF, 0xFBFF], dtype=np.uint16)


@pytest.mark.parametrize("type_name", FP16_FIELDS)
def test_dequantize_extreme_scales_match_gguf(type_name, rng):
    # Every block's scales (and mins) set to extreme values, each field drawn on its own.
    n = block_sizes(type_name)[2]
    raw = random_stored_bytes(type_name, rng, n)
    blocks = raw.reshape(n // GGML_QUANT_SIZES[DEQUANT_TYPES[type_name]][0], -1)
    for off in FP16_FIELDS[type_name]:
        h = EXTREME_HALVES[rng.integers(0, EXTREME_HALVES.size, blocks.shape[0])]
        blocks[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    ours = moeinfer.dequantize(type_name, raw, n)
    ref = np.asarray(ref_dequantize(raw, DEQUANT_TYPES[type_name]), dtype=np.float32).ravel()
    assert np.all(np.isfinite(ref))
    assert_same_bits(ours, ref, f"dequantize {type_name} extreme scales", 4)


# Largest |dequantize(quantize(x)) - x| as a fraction of the block's largest |x| (amax). Rounding to the
# nearest level costs half a step (a whole one for the symmetric types, where the sign of the extreme
# leaves the other side a level short); the stored fp16 scale d (and min m) add their own rounding,
# 2^-11 relative: top levels * |d - fp16(d)| <= (max - min) * 2^-11 <= 2 amax 2^-11, and |m - fp16(m)|
# <= amax 2^-11. So symmetric: 2/levels + 2^-11; asymmetric (max - min <= 2 amax): 1/top + 3 * 2^-11.
# The 1.001 covers float rounding in the products.
FP16_ROUNDING = 2.0**-11
ROUND_TRIP_BOUND = {"q8_0": 0.6 / 127, "q4_0": (1 / 8 + FP16_ROUNDING) * 1.001,
                    "q5_0": (1 / 16 + FP16_ROUNDING) * 1.001, "q4_1": (1 / 15 + 3 * FP16_ROUNDING) * 1.001,
                    "q5_1": (1 / 31 + 3 * FP16_ROUNDING) * 1.001, "mxfp4": 0.5}
SYMMETRIC = ("f16", "bf16", "q8_0", "q4_0", "q5_0", "mxfp4")  # zero stays exactly zero


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("scale", SCALES[1:])
def test_round_trip(type_name, scale, rng):
    n = 32 * 300
    x = random_values(rng, n, scale)
    q = moeinfer.quantize(type_name, x)
    y = moeinfer.dequantize(type_name, q, n)
    if type_name == "f16":
        assert np.all(np.abs(y - x) <= np.abs(x) * 2.0**-11 + 2.0**-25)  # + half the subnormal step
    elif type_name == "bf16":
        assert np.all(np.abs(y - x) <= np.abs(x) * 2.0**-8)
    else:
        amax = np.abs(x).reshape(-1, 32).max(axis=1, keepdims=True)
        err = np.abs(y - x).reshape(-1, 32)
        assert np.all(err <= amax * ROUND_TRIP_BOUND[type_name] + 1e-30), float((err / np.maximum(amax, 1e-30)).max())
    if type_name in SYMMETRIC:
        assert np.all(y[x == 0] == 0)
        # Quantising what dequantisation gave back reproduces the same bytes.
        assert_same_bits(moeinfer.quantize(type_name, y), q, f"requantize {type_name}",
                         moeinfer.type_info(type_name)[1])


@pytest.mark.parametrize("gtype", list(GGMLQuantizationType), ids=lambda t: t.name)
def test_type_info_matches_gguf(gtype):
    # Every GGUF type, runnable or not, is known by name with gguf-py's sizes.
    type_name = gtype.name.lower()
    sizes = GGML_QUANT_SIZES[gtype]
    if gtype == GGMLQuantizationType.Q8_1:  # ggml's block_q8_1 is 2 fp16 + 32 int8; gguf-py still says 40
        sizes = (32, 36)
    assert moeinfer.type_info(type_name) == sizes
    assert moeinfer.type_info(gtype.name) == sizes  # names are case-insensitive
    block_size, block_bytes = sizes
    assert moeinfer.row_bytes(type_name, 64 * block_size) == 64 * block_bytes


def test_f32_is_identity(rng):
    x = rng.standard_normal(64).astype(np.float32)
    assert_same_bits(moeinfer.quantize("f32", x), x, "quantize f32", 4)
    assert_same_bits(moeinfer.dequantize("f32", x.view(np.uint8)), x, "dequantize f32", 4)


def test_quantize_converts_other_float_dtypes(rng):
    x = rng.standard_normal(64)  # float64
    assert_same_bits(moeinfer.quantize("q8_0", x), ref_bytes("q8_0", x.astype(np.float32)), "quantize float64", 34)


def test_unknown_type_name_is_value_error():
    x = np.ones(32, dtype=np.float32)
    for call in (lambda: moeinfer.quantize("q9_9", x),
                 lambda: moeinfer.dequantize("q9_9", np.zeros(34, np.uint8)),
                 lambda: moeinfer.type_info("nope"),
                 lambda: moeinfer.row_bytes("", 32)):
        with pytest.raises(ValueError):
            call()


def test_bad_sizes_are_value_errors():
    with pytest.raises(ValueError):
        moeinfer.quantize("q8_0", np.ones(33, dtype=np.float32))       # not whole blocks
    with pytest.raises(ValueError):
        moeinfer.quantize("q4_0", np.ones((2, 48), dtype=np.float32))  # rows are not whole blocks
    with pytest.raises(ValueError):
        moeinfer.dequantize("q8_0", np.zeros(34, np.uint8), 64)         # fewer bytes than n needs
    with pytest.raises(ValueError):
        moeinfer.dequantize("q8_0", np.zeros(35, np.uint8))             # not whole blocks
    with pytest.raises(ValueError):
        moeinfer.dequantize("q8_0", np.zeros(34, np.uint8), -32)
    with pytest.raises(ValueError):
        moeinfer.row_bytes("q4_0", 31)
    with pytest.raises(TypeError):
        moeinfer.dequantize("q8_0", [0] * 34)                          # not a buffer
