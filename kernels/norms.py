"""The model's LayerNorm and RMSNorm over the last dim, several rows per program, read through strides.

torch's norm kernels give each row of a few hundred elements its own block, and its rms_norm copies
a strided input first (the model's queries and keys are views of one projection's output). Here one
program normalizes a tile of rows: it reads x through its strides once, accumulates the statistics in
float32 (LayerNorm: mean and variance; RMSNorm: the mean square), applies the weight (and bias) cast
to x's dtype, as `mxlab.models.gem` casts them, and writes a contiguous result in x's dtype. The
backward reads x and the gradient once and writes the input gradient; the parameter gradients are
summed per program and then over programs. Results agree with `torch.nn.functional.layer_norm` /
`rms_norm` to float32 rounding before the cast to x's dtype.

x is (rows, dim) or (tokens, heads, dim) with a contiguous last dim; row r is token r // heads,
head r % heads.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

ELEMENTS_PER_PROGRAM = 4096
MAX_DIM = 1024


@triton.jit
def _tile(x_ptr, rows_total, heads, stride_t, stride_h, n, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """The program's rows, columns, mask, x tile (float32) and the rows' offsets in a contiguous output."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    keep = (rows < rows_total)[:, None] & (cols < n)[None, :]
    source = (rows // heads)[:, None].to(tl.int64) * stride_t + (rows % heads)[:, None] * stride_h + cols[None, :]
    x = tl.load(x_ptr + source, mask=keep, other=0.0).to(tl.float32)
    return rows, cols, keep, x, rows[:, None].to(tl.int64) * n + cols[None, :]


@triton.jit
def _norm_fwd(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    mean_ptr,
    rstd_ptr,
    rows_total,
    heads,
    stride_t,
    stride_h,
    n,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CENTER: tl.constexpr,
):
    rows, cols, keep, x, target = _tile(x_ptr, rows_total, heads, stride_t, stride_h, n, BLOCK_N, BLOCK_R)
    if CENTER:
        mean = tl.sum(x, axis=1) / n
        x = tl.where(keep, x - mean[:, None], 0.0)
        tl.store(mean_ptr + rows, mean, mask=rows < rows_total)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n + eps)
    w = tl.load(w_ptr + cols, mask=cols < n, other=0.0).to(out_ptr.dtype.element_ty).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    if CENTER:
        y += tl.load(b_ptr + cols, mask=cols < n, other=0.0).to(out_ptr.dtype.element_ty).to(tl.float32)[None, :]
    tl.store(out_ptr + target, y.to(out_ptr.dtype.element_ty), mask=keep)
    tl.store(rstd_ptr + rows, rstd, mask=rows < rows_total)


@triton.jit
def _norm_bwd(
    x_ptr,
    w_ptr,
    g_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    rows_total,
    heads,
    stride_t,
    stride_h,
    n,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CENTER: tl.constexpr,
):
    rows, cols, keep, x, target = _tile(x_ptr, rows_total, heads, stride_t, stride_h, n, BLOCK_N, BLOCK_R)
    g = tl.load(g_ptr + target, mask=keep, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + rows, mask=rows < rows_total, other=0.0)
    if CENTER:
        x = tl.where(keep, x - tl.load(mean_ptr + rows, mask=rows < rows_total, other=0.0)[:, None], 0.0)
    normalized = x * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=cols < n, other=0.0).to(dx_ptr.dtype.element_ty).to(tl.float32)
    wg = w[None, :] * g
    dx = wg - normalized * (tl.sum(wg * normalized, axis=1) / n)[:, None]
    if CENTER:
        dx -= (tl.sum(wg, axis=1) / n)[:, None]
        tl.store(db_ptr + tl.program_id(0) * BLOCK_N + cols, tl.sum(g, axis=0))
    tl.store(dx_ptr + target, (rstd[:, None] * dx).to(dx_ptr.dtype.element_ty), mask=keep)
    tl.store(dw_ptr + tl.program_id(0) * BLOCK_N + cols, tl.sum(g * normalized, axis=0))


