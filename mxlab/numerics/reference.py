"""The numerics contract in pure PyTorch: the definition every other backend must match.

`docs/numerics.md` states the algorithm. This module computes it with float64 arithmetic
that is exact for every step it takes (float32 inputs have 24-bit significands, the scale
is a power of two, and every quotient and product below fits a float64 significand), so it
gives the same bits as the integer formulation the Triton kernels use:

- The block scale exponent S comes from amax's exponent and 23-bit fraction
  (`floor`, `ceil`, `rceil`, `even`), clamped to [-127, 127].
- Each element is rounded at quantum 2^qe with qe = max(floor(log2|x|), S + emin) - mbits.
  `v = |x| / 2^qe` is exact; `frac = v - floor(v)` is exact; the rounding modes compare
  frac with 1/2 (nearest) or with u = (r + 0.5) / 2^24 (stochastic, r = 24 counter bits).
- A magnitude beyond the format's max normal saturates to it, keeping its sign.

Inputs here are already validated and padded (mxlab.numerics.quant does that): float32, blocked
dimensions multiples of 32. Functions take a "blocked view" description: `reduce_dims`, the
dims of a reshaped tensor that one block spans.
"""

from __future__ import annotations

import torch

from mxlab.numerics.formats import (
    E8M0_BIAS,
    E8M0_NAN,
    SCALE_EXP_MAX,
    SCALE_EXP_MIN,
    ElementFormat,
    float32_fraction_bits,
)
from mxlab.numerics.vocab import Rounding, ScaleMode

BLOCK_SIZE = 32

_MASK32 = 0xFFFFFFFF


# ----------------------------------------------------------------------------- random bits
def _as_int32(constant: int) -> int:
    """A uint32 constant as the int32 with the same bits."""
    return constant - (1 << 32) if constant >= 1 << 31 else constant


def mix32(z: torch.Tensor) -> torch.Tensor:
    """The 32-bit integer mixer of docs/numerics.md on int32 tensors holding uint32 bits.

    Multiplications wrap mod 2^32 (two's complement); right shifts are made logical by masking.
    """
    z = z ^ ((z >> 16) & 0xFFFF)
    z = z * _as_int32(0x7FEB352D)
    z = z ^ ((z >> 15) & 0x1FFFF)
    z = z * _as_int32(0x846CA68B)
    return z ^ ((z >> 16) & 0xFFFF)


def random_bits24(index: torch.Tensor, seed: int) -> torch.Tensor:
    """24 counter-based random bits (int32 in [0, 2^24)) for each int64 linear element index and a seed."""
    key = mix32(torch.tensor(_as_int32(seed & _MASK32), dtype=torch.int32, device=index.device))
    low = (index & _MASK32).to(torch.int32)  # keeps the low 32 bits (two's complement)
    high = (index >> 32).to(torch.int32)
    hashed = mix32(mix32(low ^ key) ^ high)
    return (hashed >> 8) & 0xFFFFFF


