"""Seeded random Hadamard transform over blocks along one axis.

For a block of b elements (b a power of two, 16..256), the transform is
y = (1/sqrt(b)) H_b (s * x), where H_b is the Sylvester Hadamard matrix and s a vector of
random signs. It is orthonormal, so applying the same transform to both operands of a
product along their contraction axis leaves the product unchanged: (T a)^T (T b) = a^T b.
This spreads outliers across a block before MX quantization (used on wgrad operands).

The signs are counter-based (mxlab.numerics.reference.random_bits24 of the position in the block and
the seed), so they are the same on every device. The butterfly runs in float32 in a fixed
order: stages h = 1, 2, 4, ..., b/2 pair element i with i + h as (a + c, a - c); the
1/sqrt(b) factor is one float32 multiply at the end.
"""

from __future__ import annotations

import math

import torch

from mxlab.numerics.reference import random_bits24

HADAMARD_BLOCKS = (16, 32, 64, 128, 256)


def hadamard_signs(block: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ±1 float32 sign vector of length `block` for `seed`."""
    bits = random_bits24(torch.arange(block, device=device, dtype=torch.int64), seed)
    return torch.where((bits & 1) == 1, -1.0, 1.0).to(torch.float32)


def _check(x: torch.Tensor, block: int, axis: int, seed: int) -> int:
    if block not in HADAMARD_BLOCKS:
        raise ValueError(f"unsupported Hadamard block {block!r}; accepted: {', '.join(map(str, HADAMARD_BLOCKS))}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} out of range for a tensor of {x.dim()} dims")
    axis = next(dim for dim in range(x.dim()) if axis % x.dim() == dim)  # a Python int under torch.compile too
    if x.shape[axis] % block:
        raise ValueError(f"dimension {axis} has size {x.shape[axis]}, not a multiple of the Hadamard block {block}")
    return axis


def _butterfly(blocks: torch.Tensor) -> torch.Tensor:
    """Unnormalized fast Walsh-Hadamard transform of the last dim (a power of two), in float32."""
    size = blocks.shape[-1]
    half = 1
    while half < size:
        pairs = blocks.reshape(*blocks.shape[:-1], size // (2 * half), 2, half)
        first, second = pairs[..., 0, :], pairs[..., 1, :]
        blocks = torch.stack((first + second, first - second), dim=-2).reshape(*blocks.shape[:-1], size)
        half *= 2
    return blocks


def _transform(x: torch.Tensor, block: int, axis: int, seed: int, inverse: bool) -> torch.Tensor:
    axis = _check(x, block, axis, seed)
    moved = x.float().movedim(axis, -1)
    blocks = moved.reshape(*moved.shape[:-1], moved.shape[-1] // block, block)
    signs = hadamard_signs(block, seed, x.device)
    norm = torch.tensor(1.0 / math.sqrt(block), dtype=torch.float32)
    if inverse:
        out = _butterfly(blocks) * norm * signs
    else:
        out = _butterfly(blocks * signs) * norm
    return out.reshape(moved.shape).movedim(-1, axis).to(x.dtype)


def random_hadamard(x: torch.Tensor, block: int = 32, axis: int = -1, seed: int = 0) -> torch.Tensor:
    """The random Hadamard transform of x over blocks of `block` along `axis` (x's dtype).

    Refuses a block outside 16..256 (powers of two) and an axis whose size is not a multiple of it.
    """
    return _transform(x, block, axis, seed, inverse=False)


def inverse_random_hadamard(y: torch.Tensor, block: int = 32, axis: int = -1, seed: int = 0) -> torch.Tensor:
    """Inverse of `random_hadamard` with the same block, axis and seed (x's dtype)."""
    return _transform(y, block, axis, seed, inverse=True)