def unsupported_reason(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None) -> str | None:
    """Why `layer_norm` (with a bias) or `rms_norm` (without) cannot run these inputs (a sentence), or None."""
    if x.dim() not in (2, 3):
        return f"x must be (rows, dim) or (tokens, heads, dim), got shape {tuple(x.shape)}"
    n = x.shape[-1]
    if n < 1 or n > MAX_DIM:
        return f"the normalized dim {n} is outside 1..{MAX_DIM}"
    if x.stride(-1) != 1:
        return f"the normalized dim of x must be contiguous, got strides {x.stride()}"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype} is not supported; accepted: bfloat16, float16, float32"
    if weight is None or weight.shape != (n,) or weight.device != x.device:
        return f"the weight must be a ({n},) tensor on {x.device}"
    if bias is not None and (bias.shape != (n,) or bias.device != x.device):
        return f"the bias must be a ({n},) tensor on {x.device}"
    return None


def _launch_shape(x: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """(rows, heads, stride of a token, stride of a head, BLOCK_N, BLOCK_R) of x, 2-D or 3-D."""
    tokens, heads = (x.shape[0], 1) if x.dim() == 2 else (x.shape[0], x.shape[1])
    stride_h = 0 if x.dim() == 2 else x.stride(1)
    block_n = triton.next_power_of_2(x.shape[-1])
    return tokens * heads, heads, x.stride(0), stride_h, block_n, max(1, ELEMENTS_PER_PROGRAM // block_n)


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:  # type: ignore[override]
        rows, heads, stride_t, stride_h, block_n, block_r = _launch_shape(x)
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        mean = torch.empty(rows, device=x.device, dtype=torch.float32) if bias is not None else rstd
        if rows:
            _norm_fwd[(triton.cdiv(rows, block_r),)](
                x,
                weight,
                bias if bias is not None else weight,
                out,
                mean,
                rstd,
                rows,
                heads,
                stride_t,
                stride_h,
                x.shape[-1],
                eps,
                BLOCK_N=block_n,
                BLOCK_R=block_r,
                CENTER=bias is not None,
            )
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.center = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:  # type: ignore[override]
        x, weight, mean, rstd = ctx.saved_tensors
        rows, heads, stride_t, stride_h, block_n, block_r = _launch_shape(x)
        programs = max(triton.cdiv(rows, block_r), 1)
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        dw_parts = torch.zeros(programs, block_n, device=x.device, dtype=torch.float32)
        db_parts = torch.zeros(programs, block_n, device=x.device, dtype=torch.float32) if ctx.center else dw_parts
        if rows:
            _norm_bwd[(programs,)](
                x,
                weight,
                grad.contiguous(),
                mean,
                rstd,
                dx,
                dw_parts,
                db_parts,
                rows,
                heads,
                stride_t,
                stride_h,
                x.shape[-1],
                BLOCK_N=block_n,
                BLOCK_R=block_r,
                CENTER=ctx.center,
            )
        n = x.shape[-1]
        db = db_parts.sum(0)[:n].to(weight.dtype) if ctx.center else None
        return dx, dw_parts.sum(0)[:n].to(weight.dtype), db, None


def _normalize(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    reason = unsupported_reason(x, weight, bias)
    if reason is not None:
        raise ValueError(reason)
    return _NormFunction.apply(x, weight, bias, float(eps))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of x over its last dim, `weight` and `bias` cast to x's dtype; contiguous, x's dtype,
    differentiable in x, weight and bias. Refuses (ValueError) what `unsupported_reason` names."""
    if bias is None:
        raise ValueError("layer_norm needs a bias; without one use rms_norm or torch's layer_norm")
    return _normalize(x, weight, bias, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x over its last dim, times `weight` cast to x's dtype; contiguous, x's dtype,
    differentiable in x and weight. Refuses (ValueError) what `unsupported_reason` names."""
    return _normalize(x, weight, None, eps)


__all__ = ["layer_norm", "rms_norm", "unsupported_reason", "ELEMENTS_PER_PROGRAM", "MAX_DIM"]
