"""Host launches of the jagged attention kernels besides the three attention kernels: the pre-quantized copies
of Q, K, V, dO (`_head_dim_quantized` along the head dim, `_prequantized` along the tokens), the row dots of the
BF16 backward, and the constexprs the kernels share."""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl

from mxlab.kernels.attention.codes import _hardware_fp8, _RowCast
from mxlab.kernels.attention.device import _prequantize, _row_dot
from mxlab.kernels.attention.tiles import TileSizes, _interpreting, _tiles
from mxlab.kernels.cast import CastLaunch, fake_quantize


def _dtype_constexpr(dtype: torch.dtype) -> Any:
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def _prequantized(
    x: torch.Tensor, offsets: torch.Tensor, code: int, dot_with: torch.Tensor | None = None, seed_key: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x fake-quantized (bfloat16) with `code` along the tokens of each sequence, blocks of 32 from each
    sequence's first token; with `dot_with` (contiguous, x's shape) the (heads, tokens) float32 sums over the
    head dim of x * dot_with, else None). seed_key: `seed_key` of the seed (stochastic codes only). Along the
    head dim: `_head_dim_quantized`."""
    if not x.is_contiguous():
        raise ValueError(f"_prequantized needs a contiguous (tokens, heads, head_dim) tensor; got strides {x.stride()}")
    seq, start = _tiles(offsets, x.shape[0], None, 32)
    along_t = torch.empty(x.shape, device=x.device, dtype=torch.bfloat16)
    row_dots = None
    if dot_with is not None:
        if dot_with.shape != x.shape or not dot_with.is_contiguous():
            raise ValueError(f"_prequantized: dot_with must be a contiguous tensor of shape {tuple(x.shape)}")
        row_dots = torch.empty(x.shape[1], x.shape[0], device=x.device, dtype=torch.float32)
    width = x.shape[1] * x.shape[2]  # a token's heads side by side: one program covers all of them
    if seq.numel() and width:
        columns = min(triton.next_power_of_2(width), max(_PREQUANTIZE_COLUMNS, x.shape[2]))
        _prequantize[(seq.numel(), triton.cdiv(width, columns))](
            x,
            along_t,
            dot_with if dot_with is not None else x,
            row_dots if row_dots is not None else x,
            offsets,
            seq,
            start,
            width,
            width,
            x.shape[0],
            seed_key,
            COLS=columns,
            CODE=code,
            ROW_DOT=dot_with is not None,
            HEAD_DIM=x.shape[2],
            num_warps=_prequantize_warps(columns, code, dot_with is not None),
        )
    return along_t, row_dots


def _head_dim_quantized(x: torch.Tensor, cast: _RowCast, launch: CastLaunch) -> torch.Tensor:
    """x (contiguous (tokens, heads, head_dim)) fake-quantized along the head dim, bfloat16, by the cast kernels'
    row fake-quantize of the (tokens, heads * head_dim) view: blocks of 32 never cross a head, and the
    stochastic counter is the element's index in that view, as the reference counts it. On the H200 at the h200
    step's history shape: 0.373 ms, where `_prequantize` took 0.975 ms for the same copy when it still had a
    head-dim mode (docs/performance.md, "The attention's pre-quantization launches")."""
    rows = fake_quantize(
        x.view(x.shape[0], -1),
        cast.fmt,
        axis=-1,
        scale_mode=cast.scale_mode,
        rounding=cast.rounding,
        seed=cast.seed,
        _launch=launch,
    )
    return rows.view(x.shape).to(torch.bfloat16)


# Columns (heads x head_dim) of one `_prequantize` program: 128, or one head when it is wider (the row dots
# sum whole heads; every supported head dim is a power of two up to 256). On the H200 at the h200 step's
# history shape, 128-column programs beat 256-column ones for every code and axis (0.25-0.88x the time,
# docs/performance.md, "The attention's pre-quantization launches").
_PREQUANTIZE_COLUMNS = 128


def _prequantize_warps(columns: int, code: int, row_dot: bool = False) -> int:
    """One warp per 64 columns, two for the row dots beside a code without the hardware FP8 conversion: at one
    warp per 64 those programs take 255 registers (stochastic) and 171 (e2m1), at two 114 and 79
    (`mxlab bench attention-sass`; not timed). Without the row dots one warp per 64 ran fastest on the H200 for
    every code (docs/performance.md, "The attention's pre-quantization launches"; the quantization steps of 40b21d0)."""
    if _interpreting():
        return 1
    return max(1, columns // (32 if row_dot and not _hardware_fp8(code) else 64))


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(heads, tokens) float32 sums over the head dim of a * b, both contiguous (tokens, heads, head_dim)."""
    tokens, heads, head_dim = a.shape
    out = torch.empty(heads, tokens, device=a.device, dtype=torch.float32)
    rows = tokens * heads
    if rows:
        block_rows = 64
        _row_dot[(triton.cdiv(rows, block_rows),)](
            a, b, out, rows, heads, tokens, HEAD_DIM=head_dim, BLOCK_ROWS=block_rows, num_warps=4
        )
    return out


def _launch_options(x: torch.Tensor, silu: bool, causal: bool, quant: bool, tiles: TileSizes) -> dict[str, Any]:
    """Constexpr arguments and launch options shared by the three attention kernels (a cached
    dict: callers unpack it and never change it)."""
    return _cached_launch_options(x.dtype, x.shape[2], silu, causal, quant, tiles, _interpreting())


@functools.lru_cache(maxsize=256)
def _cached_launch_options(
    dtype: torch.dtype, head_dim: int, silu: bool, causal: bool, quant: bool, tiles: TileSizes, interpreting: bool
) -> dict[str, Any]:
    s_dtype = _dtype_constexpr(dtype)
    op_dtype = tl.bfloat16 if quant else s_dtype
    return dict(
        HEAD_DIM=head_dim,
        CAUSAL=causal,
        SILU=silu,
        QUANT=quant,
        S_DTYPE=s_dtype,
        OP_DTYPE=op_dtype,
        DOT_DTYPE=tl.float32 if interpreting else op_dtype,
        BY_BITS=interpreting,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
