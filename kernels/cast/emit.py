"""Quantize-and-store of a loaded tile for the MX cast kernels: the branch per tile path, and tiles off the
common path quantized row by row from memory again (docs/numerics.md: "The cast kernels")."""

from __future__ import annotations

import triton
import triton.language as tl

from mxlab.kernels.cast.bits import (
    PATH_FAST,
    PATH_FINITE,
    PATH_NORMAL_STOCHASTIC,
    ROUND_NEAREST_EVEN,
    ROUND_STOCHASTIC,
    _block_scales,
    _load_tile,
    code_field,
)
from mxlab.kernels.cast.elements import (
    _exact_elements,
    _fast_elements,
    _hw_fp8_finite_elements,
    _stochastic_normal_elements,
    _stochastic_path,
)


@triton.jit
def _store(
    code,
    out,
    out_offsets,
    out_mask,
    codes_ptr,
    values_ptr,
    values_offsets,
    values_mask,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
):
    if WANT_CODES:
        tl.store(codes_ptr + out_offsets, code.to(tl.uint8), mask=out_mask)
    if WANT_VALUES:
        tl.store(values_ptr + values_offsets, out, mask=values_mask)


@triton.jit
def _emit(
    bits,
    s,
    special,
    inert,
    path,
    r24,
    out_offsets,
    out_mask,
    codes_ptr,
    values_ptr,
    values_offsets,
    values_mask,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    OUT_KIND: tl.constexpr,
    CODE: tl.constexpr,
    FAST: tl.constexpr,
):
    """Quantize a tile (s, special, inert broadcast against bits; path: `_tile_path` of the tile, raised to
    PATH_NORMAL_STOCHASTIC by `_stochastic_path` where it applies; CODE: the kernel code) and store its codes and/or
    values. Each branch stores its own results, so no tile-sized value is merged across the branch
    (which would keep both paths' registers live)."""
    ROUNDING: tl.constexpr = code_field(CODE, "rounding")
    if FAST and (ROUNDING == ROUND_NEAREST_EVEN or ROUNDING == ROUND_STOCHASTIC):
        if code_field(CODE, "hw_fp8") and ROUNDING == ROUND_NEAREST_EVEN:
            if path == PATH_FINITE:
                fp8_code, fp8_out = _hw_fp8_finite_elements(bits, s, OUT_KIND, CODE)  # names of their own: other types
                _store(
                    fp8_code,
                    fp8_out,
                    out_offsets,
                    out_mask,
                    codes_ptr,
                    values_ptr,
                    values_offsets,
                    values_mask,
                    WANT_CODES,
                    WANT_VALUES,
                )
            else:
                _emit_fast_or_exact(
                    bits,
                    s,
                    special,
                    inert,
                    path,
                    r24,
                    out_offsets,
                    out_mask,
                    codes_ptr,
                    values_ptr,
                    values_offsets,
                    values_mask,
                    WANT_CODES,
                    WANT_VALUES,
                    OUT_KIND,
                    CODE,
                )
        elif ROUNDING == ROUND_STOCHASTIC and not code_field(CODE, "is_int"):
            if path == PATH_NORMAL_STOCHASTIC:
                sr_code, sr_out = _stochastic_normal_elements(bits, tl.where(inert, 0, s), r24, OUT_KIND, CODE)
                _store(
                    sr_code,
                    sr_out,
                    out_offsets,
                    out_mask,
                    codes_ptr,
                    values_ptr,
                    values_offsets,
                    values_mask,
                    WANT_CODES,
                    WANT_VALUES,
                )
            else:
                _emit_fast_or_exact(
                    bits,
                    s,
                    special,
                    inert,
                    path,
                    r24,
                    out_offsets,
                    out_mask,
                    codes_ptr,
                    values_ptr,
                    values_offsets,
                    values_mask,
                    WANT_CODES,
                    WANT_VALUES,
                    OUT_KIND,
                    CODE,
                )
        else:
            _emit_fast_or_exact(
                bits,
                s,
                special,
                inert,
                path,
                r24,
                out_offsets,
                out_mask,
                codes_ptr,
                values_ptr,
                values_offsets,
                values_mask,
                WANT_CODES,
                WANT_VALUES,
                OUT_KIND,
                CODE,
            )
    else:
        _emit_exact(
            bits,
            s,
            special,
            r24,
            out_offsets,
            out_mask,
            codes_ptr,
            values_ptr,
            values_offsets,
            values_mask,
            WANT_CODES,
            WANT_VALUES,
            OUT_KIND,
            CODE,
        )


@triton.jit
def _emit_fast_or_exact(
    bits,
    s,
    special,
    inert,
    path,
    r24,
    out_offsets,
    out_mask,
    codes_ptr,
    values_ptr,
    values_offsets,
    values_mask,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    OUT_KIND: tl.constexpr,
    CODE: tl.constexpr,
):
    """`_emit` of a tile on the fast path (path >= PATH_FAST: `_fast_elements`) or off it (`_emit_exact`)."""
    if path >= PATH_FAST:
        code, out = _fast_elements(bits, s, special, inert, r24, OUT_KIND, CODE)
        _store(
            code,
            out,
            out_offsets,
            out_mask,
            codes_ptr,
            values_ptr,
            values_offsets,
            values_mask,
            WANT_CODES,
            WANT_VALUES,
        )
    else:
        _emit_exact(
            bits,
            s,
            special,
            r24,
            out_offsets,
            out_mask,
            codes_ptr,
            values_ptr,
            values_offsets,
            values_mask,
            WANT_CODES,
            WANT_VALUES,
            OUT_KIND,
            CODE,
        )


