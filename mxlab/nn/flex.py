"""FlexAttention helpers of `mxlab.nn.attention.JaggedAttention`'s "flex" backend: flex_attention (compiled once
on CUDA) and the BlockMask of padded jagged sequences built from their lengths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_compiled_flex: Callable[..., torch.Tensor] | None = None


def flex_attention_fn(device: torch.device) -> Callable[..., torch.Tensor]:
    """Return flex_attention, compiled once on CUDA (eager elsewhere, for tests)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def flex_available() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def length_block_mask(
    q_lengths: torch.Tensor,
    k_lengths: torch.Tensor,
    q_width: int,
    k_width: int,
    causal: bool,
    mask_mod: Callable[..., torch.Tensor],
    block_size: int = 128,
) -> Any:
    """Return a FlexAttention BlockMask for padded sequences, built from the lengths alone.

    Tile (i, j) of example b is visited when it holds a real query and a real key (and, for
    causal attention, j <= i); `mask_mod` masks inside the tiles. Costs O(n * tiles), never a
    dense (n, q_width, k_width) mask.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = q_lengths.device
    q_tiles = torch.arange(-(-q_width // block_size), device=device)
    k_tiles = torch.arange(-(-k_width // block_size), device=device)
    visited = (q_tiles[None, :, None] * block_size < q_lengths[:, None, None]) & (
        k_tiles[None, None, :] * block_size < k_lengths[:, None, None]
    )
    if causal:
        visited = visited & (k_tiles[None, None, :] <= q_tiles[None, :, None])
    kv_num_blocks = visited.sum(-1).to(torch.int32)[:, None]
    kv_indices = torch.argsort((~visited).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
    return BlockMask.from_kv_blocks(
        kv_num_blocks, kv_indices, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(q_width, k_width)
    )
