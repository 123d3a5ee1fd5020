"""Rotary position embeddings in one pass: read x (tokens, heads, head_dim), write the rotated x.

The PyTorch formula (`mxlab.nn.rotary.rotary_embedding`) makes float32 copies of both halves,
four products, a difference, a sum, a concatenation and a cast, forward and backward: about twenty
passes over a (tokens, heads, head_dim) tensor. Here one program reads a tile of tokens of one head
once, rotates it in float32 registers with the same cos / sin table (`mxlab.nn.rotary.rotary_table`)
and writes it once in x's dtype; the backward is the same kernel with the angle negated (a rotation's
transpose). The result agrees with the PyTorch formula to float32 rounding (the kernel may fuse a
product into the difference) before the cast to x's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

TOKENS_PER_PROGRAM = 64


@triton.jit
def _rotary_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    total,
    stride_t,
    stride_h,
    out_stride_t,
    out_stride_h,
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
    INVERSE: tl.constexpr,
):
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, HALF)
    keep = (rows < total)[:, None]
    table = rows[:, None].to(tl.int64) * HALF + cols[None, :]
    cos = tl.load(cos_ptr + table, mask=keep, other=0.0)
    sin = tl.load(sin_ptr + table, mask=keep, other=0.0)
    if INVERSE:
        sin = -sin
    source = x_ptr + rows[:, None].to(tl.int64) * stride_t + head * stride_h + cols[None, :]
    x1 = tl.load(source, mask=keep, other=0.0).to(tl.float32)
    x2 = tl.load(source + HALF, mask=keep, other=0.0).to(tl.float32)
    target = out_ptr + rows[:, None].to(tl.int64) * out_stride_t + head * out_stride_h + cols[None, :]
    tl.store(target, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=keep)
    tl.store(target + HALF, (x1 * sin + x2 * cos).to(out_ptr.dtype.element_ty), mask=keep)


def unsupported_reason(x: torch.Tensor) -> str | None:
    """Why `rotate` cannot run x (a sentence), or None when it can."""
    if x.dim() != 3:
        return f"x must be (tokens, heads, head_dim), got shape {tuple(x.shape)}"
    half = x.shape[-1] // 2
    if x.shape[-1] % 2 or half < 1 or half & (half - 1):
        return f"head_dim {x.shape[-1]} is not twice a power of two"
    if x.stride(-1) != 1:
        return f"the head dim of x must be contiguous, got strides {x.stride()}"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype} is not supported; accepted: bfloat16, float16, float32"
    return None


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    total, heads, head_dim = x.shape
    if total and heads:
        grid = (triton.cdiv(total, TOKENS_PER_PROGRAM), heads)
        _rotary_kernel[grid](
            x,
            out,
            cos,
            sin,
            total,
            x.stride(0),
            x.stride(1),
            out.stride(0),
            out.stride(1),
            HALF=head_dim // 2,
            BLOCK_T=TOKENS_PER_PROGRAM,
            INVERSE=inverse,
        )
    return out


class _RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, inverse=False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return _launch(grad.contiguous(), cos, sin, inverse=True), None, None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (tokens, heads, head_dim) rotated pairwise (i, i + head_dim/2) by the angle whose cos and sin
    (float32, contiguous (tokens, head_dim/2)) are given; contiguous, x's dtype, differentiable in x.
    Refuses (ValueError) what `unsupported_reason` names and a table of another shape or dtype."""
    reason = unsupported_reason(x)
    if reason is not None:
        raise ValueError(reason)
    expected = (x.shape[0], x.shape[-1] // 2)
    for name, table in (("cos", cos), ("sin", sin)):
        if tuple(table.shape) != expected or table.dtype != torch.float32 or not table.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous float32 tensor of shape {expected}, "
                f"got {table.dtype} {tuple(table.shape)}"
            )
    return _RotaryFunction.apply(x, cos, sin)


__all__ = ["rotate", "unsupported_reason", "TOKENS_PER_PROGRAM"]
