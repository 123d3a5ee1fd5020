"""One GEMM operand quantized and dequantized as its `OperandQuant` says, in the dtype the exact product
takes it in (bfloat16 where that holds the values exactly, float32 otherwise), with the random Hadamard
transform and counter-based stochastic rounding where the spec asks (see `mxlab.nn.qmatmul`)."""

from __future__ import annotations

from typing import Any

import torch

from mxlab.nn.precision import OperandQuant
from mxlab.numerics.reference import BLOCK_SIZE


def fake_quantize_operand(x: torch.Tensor, quant: OperandQuant, axis: int, seed: int) -> torch.Tensor:
    """x quantized and dequantized as `quant` says (unchanged if high precision), in float32."""
    values, factor = quantized_operand(x, quant, axis, seed)
    return values.float() if factor is None else values.float() * factor


QuantizedOperand = tuple[torch.Tensor, torch.Tensor | None]
Counters = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]  # of a, b, grad of the output


def quantized_operand(
    x: torch.Tensor, quant: OperandQuant, axis: int, seed: int, counter: torch.Tensor | None = None
) -> QuantizedOperand:
    """(values, factor): x quantized and dequantized as `quant` says is values * factor (factor None: 1).
    `counter` (int64, broadcastable to x): stochastic rounding draws its bits from it (see
    `counted_stochastic_fake_quantize`) instead of from each element's linear index.

    MX operands: their dequantized values, in bfloat16 where that holds them exactly (see
    `exact_in_bfloat16`), else float32. Per-tensor FP8: the FP8 values (bfloat16 on CUDA, exact)
    and the 0-d float32 scale_inv, applied to the float32 product as FP8 hardware does. High
    precision: x itself (bfloat16 stays bfloat16, anything else becomes float32)."""
    if quant.high_precision:
        return (x if x.dtype == torch.bfloat16 else x.float()), None
    from mxlab.numerics.per_tensor import quantize_per_tensor_fp8
    from mxlab.numerics.quant import fake_quantize

    if not quant.block_scaled:
        q, scale_inv = quantize_per_tensor_fp8(x, quant.fmt)
        return q.to(torch.bfloat16 if x.is_cuda else torch.float32), scale_inv
    kwargs: dict[str, Any] = {
        "scale_mode": quant.scale_mode,
        "rounding": quant.rounding,
        "pad": True,
        "block": quant.block,
        "axis": axis if quant.block == 32 else -1,
    }
    if quant.rounding == "stochastic" and counter is not None:
        values = counted_stochastic_fake_quantize(x, quant, axis, seed, counter)
        return (values.to(torch.bfloat16) if x.dtype == torch.bfloat16 else narrowed_to_bfloat16(values)), None
    if quant.rounding == "stochastic":
        kwargs["seed"] = seed
    if x.dtype == torch.bfloat16:
        return fake_quantize(x, quant.fmt, **kwargs), None  # exact in bfloat16, see the module docstring
    return narrowed_to_bfloat16(fake_quantize(x.float(), quant.fmt, **kwargs)), None


def counted_stochastic_fake_quantize(
    x: torch.Tensor, quant: OperandQuant, axis: int, seed: int, counter: torch.Tensor
) -> torch.Tensor:
    """x fake-quantized (float32) as the MX operand `quant` says, with stochastic rounding whose random
    bits are `mxlab.numerics.reference.random_bits24(counter, seed)` element by element (counter broadcast to x);
    blocks of 32 along `axis` or (32, 32) tiles of the last two dims, zero-padded as qmatmul pads them."""
    from mxlab.numerics.quant import fake_quantize_counted

    return fake_quantize_counted(
        x.float(),
        quant.fmt,
        counter=counter,
        seed=seed,
        block=quant.block,
        axis=axis if quant.block == BLOCK_SIZE else -1,
        scale_mode=quant.scale_mode,
        pad=True,
    )


def narrowed_to_bfloat16(mx_values: torch.Tensor) -> torch.Tensor:
    """float32 MX values as bfloat16 where that is exact on CUDA (see `exact_in_bfloat16`), else unchanged.
    Refuses (RuntimeError) under torch.compile on CUDA, where that check is a host read the graph cannot hold."""
    if mx_values.is_cuda and torch.compiler.is_compiling():
        raise RuntimeError(
            "an MX operand quantized from float32 on CUDA is checked for exactness in bfloat16 with a host read, "
            "which torch.compile cannot trace: compile the model in bfloat16 (or under bfloat16 autocast), or run "
            "a float32 model eagerly"
        )
    if mx_values.is_cuda and exact_in_bfloat16(mx_values):
        return mx_values.to(torch.bfloat16)
    return mx_values


BFLOAT16_EXACT_FLOOR = 2.0**-126  # below it, bfloat16 (8 significant bits) is subnormal


def exact_in_bfloat16(mx_values: torch.Tensor) -> bool:
    """Whether MX fake-quantized values (at most 8 significant bits) are all exact in bfloat16: true
    unless some nonzero magnitude lies below 2^-126. One reduction and a host sync."""
    magnitude = mx_values.abs()
    return not bool(((magnitude < BFLOAT16_EXACT_FLOOR) & (magnitude != 0)).any())


def pad_to_multiple(x: torch.Tensor, axis: int, multiple: int) -> torch.Tensor:
    size = x.shape[axis]
    extra = -size % multiple
    if extra == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[axis] = extra
    return torch.cat([x, x.new_zeros(pad_shape)], dim=axis)


def hadamard_transformed(x: torch.Tensor, axis: int, block: int, hadamard_seed: int) -> torch.Tensor:
    """x in float32, zero-padded along `axis` to a multiple of `block` and transformed there by the
    random Hadamard matrix H of `hadamard_seed` (both operands of a GEMM get the same H, so
    (a H^T)(H b) = a b)."""
    from mxlab.numerics.hadamard import random_hadamard

    return random_hadamard(pad_to_multiple(x.float(), axis, block), block, axis, hadamard_seed)


def hadamard_quantized_operand(
    x: torch.Tensor, quant: OperandQuant, axis: int, block: int, hadamard_seed: int, seed: int
) -> QuantizedOperand:
    """`quantized_operand` of `hadamard_transformed(x, axis, block, hadamard_seed)`. An MX operand
    with 1-D blocks goes through `mxlab.numerics.quant.hadamard_fake_quantize`: one fused Triton kernel (one
    read of x) on CUDA when the Hadamard block is 32, bit-identical to transforming and then quantizing."""
    if not (quant.block_scaled and quant.block == BLOCK_SIZE):
        return quantized_operand(hadamard_transformed(x, axis, block, hadamard_seed), quant, axis, seed)
    from mxlab.numerics.quant import hadamard_fake_quantize

    values = hadamard_fake_quantize(
        x,
        quant.fmt,
        block=block,
        axis=axis,
        hadamard_seed=hadamard_seed,
        scale_mode=quant.scale_mode,
        rounding=quant.rounding,
        seed=seed if quant.rounding == "stochastic" else None,
        pad=True,
    )
    return narrowed_to_bfloat16(values), None
