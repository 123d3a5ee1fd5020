"""The MX cast kernels: `_mx_kernel` (row blocks, (32, 32) tiles, the fused Hadamard cast) and
`_mx_column_tile_kernel` (column blocks, and row and column blocks from one read).

`_mx_kernel` loads a 4-D tile of a 3-D view (A, L, B) of x: (RB, RS, CB, 32), rows
`(pid_l * RB + rb) * RS + rs` of L and columns `(pid_b * CB + cb) * 32 + c` of B, and emits

- LAYOUT_ROW:  blocks of 32 along B (reduce the tile's last axis);
- LAYOUT_COL:  blocks of 32 along L (RS == 32; reduce axis 1; the fused Hadamard column cast only);
- LAYOUT_TILE: (32, 32) tiles (RS == 32; reduce axes 1 and 3).

`_mx_column_tile_kernel` loads a 2-D tile of 32 rows x CB * 32 columns of the same view and emits

- LAYOUT_COL:  blocks of 32 along L (reduce the tile's rows);
- LAYOUT_BOTH: those and blocks of 32 along B, from the one read.

Outputs are element codes (uint8, padded shape), scale bytes, and/or fake-quantized values in the input
dtype (unpadded shape), each contiguous in (A, L, B) order; `_mx_column_tile_kernel` can also store float32
column sums of each 32-row block of x (WANT_SUMS: a linear layer's bias gradient from the same read).
docs/numerics.md ("The cast kernels") gives the paths per tile and why each is exact.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mxlab.kernels.cast.bits import (
    KIND_FP32,
    LAYOUT_BOTH,
    LAYOUT_COL,
    LAYOUT_ROW,
    LAYOUT_TILE,
    ROUND_STOCHASTIC,
    _block_scales,
    _load_bits,
    _load_tile,
    _random_bits24,
    _random_hadamard_bits,
    _scale_bytes,
    code_field,
)
from mxlab.kernels.cast.emit import _quantize_tile


@triton.jit
def _program_ids(WIDE_INDEX: tl.constexpr):
    """(pid_l, pid_b, pid_a) of a cast launch's grid, int64 when WIDE_INDEX (offsets beyond int32)."""
    pid_l = tl.program_id(0)
    pid_b = tl.program_id(1)
    pid_a = tl.program_id(2)
    if WIDE_INDEX:
        pid_l = pid_l.to(tl.int64)
        pid_b = pid_b.to(tl.int64)
        pid_a = pid_a.to(tl.int64)
    return pid_l, pid_b, pid_a


