"""In-kernel MX fake quantization (quantize then dequantize) of register tiles, for fused kernels.

These Triton device functions follow docs/numerics.md step by step with integer operations on
float32 bit patterns, so a tile quantized here equals `mxlab.numerics.reference.fake_quantize_blocks` bit
for bit, for every rounding. Stochastic rounding takes the tile's 24 random bits per element as an
argument (`r24`): the caller draws them from a counter of its own choice with `token_random_bits`
(an element's linear index in a packed (tokens, heads, head_dim) tensor) or `score_random_bits`
(a score's query row, head and key index), which are `mxlab.numerics.reference.random_bits24` of those
counters (docs/numerics.md, "Jagged attention").

Floating-point formats round every tile in the element's own units, exact at every scale, so with no
tile-wide test of the scales' range: e4m3/e5m2 to nearest even through the GPU's FP8 conversion where the
host sets the HW_FP8 bit of the operand code (`mxlab.kernels.cast.hardware_fp8_applies`: CUDA sm_90+, never
under TRITON_INTERPRET=1; `_quantize_hw_fp8`: float32(x) * 2^-S, `cvt.rn.satfinite` to FP8 and back, times
2^S), other nearest-even tiles by `_nearest_scaled` and stochastic ones by `_stochastic_scaled` of the cast
kernels (docs/numerics.md, "Rounding in the element's units" and "Jagged attention"). INT8, and the other
roundings, take the integer steps.

An operand's format, scale mode, rounding and the hardware switch travel as one packed integer
constexpr (`operand_code`: the kernel code of `mxlab.numerics.vocab`, which the cast kernels take too), so a
kernel with many quantized operands keeps a short signature.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from mxlab.kernels.cast.bits import (
    ROUND_NEAREST_AWAY,
    ROUND_NEAREST_EVEN,
    ROUND_STOCHASTIC,
    ROUND_TOWARD_ZERO,
    _fast_path_ok,
    _floor_log2,
    _mix32,
    _random_bits24,
    code_field,
)
from mxlab.kernels.cast.bits import _scale_exponent as _scale_exponent_and_special
from mxlab.kernels.cast.elements import (
    _nearest_scaled,
    _quantize_fast,
    _quantize_fast_stochastic,
    _quantize_hw_fp8,
    _stochastic_scaled,
)
from mxlab.kernels.cast.launch import HARDWARE_FP8_FORMATS
from mxlab.numerics.formats import ElementFormat, get_format
from mxlab.numerics.vocab import Rounding, kernel_code

BLOCK = 32


def operand_code(fmt: str | ElementFormat, scale_mode: str, rounding: str, *, hw_fp8: bool = False) -> int:
    """Pack an MX element format, scale mode and rounding into one int for `fake_quant_tile`.

    The code is `mxlab.numerics.vocab.kernel_code` (its docstring gives the bit layout). `hw_fp8` asks for the
    hardware FP8 conversion; the caller decides it with `mxlab.kernels.cast.hardware_fp8_applies` for the
    tensor's device. Refuses unknown names, formats that do not fit, and `hw_fp8` for anything but e4m3/e5m2
    with nearest_even.
    """
    if isinstance(fmt, str):  # the common case, once per name: kernels' host code calls this per launch
        return _operand_code_of_name(fmt, scale_mode, rounding, hw_fp8)
    return _operand_code(fmt, scale_mode, rounding, hw_fp8)


@functools.lru_cache(maxsize=512)
def _operand_code_of_name(fmt: str, scale_mode: str, rounding: str, hw_fp8: bool) -> int:
    return _operand_code(get_format(fmt), scale_mode, rounding, hw_fp8)


def _operand_code(element: ElementFormat, scale_mode: str, rounding: str, hw_fp8: bool) -> int:
    code = kernel_code(element, scale_mode, rounding, hw_fp8)  # refuses unknown modes and formats that do not fit
    if hw_fp8 and (element.name not in HARDWARE_FP8_FORMATS or rounding != Rounding.NEAREST_EVEN):
        raise ValueError(
            f"hw_fp8=True needs format {' or '.join(HARDWARE_FP8_FORMATS)} "
            f"with nearest_even; got {element.name} with {rounding}"
        )
    return code


@triton.jit
def _pow2(e):
    """float32 2^e for int32 e in [-149, 127] (subnormal powers included)."""
    normal = ((tl.maximum(e, -126) + 127) << 23).to(tl.float32, bitcast=True)
    subnormal = (1 << tl.minimum(tl.maximum(e + 149, 0), 22)).to(tl.float32, bitcast=True)
    return tl.where(e >= -126, normal, subnormal)


@triton.jit
def _scale_exponent(amax, CODE: tl.constexpr):
    """Clamped unbiased E8M0 exponent S of finite blocks (the cast kernels' scale rule)."""
    s, _ = _scale_exponent_and_special(amax, CODE)
    return s


@triton.jit
def _fake_quant_elements(x, s, r24, CODE: tl.constexpr):
    """dequantize(quantize(x)) in float32 for float32 x at unbiased scale exponents s (broadcast);
    r24: the elements' 24 random bits (stochastic rounding only)."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    IS_INT: tl.constexpr = code_field(CODE, "is_int")
    ROUNDING: tl.constexpr = code_field(CODE, "rounding")
    bits = x.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    exponent = magnitude >> 23
    fraction = magnitude & 0x7FFFFF
    is_normal = exponent > 0
    significand = tl.where(is_normal, fraction | 0x800000, fraction)
    value_exp = tl.where(is_normal, exponent - 150, -149)  # |x| = significand * 2^value_exp
    log2_floor = tl.where(is_normal, exponent - 127, _floor_log2(tl.maximum(fraction, 1)) - 149)
    if IS_INT:
        quantum_exp = s - MBITS + log2_floor * 0
    else:
        quantum_exp = tl.maximum(log2_floor, s + EMIN) - MBITS
    shift = quantum_exp - value_exp
    # shift >= 25 rounds the deterministic modes to 0 (significand < 2^24 <= half); clamping keeps
    # that. Stochastic rounding compares 2r + 1 with the fraction scaled to 25 bits (docs/numerics.md).
    clamped = tl.minimum(tl.maximum(shift, 1), 25)
    quotient = significand >> clamped
    remainder = significand & ((1 << clamped) - 1)
    half = 1 << (clamped - 1)
    if ROUNDING == ROUND_NEAREST_EVEN:
        up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
        n = quotient + up.to(tl.int32)
    elif ROUNDING == ROUND_NEAREST_AWAY:
        n = quotient + (remainder >= half).to(tl.int32)
    elif ROUNDING == ROUND_TOWARD_ZERO:
        n = quotient
    else:
        tl.static_assert(ROUNDING == ROUND_STOCHASTIC, "a rounding without integer steps")
        odd = 2 * r24 + 1  # u = odd / 2^25
        near = odd < (remainder << (25 - clamped))
        far = odd <= ((significand - 1) >> tl.minimum(tl.maximum(shift - 25, 0), 31))
        n = quotient + tl.where(shift <= 25, near, far).to(tl.int32)
    EMAX: tl.constexpr = code_field(CODE, "emax")
    MMAX: tl.constexpr = code_field(CODE, "mmax")
    max_in_element_units = (((EMAX + 127) << 23) | MMAX + s * 0).to(tl.float32, bitcast=True)
    element = tl.minimum(n.to(tl.float32) * _pow2(quantum_exp - s), max_in_element_units)
    rounded = element * _pow2(s)
    exact = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    result = tl.where(shift <= 0, exact.to(tl.float32, bitcast=True), rounded).to(tl.int32, bitcast=True)
    if IS_INT:
        sign = tl.where(result != 0, bits & -2147483648, 0)  # int8 has no -0
    else:
        sign = bits & -2147483648
    return (result | sign).to(tl.float32, bitcast=True)


@triton.jit
def _every_block(flags, BLOCK_AXIS: tl.constexpr):
    """True when every block's flag is set (`flags`: a tile reduced along BLOCK_AXIS). The flags go back into
    the tile's own layout (BLOCK_AXIS of size 1) and are reduced along a neighbouring axis there first: no layout
    conversion, and on sm_90 two CTA barriers per call instead of four (`mxlab bench attention-sass`)."""
    NEIGHBOUR: tl.constexpr = 1 if BLOCK_AXIS == 0 else BLOCK_AXIS - 1
    in_tile_layout = tl.expand_dims(flags.to(tl.int32), BLOCK_AXIS)
    return tl.min(tl.min(in_tile_layout, axis=NEIGHBOUR, keep_dims=True)) > 0


@triton.jit
def _fake_quant_blocks(x3, r24, BLOCK_AXIS: tl.constexpr, CODE: tl.constexpr):
    """Fake-quantize a float32 view whose blocks of 32 run along BLOCK_AXIS (the whole axis)."""
    IS_INT: tl.constexpr = code_field(CODE, "is_int")
    ROUNDING: tl.constexpr = code_field(CODE, "rounding")
    bits = x3.to(tl.int32, bitcast=True)
    amax = tl.max(bits & 0x7FFFFFFF, axis=BLOCK_AXIS)
    special = amax >= 0x7F800000
    s = _scale_exponent(tl.where(special, 0, amax), CODE)
    inert = special | (amax == 0)  # all-zero and NaN/Inf blocks: any scale in range gives their values
    s_each = tl.expand_dims(tl.where(inert, 0, s), BLOCK_AXIS)  # broadcast against the elements
    special_each = tl.expand_dims(special, BLOCK_AXIS)
    # Floating-point formats with nearest even or stochastic rounding are exact for every scale (docs/numerics.md):
    # no tile-wide test of the scales' range, whose reduction crosses the warps.
    if code_field(CODE, "hw_fp8"):
        y = _fake_quant_fast(bits, s_each, special_each, r24, CODE)
    elif ROUNDING == ROUND_STOCHASTIC and not IS_INT:
        y = _stochastic_scaled(bits, s_each, special_each, r24, CODE).to(tl.float32, bitcast=True)
    elif (
        ROUNDING == ROUND_NEAREST_EVEN and not IS_INT
    ):  # nearest even without the FP8 conversion: FP4/FP6, the interpreter
        y = _nearest_scaled(bits, s_each, special_each, CODE).to(tl.float32, bitcast=True)
    elif ROUNDING == ROUND_NEAREST_EVEN or ROUNDING == ROUND_STOCHASTIC:  # INT8
        if _every_block(_fast_path_ok(s, inert, CODE), BLOCK_AXIS):
            y = _fake_quant_fast(bits, s_each, special_each, r24, CODE)
        else:
            y = _fake_quant_integer(x3, s, special, r24, BLOCK_AXIS, CODE)
    else:
        y = _fake_quant_integer(x3, s, special, r24, BLOCK_AXIS, CODE)
    return y


@triton.jit
def _fake_quant_fast(bits, s, special, r24, CODE: tl.constexpr):
    """Fake-quantized float32 values of blocks whose every scale passes `_fast_path_ok`, by the cast kernels' fast
    paths: the GPU's FP8 conversion (the code's hw_fp8), or their integer nearest-even or stochastic steps (which
    give the exact path's bits there: docs/numerics.md, "The cast kernels"); NaN in `special` blocks. Codes are not
    used."""
    if code_field(CODE, "hw_fp8"):
        _, value = _quantize_hw_fp8(bits, s, special, CODE)  # special blocks: NaN through the NaN factor
    else:
        if code_field(CODE, "rounding") == ROUND_NEAREST_EVEN:
            _, value = _quantize_fast(bits, s, CODE)
        else:
            _, value = _quantize_fast_stochastic(bits, s, r24, CODE)
        value = tl.where(special, 0x7FC00000, value)
    return value.to(tl.float32, bitcast=True)


@triton.jit
def _fake_quant_integer(x3, s, special, r24, BLOCK_AXIS: tl.constexpr, CODE: tl.constexpr):
    """The integer steps for blocks along BLOCK_AXIS with scale exponents s; NaN in `special` blocks."""
    values = _fake_quant_elements(x3, tl.expand_dims(s, BLOCK_AXIS), r24, CODE)
    nan = (x3.to(tl.int32, bitcast=True) * 0 + 0x7FC00000).to(tl.float32, bitcast=True)
    return tl.where(tl.expand_dims(special, BLOCK_AXIS), nan, values)


@triton.jit
def fake_quant_tile(x, r24, ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, CODE: tl.constexpr):
    """Fake-quantize a float32 (ROWS, COLS) tile in blocks of 32 along AXIS (0: down the rows,
    1: along each row); the blocks start at the tile's first row/column. Returns float32.
    r24: the elements' 24 random bits, an int32 (ROWS, COLS) tile when CODE rounds stochastically
    (anything, e.g. 0, otherwise). A tile exactly one block long along AXIS is reduced in place."""
    STOCHASTIC: tl.constexpr = code_field(CODE, "rounding") == ROUND_STOCHASTIC
    if AXIS == 1:
        if COLS == 32:
            y = _fake_quant_blocks(x, r24, 1, CODE)
        else:
            bits = tl.reshape(r24, (ROWS, COLS // 32, 32)) if STOCHASTIC else r24
            y = tl.reshape(_fake_quant_blocks(tl.reshape(x, (ROWS, COLS // 32, 32)), bits, 2, CODE), (ROWS, COLS))
    else:
        if ROWS == 32:
            y = _fake_quant_blocks(x, r24, 0, CODE)
        else:
            bits = tl.reshape(r24, (ROWS // 32, 32, COLS)) if STOCHASTIC else r24
            y = tl.reshape(_fake_quant_blocks(tl.reshape(x, (ROWS // 32, 32, COLS)), bits, 1, CODE), (ROWS, COLS))
    return y


@triton.jit
def token_random_bits(tokens, columns, width, seed_key):
    """24 random bits (int32, (len(tokens), len(columns))) of the elements (token, column) of a packed
    (tokens, width) tensor: `random_bits24` of the linear index token * width + column (int64), with
    seed_key = mix32(seed). For (tokens, heads, head_dim) tensors, column = head * head_dim + d."""
    index = tokens.to(tl.int64)[:, None] * width + columns[None, :]
    return _random_bits24(index, seed_key, True)


@triton.jit
def score_random_bits(query_rows, head, heads, keys, seed_key, KEYS_FIRST: tl.constexpr):
    """24 random bits (int32, (len(query_rows), len(keys)), or (len(keys), len(query_rows)) when KEYS_FIRST) of
    the scores (query row, head, key): query_rows are global rows of the packed queries, keys indices within the
    sequence; `random_bits24` of the counter keys * 2^32 + query_row * heads + head (the host keeps query_row *
    heads + head < 2^32), with seed_key = mix32(seed). The first mix runs once per row."""
    row_key = _mix32((query_rows.to(tl.int64) * heads + head).to(tl.uint32) ^ seed_key.to(tl.uint32))
    if KEYS_FIRST:
        hashed = _mix32(row_key[None, :] ^ keys.to(tl.uint32)[:, None])
    else:
        hashed = _mix32(row_key[:, None] ^ keys.to(tl.uint32)[None, :])
    return (hashed >> 8).to(tl.int32)


__all__ = ["operand_code", "fake_quant_tile", "token_random_bits", "score_random_bits", "ROUND_STOCHASTIC", "BLOCK"]
