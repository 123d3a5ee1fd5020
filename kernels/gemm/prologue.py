"""The fused MX GEMM's prologue: one operand tile loaded and fake-quantized in registers.

An operand is read as a (rows, contraction) matrix through its strides, whatever its stored layout, so
the blocks of 32 always run along the contraction axis. `load_quantized_tile` loads a (BLOCK_R, 32) tile
of it (one K-block; masked rows and columns read as zeros, which is the reference's zero padding), applies
the random Hadamard transform of block 32 along the contraction axis if asked (the cast kernels'
`_random_hadamard_bits`), draws the stochastic-rounding bits from each element's counter and fake-quantizes
the tile with the cast kernels' device code (`_fake_quant_blocks` of kernels/_mx_device.py: the integer steps
of docs/numerics.md, or the hardware FP8 conversion where the operand code carries HW_FP8), so the values
equal `mxlab.numerics.reference.fake_quantize_blocks` bit for bit:

- 1-D blocks: each row of the tile is one block.
- (32, 32) tiles: the tile is viewed as (BLOCK_R / 32, 1024), 32 consecutive rows times the 32 columns,
  and each row of that view is one block; transpose-invariant, so the stored layout's orientation does not
  matter.

The counter of element (batch b, row r, contraction index k) is `b * cb + r * cr + k * ck` (int64), the
host's strides of the element's linear index in the tensor that the reference quantizes (the operand in
its stored layout, zero-padded along the contraction axis when a Hadamard transform runs).

`quantized_operand_kernel` stores the prologue's output: the test variant that shows the operands the GEMM
multiplies (tests/kernels/gemm/).

Device helpers imported from the cast kernels (one place to repoint): `_fake_quant_blocks`,
`_scale_exponent`, `_pow2`, `operand_code` (kernels/_mx_device.py); `_load_bits`, `_f32_bits_to_output`, `_random_bits24`,
`_random_hadamard_bits` (kernels/cast/bits.py), `hardware_fp8_applies`, `HADAMARD_COMPILE_OPTIONS`,
`DTYPE_KINDS` (kernels/cast/launch.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from mxlab.kernels._mx_device import _fake_quant_blocks, _pow2, _scale_exponent, operand_code
from mxlab.kernels.cast.bits import _f32_bits_to_output, _load_bits, _random_bits24, _random_hadamard_bits
from mxlab.kernels.cast.launch import DTYPE_KINDS, HADAMARD_COMPILE_OPTIONS, hardware_fp8_applies

BLOCK = 32  # host side
K_BLOCK = tl.constexpr(32)  # device side: Triton reads only constexpr globals
STOCHASTIC_ROUNDING = tl.constexpr(3)  # the ROUNDING field of an operand code

__all__ = ["load_quantized_tile", "block_exponents", "quantized_operand_kernel", "operand_code", "hardware_fp8_applies",
           "HADAMARD_COMPILE_OPTIONS", "DTYPE_KINDS", "_pow2", "_f32_bits_to_output", "BLOCK", "K_BLOCK"]


@triton.jit
def _load_tile(ptr, rows, k0, R, K, stride_r, stride_k, IN_KIND: tl.constexpr, CONVERT_BF16: tl.constexpr):
    """float32 (len(rows), 32) tile of the (R, K) matrix at contraction columns k0 .. k0 + 31 (zeros outside)."""
    cols = k0 + tl.arange(0, K_BLOCK)
    mask = (rows[:, None] < R) & (cols[None, :] < K)
    offsets = rows.to(tl.int64)[:, None] * stride_r + cols.to(tl.int64)[None, :] * stride_k
    return _load_bits(ptr + offsets, mask, IN_KIND, CONVERT_BF16)


@triton.jit
def load_quantized_tile(ptr, rows, k0, R, K, stride_r, stride_k, counter_base, cr, ck, seed_key, hadamard_key,
                        CODE: tl.constexpr, SQUARE: tl.constexpr, HADAMARD: tl.constexpr, IN_KIND: tl.constexpr,
                        CONVERT_BF16: tl.constexpr):
    """(y, x): the float32 fake-quantized (len(rows), 32) tile y of K-block k0 // 32 of an operand read as (R, K) through
    (stride_r, stride_k); `counter_base` + r * cr + k * ck counts element (r, k) for stochastic rounding
    (seed_key = mix32(seed)); HADAMARD transforms each row's 32 elements first (hadamard_key = mix32(its seed)).
    Without HADAMARD, columns k >= K come back as zeros (the reference's padding); with it they hold what the
    transform gives them, as in the reference's padded transformed tensor. x: the tile as quantized (after
    the transform), for `block_exponents`."""
    BLOCK_R: tl.constexpr = rows.shape[0]
    bits = _load_tile(ptr, rows, k0, R, K, stride_r, stride_k, IN_KIND, CONVERT_BF16)
    if HADAMARD:
        bits = tl.reshape(_random_hadamard_bits(tl.reshape(bits, (1, 1, BLOCK_R, K_BLOCK)), hadamard_key, 3), (BLOCK_R, K_BLOCK))
    x = bits.to(tl.float32, bitcast=True)
    cols = k0 + tl.arange(0, K_BLOCK)
    if ((CODE >> 15) & 3) == STOCHASTIC_ROUNDING:
        index = counter_base + rows.to(tl.int64)[:, None] * cr + cols.to(tl.int64)[None, :] * ck
        r24 = _random_bits24(index, seed_key, True)
    else:
        r24 = 0
    if SQUARE:
        if ((CODE >> 15) & 3) == STOCHASTIC_ROUNDING:
            r24 = tl.reshape(r24, (BLOCK_R // K_BLOCK, K_BLOCK * K_BLOCK))
        y = tl.reshape(_fake_quant_blocks(tl.reshape(x, (BLOCK_R // K_BLOCK, K_BLOCK * K_BLOCK)), r24, 1, CODE), (BLOCK_R, K_BLOCK))
    else:
        y = _fake_quant_blocks(x, r24, 1, CODE)
    if not HADAMARD:
        y = tl.where(cols[None, :] < K, y, 0.0)
    return y, x


@triton.jit
def block_exponents(x, CODE: tl.constexpr, SQUARE: tl.constexpr):
    """(S per row, low per row) of a tile x as quantized (before rounding): S the unbiased E8M0 exponent of the
    row's block (of its 32-row group for SQUARE), and low where a finite nonzero block's quantum
    2^(S + emin - mbits) lies below 2^-126 (its values may then not fit bfloat16)."""
    MBITS: tl.constexpr = CODE & 7
    EMIN: tl.constexpr = ((CODE >> 3) & 31) - 16
    EMAX: tl.constexpr = (CODE >> 8) & 15
    SCALE_MODE: tl.constexpr = (CODE >> 13) & 3
    MMAX: tl.constexpr = ((CODE >> 17) & 127) << 16
    BLOCK_R: tl.constexpr = x.shape[0]
    magnitude = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if SQUARE:
        amax = tl.max(tl.reshape(magnitude, (BLOCK_R // K_BLOCK, K_BLOCK * K_BLOCK)), axis=1)
    else:
        amax = tl.max(magnitude, axis=1)
    special = amax >= 0x7F800000
    s = _scale_exponent(tl.where(special, 0, amax), MBITS, EMAX, MMAX, SCALE_MODE)
    low = (s + EMIN - MBITS < -126) & (amax != 0) & (~special)
    if SQUARE:
        s = tl.reshape(tl.broadcast_to(s[:, None], (BLOCK_R // K_BLOCK, K_BLOCK)), (BLOCK_R,))
        low = tl.reshape(tl.broadcast_to(low[:, None], (BLOCK_R // K_BLOCK, K_BLOCK)), (BLOCK_R,))
    return s, low


@triton.jit
def quantized_operand_kernel(x_ptr, out_ptr, R, K, KP, stride_b, stride_r, stride_k, cb, cr, ck, seed_key, hadamard_key,
                             CODE: tl.constexpr, SQUARE: tl.constexpr, HADAMARD: tl.constexpr, IN_KIND: tl.constexpr,
                             CONVERT_BF16: tl.constexpr, BLOCK_R: tl.constexpr):
    """Store the prologue's tiles: out (batch, R, KP) float32 contiguous, KP = K rounded up to 32."""
    pid_r = tl.program_id(0)
    k0 = tl.program_id(1) * K_BLOCK
    batch = tl.program_id(2).to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    y, _ = load_quantized_tile(x_ptr + batch * stride_b, rows, k0, R, K, stride_r, stride_k, batch * cb, cr, ck, seed_key,
                            hadamard_key, CODE, SQUARE, HADAMARD, IN_KIND, CONVERT_BF16)
    cols = k0 + tl.arange(0, K_BLOCK)
    offsets = batch * R * KP + rows.to(tl.int64)[:, None] * KP + cols[None, :]
    tl.store(out_ptr + offsets, y, mask=rows[:, None] < R)