@triton.jit(do_not_specialize=["seed_key", "hadamard_key"])  # seeds change every call: one compiled kernel
def _mx_kernel(
    x_ptr,
    row_codes_ptr,
    row_scales_ptr,
    row_values_ptr,
    col_codes_ptr,
    col_scales_ptr,
    col_values_ptr,
    L,
    B,
    LP,
    BP,
    stride_a,
    stride_l,
    stride_b,
    seed_key,
    hadamard_key,
    IN_KIND: tl.constexpr,
    OUT_KIND: tl.constexpr,
    LAYOUT: tl.constexpr,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    CODE: tl.constexpr,
    FAST: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
    RB: tl.constexpr,
    RS: tl.constexpr,
    CB: tl.constexpr,
    HADAMARD: tl.constexpr = False,
):
    """Quantize one (RB, RS, CB, 32) tile of the (A, L, B) view of x; see the module docstring.

    L, B: the view's sizes; LP, BP: the padded sizes of the codes (multiples of 32 along blocked
    dims). Codes and scales cover the padded shape, values the unpadded one. HADAMARD (LAYOUT_ROW or
    LAYOUT_COL, OUT_KIND float32): quantize the random Hadamard transform of the tile along the blocked
    axis (hadamard_key = mix32(Hadamard seed)); values then cover the padded shape too.
    """
    pid_l, pid_b, pid_a = _program_ids(WIDE_INDEX)
    rb = tl.arange(0, RB)[:, None, None, None]
    rs = tl.arange(0, RS)[None, :, None, None]
    cb = tl.arange(0, CB)[None, None, :, None]
    ce = tl.arange(0, 32)[None, None, None, :]
    row = (pid_l * RB + rb) * RS + rs
    col = (pid_b * CB + cb) * 32 + ce
    in_mask = (row < L) & (col < B)
    pointers = x_ptr + pid_a * stride_a + row * stride_l + col * stride_b
    bits = _load_bits(pointers, in_mask, IN_KIND, code_field(CODE, "hw_fp8"))
    if HADAMARD:  # the transformed tensor has the padded shape: its values and counters are the codes' places
        tl.static_assert(OUT_KIND == KIND_FP32, "the Hadamard transform writes float32 values")
        if LAYOUT == LAYOUT_ROW:
            bits = _random_hadamard_bits(bits, hadamard_key, 3)
            values_offsets = (pid_a * L + row) * BP + col
            values_mask = (row < L) & (col < BP)
        else:
            tl.static_assert(LAYOUT == LAYOUT_COL, "the Hadamard transform runs with LAYOUT_ROW or LAYOUT_COL")
            bits = _random_hadamard_bits(bits, hadamard_key, 1)
            values_offsets = (pid_a * LP + row) * B + col
            values_mask = (row < LP) & (col < B)
    else:
        values_offsets = (pid_a * L + row) * B + col
        values_mask = in_mask
    magnitude = bits & 0x7FFFFFFF
    if code_field(CODE, "rounding") == ROUND_STOCHASTIC:
        r24 = _random_bits24(values_offsets, seed_key, WIDE_INDEX)
    else:
        r24 = 0

    tl.static_assert(LAYOUT != LAYOUT_BOTH, "LAYOUT_BOTH runs in _mx_column_tile_kernel")
    if LAYOUT == LAYOUT_ROW:
        amax = tl.max(magnitude, axis=3)
        s, special, inert, path = _block_scales(amax, CODE)
        nbp = BP // 32
        srow = (pid_l * RB + tl.arange(0, RB)[:, None, None]) * RS + tl.arange(0, RS)[None, :, None]
        sblk = pid_b * CB + tl.arange(0, CB)[None, None, :]
        tl.store(
            row_scales_ptr + (pid_a * L + srow) * nbp + sblk, _scale_bytes(s, special), mask=(srow < L) & (sblk < nbp)
        )
        # the blocks' values broadcast against the tile, the codes' places, and the outputs
        s, special, inert = s[:, :, :, None], special[:, :, :, None], inert[:, :, :, None]
        code_rows, code_cols = L, BP
        codes_ptr, values_ptr = row_codes_ptr, row_values_ptr
    elif LAYOUT == LAYOUT_COL:
        tl.static_assert(HADAMARD, "LAYOUT_COL without the Hadamard transform runs in _mx_column_tile_kernel")
        amax = tl.max(magnitude, axis=1)
        s, special, inert, path = _block_scales(amax, CODE)
        sblk = pid_l * RB + tl.arange(0, RB)[:, None, None]
        scol = (pid_b * CB + tl.arange(0, CB)[None, :, None]) * 32 + tl.arange(0, 32)[None, None, :]
        tl.store(
            col_scales_ptr + (pid_a * (LP // 32) + sblk) * B + scol,
            _scale_bytes(s, special),
            mask=(sblk < LP // 32) & (scol < B),
        )
        s, special, inert = s[:, None, :, :], special[:, None, :, :], inert[:, None, :, :]
        code_rows, code_cols = LP, B
        codes_ptr, values_ptr = col_codes_ptr, col_values_ptr
    else:
        tl.static_assert(LAYOUT == LAYOUT_TILE, "_mx_kernel runs LAYOUT_ROW, LAYOUT_COL and LAYOUT_TILE")
        amax = tl.max(tl.max(magnitude, axis=3), axis=1)
        s, special, inert, path = _block_scales(amax, CODE)
        sblk = pid_l * RB + tl.arange(0, RB)[:, None]
        sbcol = pid_b * CB + tl.arange(0, CB)[None, :]
        tl.store(
            row_scales_ptr + (pid_a * (LP // 32) + sblk) * (BP // 32) + sbcol,
            _scale_bytes(s, special),
            mask=(sblk < LP // 32) & (sbcol < BP // 32),
        )
        s, special, inert = s[:, None, :, None], special[:, None, :, None], inert[:, None, :, None]
        code_rows, code_cols = LP, BP
        codes_ptr, values_ptr = row_codes_ptr, row_values_ptr
    _quantize_tile(
        bits,
        s,
        special,
        inert,
        path,
        r24,
        (pid_a * code_rows + row) * code_cols + col,
        (row < code_rows) & (col < code_cols),
        codes_ptr,
        values_ptr,
        values_offsets,
        values_mask,
        x_ptr,
        pid_l * (RB * RS),
        col,
        pid_a,
        L,
        B,
        code_rows,
        code_cols,
        stride_a,
        stride_l,
        stride_b,
        seed_key,
        IN_KIND,
        OUT_KIND,
        WANT_CODES,
        WANT_VALUES,
        CODE,
        FAST,
        WIDE_INDEX,
        HADAMARD,
        RB * RS,
        LAYOUT == LAYOUT_ROW,
    )


@triton.jit(do_not_specialize=["seed_key"])
def _mx_column_tile_kernel(
    x_ptr,
    row_codes_ptr,
    row_scales_ptr,
    row_values_ptr,
    col_codes_ptr,
    col_scales_ptr,
    col_values_ptr,
    L,
    B,
    LP,
    BP,
    stride_a,
    stride_l,
    stride_b,
    seed_key,
    IN_KIND: tl.constexpr,
    OUT_KIND: tl.constexpr,
    LAYOUT: tl.constexpr,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    CODE: tl.constexpr,
    FAST: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
    CB: tl.constexpr,
    sums_ptr=None,
    WANT_SUMS: tl.constexpr = False,
):
    """LAYOUT_COL (and LAYOUT_BOTH) in one pass: a 2-D tile of 32 rows x CB * 32 columns is loaded once, reduced
    along its rows (the column blocks' amax; for LAYOUT_BOTH also along each row's 32-column blocks) and quantized
    from registers; tiles off the common path are quantized row by row from memory again (`_quantize_tile`). The
    tile is 2-D on purpose: in a prototype of this kernel on the H200 (e4m3 column cast, 2 warps), the same tile
    loaded as a 3-D (32, CB, 32) block took 1.8x as long. WANT_SUMS: also store the float32 sum of each column
    over the tile's 32 rows (x as loaded, unquantized) at sums_ptr, a contiguous (A, LP // 32, B) float32 tensor."""
    tl.static_assert(
        LAYOUT == LAYOUT_COL or LAYOUT == LAYOUT_BOTH, "_mx_column_tile_kernel runs LAYOUT_COL and LAYOUT_BOTH"
    )
    pid_l, pid_b, pid_a = _program_ids(WIDE_INDEX)
    row = pid_l * 32 + tl.arange(0, 32)[:, None]
    col = pid_b * (CB * 32) + tl.arange(0, CB * 32)[None, :]
    bits, in_mask, values_offsets, r24 = _load_tile(
        x_ptr, row, col, pid_a, L, B, stride_a, stride_l, stride_b, seed_key, IN_KIND, CODE, WIDE_INDEX
    )
    amax = tl.max(bits & 0x7FFFFFFF, axis=0)
    s, special, inert, path = _block_scales(amax, CODE)
    scol = pid_b * (CB * 32) + tl.arange(0, CB * 32)
    tl.store(col_scales_ptr + (pid_a * (LP // 32) + pid_l) * B + scol, _scale_bytes(s, special), mask=scol < B)
    if WANT_SUMS:
        tl.store(
            sums_ptr + (pid_a * (LP // 32) + pid_l) * B + scol,
            tl.sum(bits.to(tl.float32, bitcast=True), axis=0),
            mask=scol < B,
        )
    _quantize_tile(
        bits,
        s[None, :],
        special[None, :],
        inert[None, :],
        path,
        r24,
        (pid_a * LP + row) * B + col,
        (row < LP) & (col < B),
        col_codes_ptr,
        col_values_ptr,
        values_offsets,
        in_mask,
        x_ptr,
        pid_l * 32,
        col,
        pid_a,
        L,
        B,
        LP,
        B,
        stride_a,
        stride_l,
        stride_b,
        seed_key,
        IN_KIND,
        OUT_KIND,
        WANT_CODES,
        WANT_VALUES,
        CODE,
        FAST,
        WIDE_INDEX,
        False,
        32,
        False,
    )
    if LAYOUT == LAYOUT_BOTH:
        row_amax = tl.max(tl.reshape(bits & 0x7FFFFFFF, (32, CB, 32)), axis=2)
        s_row, special_row, inert_row, path_row = _block_scales(row_amax, CODE)
        nbp = BP // 32
        srow = pid_l * 32 + tl.arange(0, 32)[:, None]
        sblk = pid_b * CB + tl.arange(0, CB)[None, :]
        tl.store(
            row_scales_ptr + (pid_a * L + srow) * nbp + sblk,
            _scale_bytes(s_row, special_row),
            mask=(srow < L) & (sblk < nbp),
        )
        col4 = (pid_b * CB + tl.arange(0, CB)[None, None, :, None]) * 32 + tl.arange(0, 32)[None, None, None, :]
        _quantize_tile(
            bits,
            _spread_blocks(s_row, CB),
            _spread_blocks(special_row, CB),
            _spread_blocks(inert_row, CB),
            path_row,
            r24,
            (pid_a * L + row) * BP + col,
            (row < L) & (col < BP),
            row_codes_ptr,
            row_values_ptr,
            values_offsets,
            in_mask,
            x_ptr,
            pid_l * 32,
            col4,
            pid_a,
            L,
            B,
            L,
            BP,
            stride_a,
            stride_l,
            stride_b,
            seed_key,
            IN_KIND,
            OUT_KIND,
            WANT_CODES,
            WANT_VALUES,
            CODE,
            FAST,
            WIDE_INDEX,
            False,
            32,
            True,
        )


@triton.jit
def _spread_blocks(per_block, CB: tl.constexpr):
    """(32, CB) per-block values as (32, CB * 32): each repeated over its block's 32 columns."""
    return tl.reshape(tl.broadcast_to(per_block[:, :, None], (32, CB, 32)), (32, CB * 32))