# ----------------------------------------------------------------------------- scales
def _log2_floor_and_fraction(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """floor(log2 amax) and the 23-bit fraction of amax normalized to [1, 2) (int64 each).

    float32 subnormals are normalized; amax must be finite and positive where it matters. A float32 amax
    is read from its bits (subnormals first scaled by 2^64, exact), so compilers need no float64 frexp.
    """
    if amax.dtype == torch.float32:
        subnormal = amax < 2.0**-126
        bits = torch.where(subnormal, amax * 2.0**64, amax).view(torch.int32).to(torch.int64)
        exponent = ((bits >> 23) & 0xFF) - 127 - subnormal.to(torch.int64) * 64
        return exponent, bits & 0x7FFFFF
    mantissa, exponent = torch.frexp(amax.double())  # amax = mantissa * 2^exponent, mantissa in [0.5, 1)
    fraction = ((mantissa * 2.0 - 1.0) * 2.0**23).to(torch.int64)
    return exponent.to(torch.int64) - 1, fraction


def _round_fraction_carries(fraction23: torch.Tensor, mbits: int) -> torch.Tensor:
    """1 where rounding 1.fraction to `mbits` bits (nearest even) reaches 2, else 0."""
    drop = 23 - mbits
    keep = fraction23 >> drop
    rest = fraction23 & ((1 << drop) - 1)
    half = 1 << (drop - 1)
    round_up = (rest > half) | ((rest == half) & ((keep & 1) == 1))
    return (keep + round_up.to(torch.int64)) >> mbits


def scale_exponents(amax: torch.Tensor, fmt: ElementFormat, scale_mode: str) -> torch.Tensor:
    """Unbiased E8M0 exponents S (int64) of blocks with the given float32 amax (finite, >= 0).

    An amax of zero gives -127 (byte 0x00). The caller handles non-finite blocks.
    """
    scale_mode = ScaleMode(scale_mode)  # refuses an unknown mode
    log2_floor, fraction = _log2_floor_and_fraction(amax)
    exponent = log2_floor - fmt.emax
    if scale_mode == ScaleMode.CEIL:
        exponent = exponent + (fraction != 0).to(torch.int64)
    elif scale_mode == ScaleMode.RCEIL:
        exponent = exponent + (fraction > float32_fraction_bits(fmt.max_normal)).to(torch.int64)
    elif scale_mode == ScaleMode.EVEN:
        exponent = exponent + _round_fraction_carries(fraction, fmt.mbits)
    elif scale_mode != ScaleMode.FLOOR:
        raise NotImplementedError(f"scale_mode {scale_mode!r} has no rule in the reference")
    exponent = exponent.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX)
    return torch.where(amax == 0, torch.full_like(exponent, SCALE_EXP_MIN), exponent)


