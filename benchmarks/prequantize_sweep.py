"""How fast the attention's `_prequantize` runs at the h200 step's history shape, against a copy, other launch shapes and prototypes.

An exploration for the training-step issue (not imported by the library). `benchmarks/step_anatomy.py` at the
h200 preset (batch 4096, histories up to 1024) puts 44 ms of the MX step in `_prequantize` (35 launches).
The first sweep (reports/benchmarks/prequantize_sweep.txt) found it at 2.3-2.7x a copy's time at its best
num_warps, where the cast kernels' row and column fake-quantize reach 0.85-0.91x of a copy's bandwidth. The
guesses at why, each tested here by a prototype that gives the same bits (checked before timing):

- `dense_rows`: the head-dim quantization needs no sequence boundaries; a plain grid over the tokens (no
  tile-table loads before the data load) with ROWS tokens per program;
- `dense_rows_3d`: the same with the tile loaded as (rows, column blocks, 32), as the cast kernels load theirs,
  so that the blocks need no reshape of a 2-D tile;
- the library kernel itself with 64 or 128 columns per program at 1-4 warps (the cast kernels' column tiles are
  32 x 128 at 2 warps);
- `blocks_per_tile`: the token-axis quantization as `_prequantize` does it, but each tile-table entry covers
  BLOCKS consecutive 32-token blocks of one sequence (fewer, longer programs).

It also times the cast kernels' own row fake-quantize (`mxlab.numerics.quant.fake_quantize`, axis -1) on the
(tokens, heads * head_dim) view, the same blocks as the head-dim quantization.

    python3 benchmarks/prequantize_sweep.py --json $OUT/prequantize_sweep.json
    python3 benchmarks/prequantize_sweep.py --by-code --json $OUT/prequantize_by_code.json
    TRITON_INTERPRET=1 python3 benchmarks/prequantize_sweep.py --device cpu --sequences 6 --max-length 100 --mean-length 40 --check-only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from mxlab.kernels._mx_device import _fake_quant_blocks, fake_quant_tile, operand_code
from mxlab.kernels.attention.device import _prequantize
from mxlab.kernels.attention.kernels import _sequence_tile
from mxlab.kernels.attention.tiles import _tiles
from mxlab.kernels.cast import hardware_fp8_applies
from mxlab.numerics.formats import get_format
from mxlab.numerics.quant import fake_quantize


@triton.jit
def _dense_rows(X, OUT, tokens, COLS: tl.constexpr, ROWS: tl.constexpr, CODE: tl.constexpr):
    """Prototype: blocks of 32 along the COLS columns of ROWS tokens per program, a plain grid over the tokens."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    ok = (rows < tokens)[:, None]
    index = rows[:, None] * COLS + cols[None, :]
    x = tl.load(X + index, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + index, fake_quant_tile(x, 0, ROWS, COLS, 1, CODE).to(tl.bfloat16), mask=ok)


@triton.jit
def _dense_rows_3d(X, OUT, tokens, COLS: tl.constexpr, ROWS: tl.constexpr, CODE: tl.constexpr):
    """Prototype: `_dense_rows` with the tile loaded as (ROWS, COLS // 32, 32), as the cast kernels load theirs, so
    the blocks need no reshape of a 2-D tile (a reshape may cost a layout conversion through shared memory)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None, None]
    cols = tl.arange(0, COLS // 32)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    ok = rows < tokens
    index = rows * COLS + cols
    x = tl.load(X + index, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + index, _fake_quant_blocks(x, 0, 2, CODE).to(tl.bfloat16), mask=ok)


@triton.jit
def _blocks_per_tile(
    X, OUT, offsets, tile_seq, tile_start, COLS: tl.constexpr, BLOCKS: tl.constexpr, CODE: tl.constexpr
):
    """Prototype: blocks of 32 tokens from each sequence's first token, BLOCKS of them per tile-table entry."""
    # the attention kernels' own tile lookup, the queries and keys both given `offsets` (strides unused: 0)
    _, begin, length, _, _, _, start, _, _, _, _ = _sequence_tile(
        offsets, offsets, tile_seq, tile_start, 0, 0, 0, 0, 32, False
    )
    cols = tl.arange(0, COLS)
    for block in tl.static_range(BLOCKS):
        rows = start + block * 32 + tl.arange(0, 32)
        ok = (rows < length)[:, None]
        index = (begin + rows)[:, None] * COLS + cols[None, :]
        x = tl.load(X + index, mask=ok, other=0.0).to(tl.float32)
        tl.store(OUT + index, fake_quant_tile(x, 0, 32, COLS, 0, CODE).to(tl.bfloat16), mask=ok)