@triton.jit
def _emit_exact(
    bits,
    s,
    special,
    r24,
    out_offsets,
    out_mask,
    codes_ptr,
    values_ptr,
    values_offsets,
    values_mask,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    OUT_KIND: tl.constexpr,
    CODE: tl.constexpr,
):
    """`_emit` of a tile on the exact integer path."""
    code, out = _exact_elements(bits, s, special, r24, OUT_KIND, CODE)
    _store(
        code, out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask, WANT_CODES, WANT_VALUES
    )


@triton.jit
def _quantize_tile(
    bits,
    s,
    special,
    inert,
    path,
    r24,
    code_offsets,
    code_mask,
    codes_ptr,
    values_ptr,
    values_offsets,
    values_mask,
    x_ptr,
    first_row,
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
    IN_KIND: tl.constexpr,
    OUT_KIND: tl.constexpr,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    CODE: tl.constexpr,
    FAST: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
    HADAMARD: tl.constexpr,
    TILE_ROWS: tl.constexpr,
    ROW_BLOCKS: tl.constexpr,
):
    """`_emit` for a tile of `_mx_kernel` (rows first_row + [0, TILE_ROWS)), except that a tile off the common
    path (fast path, no NaN/Inf block) is quantized row by row from memory again, so the rarely taken paths do
    not hold tile-sized values in registers: a kernel's register count is that of its largest branch, and it
    bounds how many tiles are in flight. Rows re-derive their scales when ROW_BLOCKS (blocks along the row),
    else take the tile's (s etc. broadcast along the rows). Not with HADAMARD (memory holds x, not its
    transform), nor for roundings without a fast path."""
    ROUNDING: tl.constexpr = code_field(CODE, "rounding")
    if FAST and not HADAMARD and (ROUNDING == ROUND_NEAREST_EVEN or ROUNDING == ROUND_STOCHASTIC):
        STOCHASTIC_FP: tl.constexpr = ROUNDING == ROUND_STOCHASTIC and not code_field(CODE, "is_int")
        COMMON: tl.constexpr = PATH_NORMAL_STOCHASTIC if STOCHASTIC_FP else PATH_FINITE
        path = _stochastic_path(bits, s, inert, path, CODE)
        if path == COMMON:
            _emit(
                bits,
                s,
                special,
                inert,
                COMMON,
                r24,
                code_offsets,
                code_mask,
                codes_ptr,
                values_ptr,
                values_offsets,
                values_mask,
                WANT_CODES,
                WANT_VALUES,
                OUT_KIND,
                CODE,
                FAST,
            )
        else:
            for tile_row in range(TILE_ROWS):
                _row_refetched(
                    x_ptr,
                    codes_ptr,
                    values_ptr,
                    tl.zeros((1, 1, 1, 1), tl.int32) + (first_row + tile_row),
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
                    s,
                    special,
                    inert,
                    path,
                    IN_KIND,
                    OUT_KIND,
                    WANT_CODES,
                    WANT_VALUES,
                    CODE,
                    WIDE_INDEX,
                    ROW_BLOCKS,
                )
    else:
        _emit(
            bits,
            s,
            special,
            inert,
            path,
            r24,
            code_offsets,
            code_mask,
            codes_ptr,
            values_ptr,
            values_offsets,
            values_mask,
            WANT_CODES,
            WANT_VALUES,
            OUT_KIND,
            CODE,
            FAST,
        )


@triton.jit
def _row_refetched(
    x_ptr,
    codes_ptr,
    values_ptr,
    row,
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
    tile_s,
    tile_special,
    tile_inert,
    tile_path,
    IN_KIND: tl.constexpr,
    OUT_KIND: tl.constexpr,
    WANT_CODES: tl.constexpr,
    WANT_VALUES: tl.constexpr,
    CODE: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
    ROW_BLOCKS: tl.constexpr,
):
    """Codes/values of one row (row: shape (1, 1, 1, 1)) of a tile, loaded again, for `_quantize_tile`: with
    ROW_BLOCKS the row's scales and path are derived again from the row (the same steps, so the same values as
    the tile's, already stored), else the tile's are used."""
    bits, in_mask, values_offsets, r24 = _load_tile(
        x_ptr, row, col, pid_a, L, B, stride_a, stride_l, stride_b, seed_key, IN_KIND, CODE, WIDE_INDEX
    )
    code_offsets = (pid_a * code_rows + row) * code_cols + col
    code_mask = (row < code_rows) & (col < code_cols)
    if ROW_BLOCKS:
        amax = tl.max(bits & 0x7FFFFFFF, axis=3)
        s, special, inert, path = _block_scales(amax, CODE)
        path = _stochastic_path(bits, s[:, :, :, None], inert[:, :, :, None], path, CODE)
        _emit(
            bits,
            s[:, :, :, None],
            special[:, :, :, None],
            inert[:, :, :, None],
            path,
            r24,
            code_offsets,
            code_mask,
            codes_ptr,
            values_ptr,
            values_offsets,
            in_mask,
            WANT_CODES,
            WANT_VALUES,
            OUT_KIND,
            CODE,
            True,
        )
    else:
        _emit(
            bits,
            tile_s,
            tile_special,
            tile_inert,
            _stochastic_path(bits, tile_s, tile_inert, tile_path, CODE),
            r24,
            code_offsets,
            code_mask,
            codes_ptr,
            values_ptr,
            values_offsets,
            in_mask,
            WANT_CODES,
            WANT_VALUES,
            OUT_KIND,
            CODE,
            True,
        )