# ----------------------------------------------------------------------------- elements
def _rounded_magnitudes(
    x: torch.Tensor, scale_exp: torch.Tensor, fmt: ElementFormat, rounding: str, random_bits: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounded magnitudes n (float64 integers, before saturation) and quantum exponents qe.

    |x| rounds to n * 2^qe; `scale_exp` broadcasts against x.
    """
    log2_floor, _ = _log2_floor_and_fraction(x.abs())
    magnitude = x.abs().double()
    quantum_exp = torch.maximum(log2_floor, scale_exp + fmt.emin) - fmt.mbits
    scaled = torch.ldexp(magnitude, -quantum_exp)  # exact: a power-of-two rescale in float64
    whole = torch.floor(scaled)
    frac = scaled - whole
    rounding = Rounding(rounding)  # refuses an unknown rounding
    if rounding == Rounding.NEAREST_EVEN:
        round_up = (frac > 0.5) | ((frac == 0.5) & (torch.remainder(whole, 2) == 1))
    elif rounding == Rounding.NEAREST_AWAY:
        round_up = frac >= 0.5
    elif rounding == Rounding.TOWARD_ZERO:
        round_up = torch.zeros_like(frac, dtype=torch.bool)
    elif rounding == Rounding.STOCHASTIC:
        if random_bits is None:
            raise ValueError("stochastic rounding needs random bits (pass seed=...)")
        threshold = (random_bits.double() + 0.5) * 2.0**-24
        round_up = threshold < frac
    else:
        raise NotImplementedError(f"rounding {rounding!r} has no rule in the reference")
    return whole + round_up.double(), quantum_exp


def _fp_magnitude_codes(
    n: torch.Tensor, quantum_exp: torch.Tensor, scale_exp: torch.Tensor, fmt: ElementFormat
) -> torch.Tensor:
    """Magnitude codes (int64) of FP elements n * 2^(qe - S), saturated to the max code."""
    element_exp = quantum_exp - scale_exp  # exponent of the quantum in element units
    exponent_field = element_exp + fmt.mbits + fmt.bias - 1
    codes = (exponent_field << fmt.mbits) + n.to(torch.int64)
    codes = torch.where(n == 0, torch.zeros_like(codes), codes)
    return codes.clamp(max=fmt.max_code)


def encode_elements(
    x: torch.Tensor,
    scale_exp: torch.Tensor | int,
    fmt: ElementFormat,
    rounding: str = "nearest_even",
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Element codes (uint8) of float32 x at the given unbiased scale exponent(s), rounded and saturated."""
    scale_exp = torch.as_tensor(scale_exp, dtype=torch.int64, device=x.device)
    n, quantum_exp = _rounded_magnitudes(x, scale_exp, fmt, rounding, random_bits)
    negative = torch.signbit(x)
    if fmt.is_int:
        magnitude = n.clamp(max=fmt.max_code).to(torch.int64)
        codes = torch.where(negative, (256 - magnitude) & 0xFF, magnitude)
    else:
        codes = _fp_magnitude_codes(n, quantum_exp, scale_exp, fmt)
        codes = codes | (negative.to(torch.int64) * fmt.sign_bit)
    return codes.to(torch.uint8)


def _block_scales(x: torch.Tensor, reduce_dims: tuple[int, ...], fmt: ElementFormat, scale_mode: str):
    """(scale exponents, non-finite mask), both with `reduce_dims` kept as size 1."""
    return _scales_of_amax(x.abs().amax(dim=reduce_dims, keepdim=True), fmt, scale_mode)


def _scales_of_amax(amax: torch.Tensor, fmt: ElementFormat, scale_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale exponents, non-finite mask) of blocks with the given amax (NaN or Inf: a non-finite block)."""
    nonfinite_block = ~torch.isfinite(amax)
    scale_exp = scale_exponents(torch.where(nonfinite_block, torch.zeros_like(amax), amax), fmt, scale_mode)
    return scale_exp, nonfinite_block


def quantize_blocks(
    x: torch.Tensor,
    reduce_dims: tuple[int, ...],
    fmt: ElementFormat,
    scale_mode: str,
    rounding: str,
    random_bits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a float32 tensor whose blocks span `reduce_dims`.

    Returns (codes uint8 of x's shape, scale bytes uint8 with `reduce_dims` kept as size 1).
    """
    scale_exp, nonfinite_block = _block_scales(x, reduce_dims, fmt, scale_mode)
    codes = encode_elements(x, scale_exp, fmt, rounding, random_bits)
    codes = torch.where(nonfinite_block, torch.zeros_like(codes), codes)
    scale_bytes = torch.where(nonfinite_block, torch.full_like(scale_exp, E8M0_NAN), scale_exp + E8M0_BIAS)
    return codes, scale_bytes.to(torch.uint8)


def _fast_path_applies(
    x: torch.Tensor,
    scale_exp: torch.Tensor,
    nonfinite_block: torch.Tensor,
    zero_block: torch.Tensor,
    fmt: ElementFormat,
    rounding: str,
) -> bool:
    """Whether `_fake_quantize_fp32` is exact for this input (see its docstring).

    An all-zero block (`zero_block`: amax 0, reduced dims kept; its scale exponent SCALE_EXP_MIN is below
    the guard for formats with emin < 0) does not count: its elements are +-0, which the float32 path
    returns exactly at any finite scale (|x| + C - C = 0).
    """
    if rounding not in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC) or x.dtype != torch.float32:
        return False
    if scale_exp.numel() == 0:
        return True
    counted = ~nonfinite_block & ~zero_block
    low = torch.where(counted, scale_exp, SCALE_EXP_MAX).amin()  # no counted block: the guard holds
    high = torch.where(counted, scale_exp, SCALE_EXP_MIN).amax()
    low, high = torch.stack((low, high)).tolist()
    return low + fmt.emin >= -127 and high + fmt.emax <= 100