def _library(x, offsets, code, along_d: bool, along_t: bool, warps: int, cols: int = 256, row_dot: bool = False):
    """The library's `_prequantize` launch of one orientation (or both; with row_dot, also the row dots of x with
    itself), `cols` columns per program, with its outputs."""
    tokens = x.shape[0]
    seq, start = _tiles(offsets, tokens, None, 32)
    out_d, out_t = torch.empty_like(x), torch.empty_like(x)
    row_dots = torch.empty(x.shape[1], tokens, device=x.device, dtype=torch.float32) if row_dot else x

    def launch() -> None:
        _prequantize[(seq.numel(), 256 // cols)](
            x,
            out_d,
            out_t,
            x,
            row_dots,
            offsets,
            seq,
            start,
            256,
            256,
            tokens,
            12345,
            67890,
            COLS=cols,
            D_CODE=code,
            T_CODE=code,
            ALONG_D=along_d,
            ALONG_T=along_t,
            ROW_DOT=row_dot,
            HEAD_DIM=64,
            num_warps=warps,
        )

    return launch, out_d, out_t


def _by_code(x, offsets, time_ms, record) -> None:
    """The launches the library makes with `_prequantize` (the head-dim-only ones go to the cast kernels) for the codes
    of the gem-synthetic arms, 256-column programs at 4 and 8 warps and 128-column ones at 2 and 4 (the narrower
    programs were faster along the tokens with the FP8 conversion, prequantize_sweep_session13.txt): does the 4-warp choice, measured with the FP8 conversion alone,
    suit the stochastic and integer codes too (benchmarks/prequantize_spills.txt: they spill 0.3-5 KB at 4 warps)?"""
    codes = {
        "e4m3 FP8 convert": operand_code(
            "e4m3", "rceil", "nearest_even", hw_fp8=hardware_fp8_applies(x.device, get_format("e4m3"), "nearest_even")
        ),
        "e4m3 stochastic": operand_code("e4m3", "rceil", "stochastic"),
        "e2m1 integer": operand_code("e2m1", "rceil", "nearest_even"),
        "e3m2 integer": operand_code("e3m2", "rceil", "nearest_even"),
    }
    kinds = {"tokens": (False, True, False), "both": (True, True, False), "both + row dots": (True, True, True)}
    for label, code in codes.items():
        for kind, (along_d, along_t, row_dot) in kinds.items():
            for cols, warps in ((256, 4), (256, 8), (128, 2), (128, 4)):
                launch = _library(x, offsets, code, along_d, along_t, warps, cols, row_dot)[0]
                record(
                    f"{label}, {kind}, {cols} columns, {warps} warps", time_ms(launch), 1 + along_d + along_t + row_dot
                )


def _write_json(path, tokens: int, copy_ms: float, rows: list) -> None:
    if path is not None:
        path.write_text(json.dumps({"tokens": tokens, "copy_ms": copy_ms, "rows": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--mean-length", type=int, default=362)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--check-only", action="store_true", help="check the prototypes' bits, time nothing")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--by-code",
        action="store_true",
        help="only the library's launches by code (FP8 convert, stochastic, integer) at a few columns and warps",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2 * args.mean_length, (args.sequences,), generator=generator).clamp(max=args.max_length)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
    tokens = int(lengths.sum())
    x = (torch.randn(tokens, 4, 64, generator=generator) * 4).bfloat16().to(device)
    code = operand_code(
        "e4m3", "rceil", "nearest_even", hw_fp8=hardware_fp8_applies(device, get_format("e4m3"), "nearest_even")
    )
    warps_list = (1,) if args.check_only else (4, 8)

    def time_ms(fn) -> float:
        fn()
        return float("nan") if args.check_only else triton.testing.do_bench(fn)

    copy_out = torch.empty_like(x)
    copy_ms = time_ms(lambda: copy_out.copy_(x))
    rows = []

    def record(name: str, ms: float, tensors_moved: int) -> None:
        rows.append({"launch": name, "ms": ms, "x_copy_time": ms / (copy_ms * tensors_moved / 2)})
        print(f"{name:<56} {ms:7.3f} ms  {rows[-1]['x_copy_time']:.2f}x a copy of the same bytes")

    print(f"{tokens} tokens x 256 bfloat16; copy {copy_ms:.3f} ms")
    if args.by_code:
        _by_code(x, offsets, time_ms, record)
        _write_json(args.json, tokens, copy_ms, rows)
        return
    for warps in warps_list:  # the library's launches, the reference bits for the prototypes
        launch, along_d, _ = _library(x, offsets, code, True, False, warps)
        record(f"library, along head dim, {warps} warps", time_ms(launch), 2)
        launch, _, along_t = _library(x, offsets, code, False, True, warps)
        record(f"library, along tokens, {warps} warps", time_ms(launch), 2)
    for cols in (64, 128):  # narrower programs, as the cast kernels' column tiles (32 x 128 at 2 warps)
        for warps in (1,) if args.check_only else (1, 2, 4):
            for along_d_only in (True, False):
                launch, out_d, out_t = _library(x, offsets, code, along_d_only, not along_d_only, warps, cols)
                ms = time_ms(launch)
                assert torch.equal(out_d if along_d_only else out_t, along_d if along_d_only else along_t)
                record(
                    f"library, along {'head dim' if along_d_only else 'tokens'}, {cols} columns, {warps} warps", ms, 2
                )
    cast = fake_quantize(x.view(tokens, 256), "e4m3", axis=-1, scale_mode="rceil")
    assert torch.equal(cast.view_as(x), along_d), (
        "the cast kernels' row fake-quantize differs from the head-dim quantization"
    )
    record(
        "cast kernels' row fake-quantize (along head dim)",
        time_ms(lambda: fake_quantize(x.view(tokens, 256), "e4m3", axis=-1, scale_mode="rceil")),
        2,
    )
    out = torch.empty_like(x)
    for name, kernel, rows_choices in (
        ("dense_rows", _dense_rows, (32, 64, 128)),
        ("dense_rows_3d", _dense_rows_3d, (32, 64)),
    ):
        for rows_per_program in rows_choices:
            for warps in warps_list:

                def dense() -> None:
                    kernel[(triton.cdiv(tokens, rows_per_program),)](
                        x, out, tokens, COLS=256, ROWS=rows_per_program, CODE=code, num_warps=warps
                    )

                ms = time_ms(dense)
                assert torch.equal(out, along_d), f"{name} ROWS={rows_per_program} differs"
                record(f"{name}, {rows_per_program} tokens, {warps} warps", ms, 2)
    for blocks in (1, 2, 4):
        seq, start = _tiles(offsets, tokens, None, 32 * blocks)
        for warps in warps_list:
            out.zero_()

            def tiled() -> None:
                _blocks_per_tile[(seq.numel(),)](
                    x, out, offsets, seq, start, COLS=256, BLOCKS=blocks, CODE=code, num_warps=warps
                )

            ms = time_ms(tiled)
            assert torch.equal(out, along_t), f"blocks_per_tile BLOCKS={blocks} differs"
            record(f"blocks_per_tile, {blocks} x 32 tokens, {warps} warps", ms, 2)
    print("every prototype gives the library's bits")
    _write_json(args.json, tokens, copy_ms, rows)


if __name__ == "__main__":
    main()
