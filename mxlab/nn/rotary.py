"""Rotary position embeddings of jagged token sequences: the per-batch cos / sin table, the rotation (one
Triton kernel on CUDA, the PyTorch formula elsewhere), and each token's position inside its sequence."""

from __future__ import annotations

from typing import NamedTuple

import torch

from mxlab.numerics.quant import kernel_module


class RotaryTable(NamedTuple):
    """cos and sin (float32, contiguous (tokens, head_dim/2)) of the rotary angles of a token sequence."""

    cos: torch.Tensor
    sin: torch.Tensor


def rotary_table(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> RotaryTable:
    """The RotaryTable of `positions` (tokens,): angle position * base**(-2i/head_dim) for pair i, in
    float32. Computed once per batch and shared by every attention layer. Refuses an odd head_dim."""
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"rotary embeddings need an even head_dim; got {head_dim}")
    half = head_dim // 2
    inverse_frequency = base ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angle = positions.to(torch.float32)[:, None] * inverse_frequency[None, :]
    return RotaryTable(angle.cos(), angle.sin())


@torch._disable_dynamo  # torch.compiler.disable, importing torch._dynamo at the first call
def _kernel_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """mxlab.kernels.rotary.rotate, run outside any compiled graph (a graph break: a compiled model keeps eager
    mode's bits, and Inductor's partitioner never meets the kernel's buffers)."""
    return kernel_module("rotary").rotate(x, cos, sin)


def rotary_embedding(x: torch.Tensor, table: RotaryTable) -> torch.Tensor:
    """Return x (tokens, heads, head_dim) with its pairs (i, i + head_dim/2) rotated by the angles of
    `table` (`rotary_table` of the tokens' positions), in float32, cast back to x's dtype.

    On CUDA one Triton kernel reads x once and writes the result once (mxlab.kernels.rotary), forward
    and backward; elsewhere the PyTorch formula. Refuses a table whose shape does not match x.
    """
    if tuple(table.cos.shape) != (x.shape[0], x.shape[-1] // 2) or x.shape[-1] % 2:
        raise ValueError(
            f"the rotary table {tuple(table.cos.shape)} does not match x {tuple(x.shape)}: "
            "it needs (tokens, head_dim / 2) for an even head_dim"
        )
    if x.is_cuda:
        kernel = kernel_module("rotary")
        if kernel is not None and kernel.unsupported_reason(x) is None:
            return _kernel_rotate(x, table.cos, table.sin)
    half = x.shape[-1] // 2
    cos, sin = table.cos[:, None, :], table.sin[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def segment_positions(offsets: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """Return the position of each token inside its own sequence (0-based), shape (total,).

    `total` (the number of tokens, offsets[-1]) given spares reading it from the device."""
    lengths = offsets[1:] - offsets[:-1]
    total = int(offsets[-1]) if total is None else total
    starts = torch.repeat_interleave(offsets[:-1], lengths, output_size=total)
    return torch.arange(total, device=offsets.device) - starts