def _fake_quantize_fp32(
    x: torch.Tensor,
    magnitude: torch.Tensor,
    scale_exp: torch.Tensor,
    fmt: ElementFormat,
    rounding: str,
    random_bits: torch.Tensor | None,
    saturates: bool,
) -> torch.Tensor:
    """Nearest-even or stochastic fake quantization in float32 arithmetic, for finite blocks (fast).

    `magnitude` is |x|, which this function overwrites (it holds the result). `saturates`: whether some
    element may round above its block's largest magnitude max_normal * 2^S (if not, no clamp is needed).

    With C = 2^(qe + 23), the float32 sum |x| + C lies in [C, 2C), whose spacing is exactly the
    quantum 2^qe, so (|x| + C) - C is |x| rounded to nearest even at that quantum by the FPU.
    Since qe = max(floor(log2|x|), S + emin) - mbits, C is the larger of 2^floor(log2|x|) (|x| with
    its fraction bits cleared; 0 for a float32-subnormal |x|) times 2^(23 - mbits) and the block's
    2^(S + emin - mbits + 23): two powers of two, so the product and the maximum are exact.
    Stochastic rounding steps back to the value below, `lower`; |x| - lower is exact, and
    (|x| - lower) * 2^(25 - qe) (exact in float64) compared with 2r + 1 is the documented test
    u < frac. It needs 2^(qe + 23) to be a float32 normal (qe <= 104, ensured by S + emax <= 100)
    and the exponent of a float32-subnormal |x| to be irrelevant (S + emin >= -127, so qe is set by S).
    The operations run in place on two buffers: on a CPU, fresh tensors cost as much as the arithmetic.
    """
    magic = (magnitude.view(torch.int32) & 0x7F800000).view(torch.float32).mul_(2.0 ** (23 - fmt.mbits))
    block_magic = (((scale_exp + (fmt.emin - fmt.mbits + 23 + 127)).to(torch.int32)) << 23).view(torch.float32)
    torch.maximum(magic, block_magic, out=magic)
    if rounding == "stochastic":
        rounded = (magnitude + magic) - magic
        quantum = magic.mul_(2.0**-23)
        lower = torch.where(rounded > magnitude, rounded - quantum, rounded)
        fraction_2pow25 = (magnitude - lower).double() * 2.0**25 / quantum.double()
        round_up = (2 * random_bits + 1).double() < fraction_2pow25
        rounded = torch.where(round_up, lower + quantum, lower)
    else:
        rounded = magnitude.add_(magic).sub_(magic)
    if saturates:
        torch.minimum(rounded, _largest_magnitudes(scale_exp, fmt), out=rounded)
    if fmt.is_int:
        return torch.where(torch.signbit(x) & (rounded > 0), -rounded, rounded)
    return rounded.copysign_(x)


def _largest_magnitudes(scale_exp: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """max_normal * 2^S per block (float32; exact while S + emax <= 127)."""
    return torch.ldexp(
        torch.full(scale_exp.shape, fmt.max_normal, dtype=torch.float32, device=scale_exp.device),
        scale_exp.to(torch.int32),
    )


def fake_quantize_blocks(
    x: torch.Tensor,
    reduce_dims: tuple[int, ...],
    fmt: ElementFormat,
    scale_mode: str,
    rounding: str,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """dequantize(quantize(x)) as float32, computed without materializing codes."""
    magnitude = x.abs()
    amax = magnitude.amax(dim=reduce_dims, keepdim=True)
    scale_exp, nonfinite_block = _scales_of_amax(amax, fmt, scale_mode)
    if torch.compiler.is_compiling():  # no data-dependent branch in a traced graph: the exact path, masked
        values = _fake_quantize_exact(x, scale_exp, fmt, rounding, random_bits)
        return torch.where(nonfinite_block, torch.full_like(values, float("nan")), values)
    if _fast_path_applies(x, scale_exp, nonfinite_block, amax == 0, fmt, rounding):
        # An element rounds above max_normal * 2^S only if its block's amax exceeds that (rounding is monotonic
        # and max_normal * 2^S is representable); finite blocks only (a non-finite block is masked below).
        saturates = bool((torch.where(nonfinite_block, 0.0, amax) > _largest_magnitudes(scale_exp, fmt)).any())
        values = _fake_quantize_fp32(x, magnitude, scale_exp, fmt, rounding, random_bits, saturates)
    else:
        values = _fake_quantize_exact(x, scale_exp, fmt, rounding, random_bits)
    if not bool(nonfinite_block.any()):
        return values
    return torch.where(nonfinite_block, torch.full_like(values, float("nan")), values)


def _fake_quantize_exact(
    x: torch.Tensor, scale_exp: torch.Tensor, fmt: ElementFormat, rounding: str, random_bits: torch.Tensor | None
) -> torch.Tensor:
    """Fake quantization of every rounding mode in exact float64 arithmetic (NaN blocks not yet masked)."""
    n, quantum_exp = _rounded_magnitudes(x, scale_exp, fmt, rounding, random_bits)
    max_magnitude = torch.ldexp(torch.full_like(n, fmt.max_normal), scale_exp)
    magnitude = torch.minimum(torch.ldexp(n, quantum_exp), max_magnitude)
    if fmt.is_int:
        values = torch.where(torch.signbit(x) & (magnitude > 0), -magnitude, magnitude)  # int8 has no -0
    else:
        values = torch.copysign(magnitude, x.double())
    return values.float()
