"""The models' normalizations over the last dim, in the input's dtype: one Triton kernel on CUDA where
it runs (mxlab.kernels.norms: several rows per program, a strided input read as is), torch's elsewhere.
Under torch.compile the kernel runs outside the graph (a graph break), so a compiled model keeps eager mode's
bits (a compiled GEM step whose graphs held the norm and rotary kernels failed in Inductor's partitioner on one
H100: "Node getitem_39 was invalid, but is output")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mxlab.numerics.quant import kernel_module


def _like(parameter: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    return None if parameter is None else parameter.to(x.dtype)


def _kernel_runs(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None) -> bool:
    """Whether mxlab.kernels.norms runs these inputs (CUDA, Triton installed, supported shapes)."""
    if not x.is_cuda:
        return False
    kernels = kernel_module("norms")
    return kernels is not None and kernels.unsupported_reason(x, weight, bias) is None


@torch._disable_dynamo  # torch.compiler.disable, importing torch._dynamo at the first call
def _kernel_norm(name: str, *args: torch.Tensor | float | None) -> torch.Tensor:
    """mxlab.kernels.norms.NAME(*args), run outside any compiled graph."""
    return getattr(kernel_module("norms"), name)(*args)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight (cast to x's dtype), in x's dtype, statistics
    in float32; autocast does not apply."""
    if _kernel_runs(x, weight):
        return _kernel_norm("rms_norm", x, weight, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.rms_norm(x, x.shape[-1:], _like(weight, x), eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim, weight and bias cast to x's dtype,
    in x's dtype, statistics in float32; autocast does not apply."""
    if bias is not None and _kernel_runs(x, weight, bias):
        return _kernel_norm("layer_norm", x, weight, bias, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x, x.shape[-1:], _like(weight, x), _like(bias, x), eps)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the last dim (same parameters) that returns its input's dtype, also under autocast.

    Autocast runs layer_norm in float32 and returns float32; here a bfloat16 input stays bfloat16
    (`mxlab.nn.norms.layer_norm`: statistics in float32, the affine parameters cast to the input's
    dtype, as autocast casts a Linear's weight; one Triton kernel on CUDA). Refuses (ValueError) a
    normalized shape of more than one dim.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            raise ValueError(
                f"LayerNorm normalizes the last dim only; got normalized_shape {tuple(self.normalized_shape)}"
            )
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm over the last dim (same parameters) that returns its input's dtype, also under autocast.

    `mxlab.nn.norms.rms_norm`: the mean square accumulates in float32, the weight is cast to the
    input's dtype; on CUDA one Triton kernel reads a strided input (the heads of a projection) as
    is. With ``eps=None`` the epsilon is float32's (what a float32 norm uses), whatever the input's
    dtype. Refuses (ValueError) a normalized shape of more than one dim.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            raise ValueError(
                f"RMSNorm normalizes the last dim only; got normalized_shape {tuple(self.normalized_shape)}"
            )
        eps = torch.finfo(torch.float32).eps if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps)
