"""Tile sizes `mxlab bench attention` times besides the defaults, and `precompile_kernels`: every kernel variant
the tests and the bench use compiled ahead, in parallel processes (Triton compiles one variant at a time per
process; its cache on disk is shared)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import astuple
from typing import Any

import torch

from mxlab.bench.attention.shapes import CROSS_TOKENS, HEAD_DIM, HEADS, mx_policy, offsets_of, tiles_text


def mx_tile_candidates() -> list[Any]:
    """MX tile sizes timed next to the default on the self shape: the same 16 scores per thread as the default
    at 8 warps (twice the rows per program: half the key/value loads per query row), without spills on sm_90
    (`mxlab bench attention-sass`)."""
    from mxlab.kernels.attention import TileSizes

    return [TileSizes(128, 32, 32, 128, 128, 32, 8, 2), TileSizes(128, 32, 32, 64, 128, 32, 8, 2)]


def sweep_candidates() -> list[Any]:
    """The tile sizes of `--sweep-tiles`."""
    from mxlab.kernels.attention import TileSizes

    return [
        TileSizes(128, 64, 128, 64, 128, 64, 8, 2),
        TileSizes(128, 64, 64, 64, 64, 64, 4, 2),  # the BF16 default
        TileSizes(128, 64, 64, 64, 64, 64, 4, 3),
        TileSizes(128, 128, 64, 64, 64, 64, 8, 3),
        TileSizes(128, 128, 64, 64, 64, 64, 8, 2),
        TileSizes(128, 128, 64, 128, 128, 64, 8, 2),
        TileSizes(128, 64, 128, 64, 128, 64, 8, 3),
        TileSizes(64, 32, 32, 64, 64, 32, 4, 2),  # the MX default
        TileSizes(64, 64, 64, 64, 64, 64, 8, 2),
        TileSizes(128, 32, 32, 128, 128, 32, 8, 2),
        TileSizes(64, 32, 32, 64, 64, 32, 4, 3),
        TileSizes(128, 64, 128, 64, 128, 64, 8, 2, fused_dq=True),
        TileSizes(64, 32, 32, 64, 64, 32, 4, 2, fused_dq=True),
    ]


def _compile_one(mode: str, causal: bool, activation: str, tile_fields: tuple | None) -> str:
    """Run the kernel once, forward + backward, on a tiny batch with the benchmark's heads and head
    dim, so that its compiled variants land in Triton's on-disk cache. Returns what it did.
    (Tiles travel as a tuple of TileSizes fields: a worker imports the kernels only here.)"""
    from mxlab.kernels.attention import AttentionLaunch, TileSizes, jagged_attention

    launch = AttentionLaunch(tiles=TileSizes(*tile_fields) if tile_fields is not None else None)
    device = torch.device("cuda")
    lengths = torch.tensor([40, 70, 5], device=device)
    offsets = offsets_of(lengths)
    q, k, v = (
        torch.randn(int(offsets[-1]), HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    policy = mx_policy() if mode == "mxfp8" else None
    out = jagged_attention(
        q, k, v, offsets, offsets, causal=causal, activation=activation, policy=policy, _launch=launch
    )
    out.backward(torch.ones_like(out))
    q_cross = torch.randn(3 * CROSS_TOKENS, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, requires_grad=True)
    if not causal:
        cross = jagged_attention(
            q_cross,
            k,
            v,
            offsets_of(torch.full_like(lengths, CROSS_TOKENS)),
            offsets,
            activation=activation,
            policy=policy,
            _launch=launch,
        )
        cross.backward(torch.ones_like(cross))
    torch.cuda.synchronize()
    tiles = tiles_text(launch.tiles) if launch.tiles is not None else "default tiles"
    return f"{mode} causal={causal} {activation} {tiles}"


def precompile_kernels(sweep: bool = False, processes: int = 12, print_fn: Callable[[str], None] = print) -> None:
    """Compile every kernel variant the tests and the bench use, in parallel processes (`sweep`: the tile sweep's
    too)."""
    import concurrent.futures
    import multiprocessing

    from mxlab.kernels.attention import DEFAULT_MX_TILES, mx_tiles_problem

    jobs: list[tuple] = [
        (mode, causal, activation, None)
        for mode in ("bf16", "mxfp8")
        for causal in (False, True)
        for activation in ("softmax", "silu")
    ]
    jobs += [("bf16", False, "softmax", astuple(DEFAULT_MX_TILES))]
    jobs += [("mxfp8", False, "softmax", astuple(tiles)) for tiles in mx_tile_candidates()]
    if sweep:
        jobs += [
            (mode, False, "softmax", astuple(tiles))
            for tiles in sweep_candidates()
            for mode in ("bf16", "mxfp8")
            if mode == "bf16" or mx_tiles_problem(tiles, softmax=True) is None
        ]
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(processes, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(_compile_one, *job) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            try:
                print_fn(f"compiled {future.result()}")
            except Exception as error:  # report and go on: the timed run will show the failure too
                print_fn(f"compile failed: {type(error).__name__}: {str(error)[:300]}")
    print_fn(f"precompiled {len(jobs)} configurations in {time.perf_counter() - started:.1f} s")
