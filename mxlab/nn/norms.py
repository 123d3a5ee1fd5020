"""The models' normalizations over the last dim, in the input's dtype: one Triton kernel each on CUDA
where it runs (mxlab.kernels.rms_norm, mxlab.kernels.layer_norm), torch's elsewhere."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mxlab.nn.kernel_modules import triton_module


def _like(parameter: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    return parameter if parameter is None or parameter.dtype == x.dtype else parameter.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight (cast to x's dtype), in x's dtype, statistics
    in float32; autocast does not apply. On CUDA, for (tokens, heads, dim) inputs with dim a power of
    two from 16 to 256, one Triton kernel that reads a strided x without a copy."""
    if x.is_cuda and weight is not None and x.dim() == 3:
        kernel = triton_module("rms_norm")
        if kernel is not None and kernel.unsupported_reason(x, weight) is None:
            return kernel.rms_norm(x, weight, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.rms_norm(x, x.shape[-1:], _like(weight, x), eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim, weight and bias cast to x's dtype,
    in x's dtype, statistics in float32; autocast does not apply. On CUDA, for a contiguous x with both
    affine parameters and a last dim up to 1024, one Triton kernel with several rows per program."""
    if x.is_cuda:
        kernel = triton_module("layer_norm")
        if kernel is not None and kernel.unsupported_reason(x, weight, bias) is None:
            return kernel.layer_norm(x, weight, bias, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x, x.shape[-1:], _like(weight, x), _like(bias, x), eps)
