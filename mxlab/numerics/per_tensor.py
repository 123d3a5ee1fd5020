"""Per-tensor FP8 with current scaling (one float32 scale per tensor, as Transformer Engine's
Float8CurrentScaling): the baseline MX recipes are compared against, on the same code paths."""

from __future__ import annotations

import torch

PER_TENSOR_FP8 = {"fp8_tensor_e4m3": torch.float8_e4m3fn, "fp8_tensor_e5m2": torch.float8_e5m2}


def per_tensor_fp8_scale(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float32 current scale fp8_max / amax of per-tensor FP8 `fmt`, as Transformer Engine forms
    it: 1 for amax 0, capped at float32 max when the quotient overflows."""
    fp8_max = torch.finfo(PER_TENSOR_FP8[fmt]).max
    float32_max = torch.finfo(torch.float32).max
    return torch.where(amax > 0, (fp8_max / amax).clamp(max=float32_max), torch.ones_like(amax))


def quantize_per_tensor_fp8(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 with current scaling, as Transformer Engine's Float8CurrentScaling: returns
    (q, scale_inv), q = fp8(x * scale) with saturation (a float8 tensor of x's shape) and the 0-d
    float32 scale_inv = 1 / scale, scale as `per_tensor_fp8_scale`. A non-finite amax gives a NaN
    scale_inv (no host synchronization). Refuses an unknown `fmt` (KeyError from PER_TENSOR_FP8)."""
    dtype = PER_TENSOR_FP8[fmt]
    fp8_max = torch.finfo(dtype).max
    values = x.float()
    amax = values.abs().amax() if values.numel() else torch.zeros((), device=x.device)
    scale = per_tensor_fp8_scale(amax, fmt)
    q = (values * scale).clamp(-fp8_max, fp8_max).to(dtype)
    scale_inv = torch.where(torch.isfinite(amax), torch.reciprocal(scale), torch.full_like(scale, float("nan")))
    return q, scale_inv


def fake_quantize_per_tensor_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """q * scale_inv of `quantize_per_tensor_fp8` (float32 product) in x's dtype; NaN everywhere when
    the amax is not finite."""
    q, scale_inv = quantize_per_tensor_fp8(x, fmt)
    return (q.float() * scale_inv).to(x.dtype)
