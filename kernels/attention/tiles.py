"""Tile sizes of the jagged attention kernels and their tile tables: (sequence, start) of every tile of every
sequence, computed on the device and cached on the offsets tensors themselves."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch


@dataclass(frozen=True)
class TileSizes:
    """Tile sizes (multiples of 32 for MX; powers of two >= 16) and launch options of the three kernels."""

    fwd_m: int = 128
    fwd_n: int = 64
    dkdv_m: int = 64
    dkdv_n: int = 64
    dq_m: int = 64
    dq_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    fused_dq: bool = False  # dQ by float32 atomics from the dK/dV kernel instead of its own kernel
    dkdv_max_registers: int | None = None  # ptxas register cap (Triton's maxnreg) of the dK/dV kernel; None: none

    def __post_init__(self) -> None:
        for name in ("fwd_m", "fwd_n", "dkdv_m", "dkdv_n", "dq_m", "dq_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"tile size {name}={value} must be a power of two >= 16")


# BF16: the fastest of `mxlab bench attention --sweep-tiles` on one H200 (512 log-normal sequences,
# 4 x 64): 3.98 ms forward + backward, against 4.33 ms for 128x64 tiles with 8 warps everywhere.
DEFAULT_TILES = TileSizes(fwd_m=128, fwd_n=64, dkdv_m=64, dkdv_n=64, dq_m=64, dq_n=64, num_warps=4, num_stages=2)
# MX: key tiles of 32 in the forward (the softmax contract's running-maximum step) and dQ (P and dS
# quantized along keys in one block per row),
# query tiles of 32 in dK/dV (P and dS along queries): no reshapes, no register spills on sm_90.
# dK/dV capped at 168 registers, the most that keeps three 4-warp blocks per SM (65536 registers, allocated
# 8 per thread at a time): uncapped, rceil took 171 (floor 168), rceil-sr 194 and e2m1 196, i.e. two blocks,
# and rceil's dK/dV ran 53.7 ms per step against floor's 39.3 on one H200 (docs/performance.md, "The attention
# kernels"). Capped, every format and rounding compiles without spills (`mxlab bench attention-sass`); on one H200
# the cap took rceil's step from 267.2 to 256.1 ms, rceil-sr's from 351.5 to 343.8, MXFP4's from 327.4 to 316.1
# (with a dQ cap of 96 too; reports/benchmarks/ab_register_caps.h200.txt). dQ is not capped: at 96 registers (five
# blocks per SM instead of four for stochastic gradients) it spilled 8 bytes and the rceil-sr step took 343.7 ms
# against 343.0 without.
DEFAULT_MX_TILES = TileSizes(
    fwd_m=64, fwd_n=32, dkdv_m=32, dkdv_n=64, dq_m=64, dq_n=32, num_warps=4, num_stages=2, dkdv_max_registers=168
)
INTERPRETER_TILES = TileSizes(fwd_m=32, fwd_n=32, dkdv_m=32, dkdv_n=32, dq_m=32, dq_n=32, num_warps=1, num_stages=1)


def mx_tiles_problem(tiles: TileSizes, softmax: bool) -> str | None:
    """Why MX mode cannot run with these tiles, or None: every tile size a multiple of 32 (whole quantization
    blocks), and with softmax a forward key tile of exactly 32 (its running row maximum moves once per MX
    block of keys, as the contract in docs/numerics.md says)."""
    for name in ("fwd_m", "fwd_n", "dkdv_m", "dkdv_n", "dq_m", "dq_n"):
        if getattr(tiles, name) % 32:
            return f"MX mode needs tile sizes that are multiples of 32; got {name}={getattr(tiles, name)}"
    if softmax and tiles.fwd_n != 32:
        return f"MX softmax moves its running maximum every 32 keys: it needs fwd_n=32; got fwd_n={tiles.fwd_n}"
    return None


_OFFSETS_CACHE_ATTRIBUTE = "_mxlab_jagged_attention_cache"
_Cached = TypeVar("_Cached")


def _tensor_version(tensor: torch.Tensor) -> int | None:
    """tensor._version, or None for tensors without a version counter (inference mode)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _cached_on_offsets(
    offsets: torch.Tensor, tag: tuple, other: torch.Tensor | None, compute: Callable[[], _Cached]
) -> _Cached:
    """compute(), cached on the offsets tensor itself (a Python attribute) under `tag` and the
    identity and version of `other` (a second tensor the result depends on, or None), for the
    current version of `offsets`: an in-place change of either tensor computes it again.
    Tensors without a version counter (inference mode) are not cached."""
    version = _tensor_version(offsets)
    other_version = _tensor_version(other) if other is not None else -1
    if version is None or other_version is None:
        return compute()
    cache = offsets.__dict__.get(_OFFSETS_CACHE_ATTRIBUTE)
    if cache is None or cache[0] != version:  # a new or changed offsets tensor: drop every entry
        cache = (version, {})
        setattr(offsets, _OFFSETS_CACHE_ATTRIBUTE, cache)
    key = (*tag, id(other), other_version)
    entry = cache[1].get(key)
    # The weak reference tells a live `other` from a new tensor that reuses a freed one's id.
    if entry is not None and (other is None or entry[0]() is other):
        return entry[1]
    value = compute()
    entries = cache[1]
    # Drop the entries of freed `other` tensors (offsets reused with per-batch partners would
    # otherwise keep every batch's tables alive).
    for dead in [key for key, (reference, _) in entries.items() if reference is not None and reference() is None]:
        del entries[dead]
    entries[key] = (weakref.ref(other) if other is not None else None, value)
    return value


def _tiles(
    offsets: torch.Tensor, tokens: int, work_offsets: torch.Tensor | None, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence index, start) int32 of every `block`-row tile of every non-empty run of `offsets`,
    the tiles of sequences with the longest runs in `work_offsets` first (None: in order).

    Computed on the device without a host synchronization: the table has a fixed size (tokens //
    block + sequences, an upper bound; `tokens` is the run's total length), and spare entries
    have sequence index -1. Cached on `offsets` (`_cached_on_offsets`): the layers of a model
    that share offsets, and the backward, compute it once.
    """
    return _cached_on_offsets(
        offsets, ("tiles", tokens, block), work_offsets, lambda: _compute_tiles(offsets, tokens, work_offsets, block)
    )


def _compute_tiles(
    offsets: torch.Tensor, tokens: int, work_offsets: torch.Tensor | None, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The uncached `_tiles`."""
    n = offsets.numel() - 1
    bound = tokens // block + n
    lengths = offsets[1:] - offsets[:-1]
    counts = (lengths + block - 1) // block
    ends = torch.cumsum(counts, 0)
    index = torch.arange(bound, device=offsets.device)
    seq = torch.searchsorted(ends, index, right=True)
    live = seq < n
    seq_clamped = seq.clamp(max=max(n - 1, 0))
    start = (index - (ends - counts)[seq_clamped]) * block if n else index
    seq = torch.where(live, seq, -1)
    if work_offsets is not None and n:
        work = work_offsets[1:] - work_offsets[:-1]
        key = torch.where(live, work[seq_clamped], -1)
        order = torch.argsort(key, descending=True, stable=True)
        seq, start = seq[order], start[order]
    return seq.to(torch.int32), start.to(torch.int32)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_tiles(quantized: bool, device: torch.device) -> TileSizes:
    """The tile sizes used when none are given: small ones under the interpreter."""
    if _interpreting() or device.type != "cuda":
        return INTERPRETER_TILES
    return DEFAULT_MX_TILES if quantized else DEFAULT_TILES
