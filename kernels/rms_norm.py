"""RMSNorm over the last dim of short rows (the model's QK-norm over a head), read through strides.

torch's fused rms_norm copies a strided input first (the queries and keys are views of one
projection's output) and works one row per block, slow on rows of 64. Here one program normalizes a
tile of rows of one head: it reads x through its strides once, accumulates the mean square in
float32, scales by the weight (cast to x's dtype, as `mxlab.models.gem.RMSNorm` casts it) and writes
a contiguous result in x's dtype. The backward reads x and the gradient once and writes the input
gradient; the weight gradient is summed per program and then over programs. Results agree with
`torch.nn.functional.rms_norm` to float32 rounding before the cast to x's dtype.
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

ROWS_PER_PROGRAM = 64


@triton.jit
def _rms_norm_fwd(x_ptr, w_ptr, out_ptr, rstd_ptr, rows_total, heads, stride_t, stride_h, eps,
                  N: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # row = token * heads + head
    cols = tl.arange(0, N)
    keep = (rows < rows_total)[:, None]
    token, head = rows // heads, rows % heads
    x = tl.load(x_ptr + token[:, None].to(tl.int64) * stride_t + head[:, None] * stride_h + cols[None, :],
                mask=keep, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(w_ptr + cols).to(out_ptr.dtype.element_ty).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=keep)
    tl.store(rstd_ptr + rows, rstd, mask=rows < rows_total)


@triton.jit
def _rms_norm_bwd(x_ptr, w_ptr, g_ptr, rstd_ptr, dx_ptr, dw_ptr, rows_total, heads, stride_t, stride_h,
                  N: tl.constexpr, BLOCK_R: tl.constexpr):
    program = tl.program_id(0)
    rows = program * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, N)
    keep = (rows < rows_total)[:, None]
    token, head = rows // heads, rows % heads
    x = tl.load(x_ptr + token[:, None].to(tl.int64) * stride_t + head[:, None] * stride_h + cols[None, :],
                mask=keep, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + rows, mask=rows < rows_total, other=0.0)
    w = tl.load(w_ptr + cols).to(dx_ptr.dtype.element_ty).to(tl.float32)
    normalized = x * rstd[:, None]
    wg = w[None, :] * g
    dx = rstd[:, None] * (wg - normalized * (tl.sum(wg * normalized, axis=1) / N)[:, None])
    tl.store(dx_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=keep)
    tl.store(dw_ptr + program * N + cols, tl.sum(g * normalized, axis=0))


def unsupported_reason(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why `rms_norm` cannot run these inputs (a sentence), or None when it can."""
    if x.dim() != 3:
        return f"x must be (tokens, heads, dim), got shape {tuple(x.shape)}"
    n = x.shape[-1]
    if n < 16 or n > 256 or n & (n - 1):
        return f"the normalized dim {n} is not a power of two from 16 to 256"
    if x.stride(-1) != 1:
        return f"the normalized dim of x must be contiguous, got strides {x.stride()}"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype} is not supported; accepted: bfloat16, float16, float32"
    if weight.shape != (n,) or weight.device != x.device:
        return f"the weight must be ({n},) on {x.device}, got {tuple(weight.shape)} on {weight.device}"
    return None


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        tokens, heads, n = x.shape
        rows = tokens * heads
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        if rows:
            _rms_norm_fwd[(triton.cdiv(rows, ROWS_PER_PROGRAM),)](x, weight, out, rstd, rows, heads, x.stride(0), x.stride(1),
                                                                  eps, N=n, BLOCK_R=ROWS_PER_PROGRAM)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        tokens, heads, n = x.shape
        rows = tokens * heads
        grad = grad.contiguous()
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        programs = triton.cdiv(rows, ROWS_PER_PROGRAM)
        dw_parts = torch.zeros(max(programs, 1), n, device=x.device, dtype=torch.float32)
        if rows:
            _rms_norm_bwd[(programs,)](x, weight, grad, rstd, dx, dw_parts, rows, heads, x.stride(0), x.stride(1),
                                       N=n, BLOCK_R=ROWS_PER_PROGRAM)
        return dx, dw_parts.sum(0).to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x (tokens, heads, dim) over its last dim, times `weight` cast to x's dtype; contiguous,
    x's dtype, differentiable in x and weight. Refuses (ValueError) what `unsupported_reason` names."""
    reason = unsupported_reason(x, weight)
    if reason is not None:
        raise ValueError(reason)
    return _RMSNormFunction.apply(x, weight, float(eps))


__all__ = ["rms_norm", "unsupported_reason", "ROWS_PER_PROGRAM"]
