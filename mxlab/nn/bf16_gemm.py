"""BF16 GEMMs of CPU autocast as float32 GEMMs of bfloat16-rounded operands.

Under `torch.autocast("cpu", dtype=torch.bfloat16)` a GEMM casts its floating operands to bfloat16,
multiplies them with float32 accumulation and returns bfloat16. The product of two bfloat16 values (8
significant bits each) is exact in float32 (24), so the same GEMM computed in float32 on the operands
rounded to bfloat16, its result rounded to bfloat16, is that GEMM up to the order of the accumulation,
which differs between any two GEMM implementations. CPUs without bfloat16 instructions run it 15-35x
faster than their bfloat16 kernels (docs/numerics.md). The backward follows: the casts' gradients round
the incoming gradient to bfloat16 and the float32 GEMMs of the backward see bfloat16 values, as autocast's
backward does.

`bf16_gemms_in_float32()` is a TorchFunctionMode doing that for the GEMMs autocast lowers (linear, matmul,
mm, bmm, addmm, baddbmm, einsum) where bfloat16 CPU autocast is on and every tensor operand is a CPU
tensor of a dtype autocast casts; anything else runs unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

GEMMS = frozenset(
    {
        torch.nn.functional.linear,
        torch.matmul,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.mm,
        torch.Tensor.mm,
        torch.bmm,
        torch.Tensor.bmm,
        torch.addmm,
        torch.Tensor.addmm,
        torch.baddbmm,
        torch.Tensor.baddbmm,
        torch.einsum,
    }
)
CAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # autocast leaves float64 alone


def _round(value: Any) -> Any:
    """A tensor of a dtype autocast casts, rounded to bfloat16 and back to float32; a list or tuple of
    operands (einsum's) element by element; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(torch.bfloat16).float() if value.dtype in CAST_DTYPES else value
    if isinstance(value, (list, tuple)):
        return type(value)(_round(item) for item in value)
    return value


def _operands(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among a GEMM's arguments, one level into lists and tuples (the signatures of GEMMS nest
    no deeper: einsum's operands may come as one list)."""
    found = []
    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor):
                found.append(item)
    return found


def _emulated(args: tuple, kwargs: dict) -> bool:
    """Whether bfloat16 CPU autocast is on and every tensor operand is a CPU tensor autocast casts."""
    if not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") != torch.bfloat16:
        return False
    tensors = _operands(args, kwargs)
    return bool(tensors) and all(t.device.type == "cpu" and t.dtype in CAST_DTYPES for t in tensors)


class Bf16GemmsInFloat32(TorchFunctionMode):
    """The mode of the module docstring."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func not in GEMMS or not _emulated(args, kwargs):
            return func(*args, **kwargs)
        args, kwargs = _round(args), {name: _round(value) for name, value in kwargs.items()}
        with torch.autocast("cpu", enabled=False):
            result = func(*args, **kwargs)
        return result.to(torch.bfloat16)


def bf16_gemms_in_float32() -> Bf16GemmsInFloat32:
    """The mode of the module docstring (enter it inside bfloat16 CPU autocast)."""
    return Bf16GemmsInFloat32()
