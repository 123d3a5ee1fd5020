"""LayerNorm over the last dim of contiguous rows, several rows per program (the model's norms).

torch's layer-norm kernels give each row of a few hundred elements its own block. Here one program
normalizes a tile of rows: it reads them once, accumulates mean and variance in float32, applies the
weight and bias (cast to x's dtype, as `mxlab.models.gem.LayerNorm` casts them) and writes x's
dtype. The backward reads x and the gradient once and writes the input gradient; the weight and bias
gradients are summed per program and then over programs. Results agree with
`torch.nn.functional.layer_norm` to float32 rounding before the cast to x's dtype.
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

ELEMENTS_PER_PROGRAM = 4096
MAX_DIM = 1024


@triton.jit
def _layer_norm_fwd(x_ptr, w_ptr, b_ptr, out_ptr, mean_ptr, rstd_ptr, rows_total, n, eps,
                    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    keep = row_ok[:, None] & (cols < n)[None, :]
    offsets = rows[:, None].to(tl.int64) * n + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=keep, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n
    centered = tl.where(keep, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=1) / n + eps)
    w = tl.load(w_ptr + cols, mask=cols < n, other=0.0).to(out_ptr.dtype.element_ty).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < n, other=0.0).to(out_ptr.dtype.element_ty).to(tl.float32)
    y = centered * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=keep)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _layer_norm_bwd(x_ptr, w_ptr, g_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, rows_total, n,
                    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    program = tl.program_id(0)
    rows = program * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    keep = row_ok[:, None] & (cols < n)[None, :]
    offsets = rows[:, None].to(tl.int64) * n + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=keep, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=keep, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < n, other=0.0).to(dx_ptr.dtype.element_ty).to(tl.float32)
    normalized = tl.where(keep, (x - mean[:, None]) * rstd[:, None], 0.0)
    wg = w[None, :] * g
    dx = rstd[:, None] * (wg - (tl.sum(wg, axis=1) / n)[:, None] - normalized * (tl.sum(wg * normalized, axis=1) / n)[:, None])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=keep)
    tl.store(dw_ptr + program * BLOCK_N + cols, tl.sum(g * normalized, axis=0))
    tl.store(db_ptr + program * BLOCK_N + cols, tl.sum(g, axis=0))


def unsupported_reason(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> str | None:
    """Why `layer_norm` cannot run these inputs (a sentence), or None when it can."""
    n = x.shape[-1] if x.dim() else 0
    if n < 1 or n > MAX_DIM:
        return f"the normalized dim {n} is outside 1..{MAX_DIM}"
    if not x.is_contiguous():
        return f"x must be contiguous, got strides {x.stride()}"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype} is not supported; accepted: bfloat16, float16, float32"
    for name, parameter in (("weight", weight), ("bias", bias)):
        if parameter is None or parameter.shape != (n,) or parameter.device != x.device:
            return f"the {name} must be a ({n},) tensor on {x.device}"
    return None


def _tiles(n: int) -> tuple[int, int]:
    block_n = triton.next_power_of_2(n)
    return block_n, max(1, ELEMENTS_PER_PROGRAM // block_n)


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        n = x.shape[-1]
        rows = x.numel() // n
        block_n, block_r = _tiles(n)
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        mean = torch.empty(rows, device=x.device, dtype=torch.float32)
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        if rows:
            _layer_norm_fwd[(triton.cdiv(rows, block_r),)](x, weight, bias, out, mean, rstd, rows, n, eps,
                                                           BLOCK_N=block_n, BLOCK_R=block_r)
        ctx.save_for_backward(x, weight, mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight, mean, rstd = ctx.saved_tensors
        n = x.shape[-1]
        rows = x.numel() // n
        block_n, block_r = _tiles(n)
        programs = triton.cdiv(rows, block_r)
        grad = grad.contiguous()
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        dw_parts = torch.zeros(max(programs, 1), block_n, device=x.device, dtype=torch.float32)
        db_parts = torch.zeros(max(programs, 1), block_n, device=x.device, dtype=torch.float32)
        if rows:
            _layer_norm_bwd[(programs,)](x, weight, grad, mean, rstd, dx, dw_parts, db_parts, rows, n,
                                         BLOCK_N=block_n, BLOCK_R=block_r)
        return dx, dw_parts.sum(0)[:n].to(weight.dtype), db_parts.sum(0)[:n].to(weight.dtype), None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of contiguous x over its last dim, with `weight` and `bias` cast to x's dtype; x's dtype,
    differentiable in x, weight and bias. Refuses (ValueError) what `unsupported_reason` names."""
    reason = unsupported_reason(x, weight, bias)
    if reason is not None:
        raise ValueError(reason)
    return _LayerNormFunction.apply(x, weight, bias, float(eps))


__all__ = ["layer_norm", "unsupported_reason", "ELEMENTS_PER_PROGRAM", "MAX_DIM"]
