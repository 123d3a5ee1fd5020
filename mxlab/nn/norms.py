"""RMS normalization of (tokens, heads, dim) tensors over the last dim, as the models' QK-norm uses it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mxlab.nn.kernel_modules import triton_module


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight (cast to x's dtype), in x's dtype, statistics
    in float32; autocast does not apply. On CUDA, for (tokens, heads, dim) inputs with dim a power of
    two from 16 to 256, one Triton kernel (mxlab.kernels.rms_norm) that reads a strided x without a
    copy; elsewhere torch's rms_norm."""
    if x.is_cuda and weight is not None and x.dim() == 3:
        kernel = triton_module("rms_norm")
        if kernel is not None and kernel.unsupported_reason(x, weight) is None:
            return kernel.rms_norm(x, weight, eps)
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    with torch.autocast(x.device.type, enabled=False):
        return F.rms_norm(x, x.shape[-1:], weight, eps)
