"""QLinear: a drop-in for nn.Linear whose three GEMMs each run in their own emulated precision.

With x (M, K) (leading dims of the input are flattened into M), W (N, K):

| GEMM | product | operands quantized along |
|---|---|---|
| fwd | y = x W^T | x and W along K (in_features) |
| dgrad | dx = dy W | dy and W along N (out_features) |
| wgrad | dW = dy^T x | dy and x along M (tokens) |

It is `qmatmul(x, W^T, precision, bias=b)`: the bias, in the output's dtype, is added to the
forward's float32 accumulator before its one rounding, as nn.Linear's addmm (a cuBLAS bias epilogue)
adds it, and its gradient is the plain sum of dy. The semantics, padding and seeding are those of `mxlab.nn.qmatmul`:
in_features or out_features that are not a multiple of 32 are zero-padded for quantization
(`padded_dims` says which), accumulation is FP32 and the output has the input's dtype.

Under torch.autocast, x, W and the bias first become autocast's dtype, as autocast casts them for
nn.Linear: the emulated GEMMs quantize the very operands the BF16 baseline multiplies (bfloat16
activations and a bfloat16 copy of the float32 master weight), the weight gradient leaves its
GEMM in bfloat16 as the baseline's does, and the output is bfloat16, so the layers after an MX
layer run in the baseline's precision. (Quantizing float32 weights instead would need a float32
copy and a host sync per GEMM, `mxlab.nn.operands.exact_in_bfloat16`, and would contrast MX with
something the baseline never multiplies.)

Stochastic rounding seeds: the seed of each operand of each GEMM at forward call c is
`derive_seed(precision.seed, c, slot)` (mxlab.nn.qmatmul.SEED_SLOTS), where `precision.seed` is
set by `apply_recipe` from the run seed and the module's qualified name and `precision.calls`
counts forward calls (0 at construction). The same run seed and call sequence give the same
bits; `mxlab.recipe.rounding_state` / `load_rounding_state` save and restore the counters so a
resumed run continues with the bits it would have drawn.

QLinear subclasses nn.Linear and has the same parameters and state_dict keys, so checkpoints
move between the plain and the quantized model. With `precision=None` it is nn.Linear exactly.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mxlab.nn.qmatmul import MatmulPrecision, qmatmul

QUANT_BLOCK = 32


def _autocast_operands(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, weight) in autocast's dtype where autocast is on for x's device (differentiable casts, as
    autocast makes for nn.Linear), else unchanged."""
    device_type = x.device.type
    if not torch.is_autocast_enabled(device_type):
        return x, weight
    dtype = torch.get_autocast_dtype(device_type)
    return x.to(dtype), weight.to(dtype)


def qlinear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: MatmulPrecision
) -> torch.Tensor:
    """F.linear(x, weight, bias) with its three GEMMs emulated under `precision` (QLinear's forward): x (..., K),
    weight (N, K). On meta tensors, the shapes and dtype only."""
    if x.device.type == "meta" or weight.device.type == "meta":  # no values: the shapes and dtype only
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    x, weight = _autocast_operands(x, weight)
    if x.dim() == 2:  # not a view of the product: FSDP2 hooks the output of a module for its backward
        return qmatmul(x, weight.t(), precision, bias=bias)
    y = qmatmul(x.reshape(-1, weight.shape[1]), weight.t(), precision, bias=bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


class QLinear(nn.Linear):
    """nn.Linear whose forward, dgrad and wgrad GEMMs follow `precision` (None: plain nn.Linear)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        precision: MatmulPrecision | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.precision = precision

    @property
    def precision(self) -> MatmulPrecision | None:
        return self._precision

    @precision.setter
    def precision(self, precision: MatmulPrecision | None) -> None:
        if precision is not None and not isinstance(precision, MatmulPrecision):
            raise ValueError(f"precision must be a MatmulPrecision or None, got {type(precision).__name__}")
        self._precision = precision

    @classmethod
    def from_linear(cls, linear: nn.Linear, precision: MatmulPrecision | None) -> QLinear:
        """A QLinear sharing `linear`'s weight and bias Parameters (same objects, same device/dtype)."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"from_linear needs an nn.Linear, got {type(linear).__name__}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features = linear.in_features
        module.out_features = linear.out_features
        module.weight = linear.weight
        module.bias = linear.bias
        module.training = linear.training
        module.precision = precision
        return module

    @property
    def padded_dims(self) -> list[str]:
        """Which of in_features / out_features are zero-padded to a multiple of 32 for quantization."""
        padded = []
        if self.in_features % QUANT_BLOCK:
            padded.append(f"in_features {self.in_features}->{self.in_features + (-self.in_features % QUANT_BLOCK)}")
        if self.out_features % QUANT_BLOCK:
            padded.append(f"out_features {self.out_features}->{self.out_features + (-self.out_features % QUANT_BLOCK)}")
        return padded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._precision is None:
            return F.linear(x, self.weight, self.bias)
        return qlinear(x, self.weight, self.bias, self._precision)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self._precision is None:
            return text + ", precision=high"
        gemms = ", ".join(f"{label}=[{gemm.describe()}]" for label, gemm in self._precision.gemms().items())
        return f"{text}, {gemms}"
