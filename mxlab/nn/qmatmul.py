"""Quantized matrix products with their own precision for the forward and both backward GEMMs.

`qmatmul(a, b, precision)` computes `a @ b` for a (..., M, K) and b (..., K, N) (or a 2-D b
shared by every batch entry). Every GEMM is emulated exactly: each MX operand is quantized and
dequantized with `mxlab.numerics.quant.fake_quantize` (blocks of 32 along the contraction dimension,
zero-padded when that dimension is not a multiple of 32), the product is accumulated in
float32, and the result is returned in a's dtype. Per-tensor FP8 operands (`fp8_tensor_e4m3`,
`fp8_tensor_e5m2`) use one current scale for the whole tensor: their FP8 values are multiplied
and the float32 accumulator is then multiplied by the scale_inv of each such operand, as FP8
GEMM hardware (and Transformer Engine) applies per-tensor scales.

| GEMM | product | operand blocks run along |
|---|---|---|
| forward | out = a @ b | a: K (its last dim), b: K (its dim -2) |
| grad of a | ga = g @ b^T | g: N (its last dim), b: N (its last dim) |
| grad of b | gb = a^T @ g | a: M (its dim -2), g: M (its dim -2) |

Every operand is quantized from the high-precision tensor in its own layout (a, b or g), so a
column-wise copy is never made by transposing a quantized tensor. Leading dims are batch
dims and blocks never cross them: in a padded per-sequence attention layout (B, H, L, D) the
key-axis blocks of P @ V and of the gradients start at each sequence's first key, and keys
padded with zeros change neither the blocks of the real keys nor the product.

On CUDA the emulated product runs on the BF16 tensor cores with float32 accumulation whenever both
operands are exactly representable in bfloat16: a bfloat16 result comes from cuBLAS's float32
accumulator rounded once (split-K reductions kept in float32, see `bfloat16_product`), any other
result from a float32 one (`torch.mm(..., out_dtype=torch.float32)`). That holds for FP8 values, and for
every MX element value quantized from a bfloat16 tensor (at most 8 significant bits, and either the input
value itself or a point of a grid of powers of two no finer than bfloat16's). MX operands quantized from float32
or float16 (via float32) are checked: no nonzero magnitude below 2^-126, where bfloat16 loses
bits. Other GEMMs (float32 high-precision operands, the CPU) multiply float32 operands. The two
differ only in the order of float32 accumulation, as any two GEMM kernels do.

A GEMM whose two operands are both high precision (`bf16` or `fp32`) is a plain
`torch.matmul` of the unmodified operands: "bf16" means the precision the baseline model runs
in (under `torch.autocast(dtype=bfloat16)` such a GEMM follows autocast exactly as nn.Linear
does, the backward included; without autocast it runs in the operands' dtype), so it is
bit-identical to the baseline's. A high-precision operand of a mixed GEMM is used as is, in
float32. Emulated GEMMs always run with autocast off: FP32 accumulation, result cast to the
dtype of a (forward and grad of a) or of b (grad of b).

A (32, 32) tile is transpose-invariant, so when the grad-of-a GEMM quantizes b exactly as the
forward did (same spec, deterministic rounding, no Hadamard) the forward's quantized b is
reused, as hardware would (QLinear: one quantized weight per step for fwd and dgrad).

The output gradient (along N for the grad of a, along M for the grad of b) and a b of at most an
eighth of a's size (along K, along N) are each read once for both where one spec serves both and
that pays (`_one_read_pair`; the bits of two casts). That read of the output gradient also sums it over
rows for the bias gradient (float32, rounded once to its dtype: `g.sum(0)` up to the order of additions).

Stochastic rounding and the random Hadamard transform need seeds. Each `MatmulPrecision`
carries a base `seed` and a counter of forward calls; the seed of operand slot s at call
c is `derive_seed(seed, c, s)`, so a run that makes the same calls gets the same bits.
`mxlab.recipe.apply_recipe` gives each module its own base seed (from the run seed and the
module's qualified name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from mxlab.nn.operands import (
    Counters,
    QuantizedOperand,
    hadamard_quantized_operand,
    hadamard_transformed,
    quantized_operand,
)
from mxlab.nn.precision import GemmQuant, MatmulPrecision, OperandQuant  # noqa: F401  (part of this module's API)
from mxlab.nn.products import bfloat16_product, float32_product
from mxlab.numerics.reference import BLOCK_SIZE
from mxlab.numerics.seeding import SEED_SLOTS

# ---------------------------------------------------------------------------------------------
# Observers (diagnostics): called once per emulated GEMM while installed; None costs one check.

GemmObserver = Callable[..., None]
_observer: GemmObserver | None = None


def set_gemm_observer(observer: GemmObserver | None) -> GemmObserver | None:
    """Install an observer called after every emulated (not high-precision) GEMM; None removes it.

    It is called with keywords: `name` (module), `gemm` (label), `quant` (GemmQuant), `shadow_a`, `shadow_b`
    (the unquantized operands as multiplied, for a shadow product), `product_a`, `product_b` (the quantized
    operands as multiplied, without their per-tensor factors; the GEMM's output is not shown, so observing never
    changes it), `a`, `b` (the operands in their stored layouts as quantized, i.e. after a Hadamard transform if
    any), `a_q`, `b_q` (their fake-quantized values as multiplied, bfloat16 or float32, not copied), `a_factor`,
    `b_factor` (None, or the 0-d per-tensor FP8 scale the values are multiplied by) and `a_axis`, `b_axis` (the
    blocked axes). Returns the previous observer.
    """
    global _observer
    previous, _observer = _observer, observer
    return previous


# ---------------------------------------------------------------------------------------------


def _gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    quant: GemmQuant,
    *,
    a_axis: int,
    b_axis: int,
    transpose_a: bool,
    transpose_b: bool,
    seeds: tuple[int, int, int],
    out_dtype: torch.dtype,
    name: str,
    label: str,
    a_quantized: QuantizedOperand | None = None,
    b_quantized: QuantizedOperand | None = None,
    counters: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, QuantizedOperand | None, QuantizedOperand | None]:
    """op(a) @ op(b) (+ bias, in out_dtype, added to the float32 accumulator before its one rounding to
    out_dtype; 2-D operands only), op = transpose of the last two dims where asked, with a quantized along
    `a_axis` and b along `b_axis` of their stored layouts (or their quantized values given as
    `a_quantized`, `b_quantized`); `counters`: stochastic-rounding counters of a and b (see `qmatmul`).
    Returns (out, a_q, b_q); a_q, b_q are the operands actually multiplied as
    `quantized_operand` gives them (None for a high-precision GEMM)."""

    def op(x: torch.Tensor, transpose: bool) -> torch.Tensor:
        return x.transpose(-1, -2) if transpose else x

    if quant.high_precision:  # the baseline's GEMM: follows torch.autocast like nn.Linear (addmm) does
        if bias is not None:
            return torch.addmm(bias, op(a, transpose_a), op(b, transpose_b)), None, None
        return torch.matmul(op(a, transpose_a), op(b, transpose_b)), None, None
    device_type = a.device.type  # emulation: FP32 accumulation, always (autocast off; no context where it is off)
    with (
        torch.autocast(device_type=device_type, enabled=False)
        if torch.is_autocast_enabled(device_type)
        else contextlib.nullcontext()
    ):
        a_in, b_in = a, b
        if quant.hadamard is None:
            if a_quantized is not None:
                a_q, a_factor = a_quantized
            else:
                a_q, a_factor = quantized_operand(a, quant.a, a_axis, seeds[0], counters[0])
            if b_quantized is not None:
                b_q, b_factor = b_quantized
            else:
                b_q, b_factor = quantized_operand(b, quant.b, b_axis, seeds[1], counters[1])
        elif any(counter is not None for counter in counters):
            raise ValueError(f"{name} {label}: stochastic-rounding counters cannot follow a Hadamard transform")
        elif _observer is None:
            a_q, a_factor = hadamard_quantized_operand(a, quant.a, a_axis, quant.hadamard, seeds[2], seeds[0])
            b_q, b_factor = hadamard_quantized_operand(b, quant.b, b_axis, quant.hadamard, seeds[2], seeds[1])
        else:  # the observer is shown the transformed operands
            a_in = hadamard_transformed(a, a_axis, quant.hadamard, seeds[2])
            b_in = hadamard_transformed(b, b_axis, quant.hadamard, seeds[2])
            a_q, a_factor = quantized_operand(a_in, quant.a, a_axis, seeds[0])
            b_q, b_factor = quantized_operand(b_in, quant.b, b_axis, seeds[1])
        factors = [f for f in (a_factor, b_factor) if f is not None]
        a_op, b_op = op(a_q, transpose_a), op(b_q, transpose_b)
        if _observer is not None:  # it recomputes the rows it samples: the GEMM below is the unobserved one
            _observer(
                name=name,
                gemm=label,
                quant=quant,
                shadow_a=op(a, transpose_a),
                shadow_b=op(b, transpose_b),
                product_a=a_op,
                product_b=b_op,
                a=a_in,
                b=b_in,
                a_q=a_q,
                b_q=b_q,
                a_factor=a_factor,
                b_factor=b_factor,
                a_axis=a_axis,
                b_axis=b_axis,
            )
        if not factors and out_dtype == a_op.dtype == b_op.dtype == torch.bfloat16 and a_op.is_cuda:
            return bfloat16_product(a_op, b_op, bias), (a_q, a_factor), (b_q, b_factor)
        out = float32_product(a_op, b_op)
        if factors:  # per-tensor scales multiply the float32 accumulator, as FP8 GEMM hardware does
            out = out * (factors[0] * factors[1] if len(factors) == 2 else factors[0])
        if bias is not None:
            out = out + bias.float()
    return out.to(out_dtype), (a_q, a_factor), (b_q, b_factor)


# A power-of-two scale can recover bits of an MX-quantized element only if the element is below
# float32's smallest normal: a block's E8M0 scale clamps at 2^-127 only when its amax < 2^(emax -
# 127), and then a float32-normal element is still >= 2 in element units, a normal of every element
# format, so it keeps all its bits. Gradient elements under this line are what a per-layer scale helps.
UNDERFLOW_LINE = float(torch.finfo(torch.float32).tiny)


def _record_grad_stats(precision: MatmulPrecision, g: torch.Tensor) -> None:
    """Accumulate the (scaled) gradient's counts of non-finite, nonzero and underflowing (nonzero, below
    UNDERFLOW_LINE) elements on its device, as `grad_stats["counts"]` (int64, in that order), with no host
    synchronisation; `grad_stats["backward_calls"]` counts the calls."""
    stats = precision.grad_stats
    magnitude = g.detach().abs()
    nonzero = magnitude != 0
    counts = torch.stack(
        [(~torch.isfinite(magnitude)).sum(), nonzero.sum(), (nonzero & (magnitude < UNDERFLOW_LINE)).sum()]
    )
    stats["counts"] = counts if "counts" not in stats else stats["counts"] + counts
    stats["backward_calls"] = stats.get("backward_calls", 0) + 1


def _one_read_pair(
    x: torch.Tensor,
    along_last: OperandQuant,
    along_rows: OperandQuant,
    gemms: tuple[GemmQuant, GemmQuant],
    column_sums: bool = False,
) -> tuple[torch.Tensor, ...] | None:
    """(x quantized along its last dim, along its rows) from one read of x, as `quantized_operand` gives each,
    when both specs are one MX spec with blocks of 32 whose fused launch pays (`rowcol_in_one_read`: hardware
    FP8, so deterministic), neither GEMM has a Hadamard transform, x is 2-D bfloat16 and no observer is
    installed; else None (each quantized where it is used). column_sums=True adds x.sum(0) in float32 from
    the same read (a linear layer's bias gradient)."""
    from mxlab.numerics import quant

    if not (
        _observer is None
        and x.dim() == 2
        and x.dtype == torch.bfloat16
        and along_last == along_rows
        and along_last.block_scaled
        and along_last.block == BLOCK_SIZE
        and all(g.hadamard is None for g in gemms)
        and quant.rowcol_in_one_read(x, along_last.fmt, along_last.rounding)
    ):
        return None
    return quant.fake_quantize_rowcol(
        x,
        along_last.fmt,
        scale_mode=along_last.scale_mode,
        rounding=along_last.rounding,
        pad=True,
        column_sums=column_sums,
    )


def _same_square_quantization(fwd: GemmQuant, grad_a: GemmQuant) -> bool:
    b = fwd.b
    return (
        b == grad_a.b
        and b.block == (32, 32)
        and b.block_scaled
        and b.rounding != "stochastic"
        and fwd.hadamard is None
        and grad_a.hadamard is None
    )


class _QMatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        a: torch.Tensor,
        b: torch.Tensor,
        bias: torch.Tensor | None,
        precision: MatmulPrecision,
        counters: Counters,
        seeds: tuple[int, ...] | None,
    ) -> torch.Tensor:  # type: ignore[override]
        seeds = precision.next_call_seeds() if seeds is None else seeds
        # A b much smaller than a (a linear layer's weight) is quantized for the forward (along K) and the grad
        # of a (along N) in one launch; its N-quantized values wait for the backward.
        b_pair = (
            _one_read_pair(b, precision.grad_a.b, precision.fwd.b, (precision.fwd, precision.grad_a))
            if ctx.needs_input_grad[0] and b.numel() * 8 <= a.numel()
            else None
        )
        out, _, b_q = _gemm(
            a,
            b,
            precision.fwd,
            a_axis=-1,
            b_axis=-2,
            transpose_a=False,
            transpose_b=False,
            seeds=(seeds[SEED_SLOTS["fwd.a"]], seeds[SEED_SLOTS["fwd.b"]], seeds[SEED_SLOTS["fwd.hadamard"]]),
            out_dtype=a.dtype,
            name=precision.name,
            label=precision.labels[0],
            counters=(counters[0], counters[1]),
            bias=bias,
            b_quantized=(b_pair[1], None) if b_pair is not None else None,
        )
        # A (32, 32) tile is transpose-invariant: when grad_a quantizes b exactly as the forward did
        # (same spec, deterministic rounding, no Hadamard), the forward's quantized b is reused.
        ctx.b_quantized = (
            (b_pair[0], None)
            if b_pair is not None
            else b_q
            if _same_square_quantization(precision.fwd, precision.grad_a) and not torch.compiler.is_compiling()
            else None  # a traced graph may not keep an intermediate on ctx: the backward quantizes b again, same bits
        )
        ctx.save_for_backward(a, b)
        ctx.precision = precision
        ctx.seeds = seeds
        ctx.counters = counters
        device_type = a.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        device_type, enabled, dtype = ctx.autocast
        with torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled):  # the forward's autocast state
            grad_a, grad_b, sums = _QMatmulFunction._backward(ctx, g)
        # as addmm's: g summed over rows in float32, in its dtype (outside autocast); by g's one-read cast where it runs
        grad_bias = None if not ctx.needs_input_grad[2] else sums.to(g.dtype) if sums is not None else g.sum(0)
        return grad_a, grad_b, grad_bias, None, None, None

    @staticmethod
    def _backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(grad of a, grad of b, g.sum(0) in float32 where the one-read cast of g computed it, else None)."""
        a, b = ctx.saved_tensors
        precision: MatmulPrecision = ctx.precision
        seeds = ctx.seeds
        a_counter, b_counter, g_counter = ctx.counters
        scale = precision.grad_scale
        if scale is not None:
            g = g * scale
        grad_a = grad_b = None
        want_sums = ctx.needs_input_grad[2] and scale is None  # the bias gradient, from the pair's read of g
        g_pair = (
            _one_read_pair(
                g, precision.grad_a.a, precision.grad_b.b, (precision.grad_a, precision.grad_b), column_sums=want_sums
            )
            if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]
            else None
        )
        if ctx.needs_input_grad[0]:
            # ga = g @ b^T: g along N (its last dim), b along N (its last dim).
            grad_a, _, _ = _gemm(
                g,
                b,
                precision.grad_a,
                a_axis=-1,
                b_axis=-1,
                transpose_a=False,
                transpose_b=True,
                seeds=(
                    seeds[SEED_SLOTS["grad_a.g"]],
                    seeds[SEED_SLOTS["grad_a.b"]],
                    seeds[SEED_SLOTS["grad_a.hadamard"]],
                ),
                out_dtype=a.dtype,
                name=precision.name,
                label=precision.labels[1],
                b_quantized=ctx.b_quantized,
                counters=(g_counter, b_counter),
                a_quantized=(g_pair[0], None) if g_pair is not None else None,
            )
        if ctx.needs_input_grad[1]:
            # gb = a^T @ g: a along M (its dim -2), g along M (its dim -2).
            grad_b, _, _ = _gemm(
                a,
                g,
                precision.grad_b,
                a_axis=-2,
                b_axis=-2,
                transpose_a=True,
                transpose_b=False,
                seeds=(
                    seeds[SEED_SLOTS["grad_b.a"]],
                    seeds[SEED_SLOTS["grad_b.g"]],
                    seeds[SEED_SLOTS["grad_b.hadamard"]],
                ),
                out_dtype=b.dtype,
                name=precision.name,
                label=precision.labels[2],
                counters=(a_counter, g_counter),
                b_quantized=(g_pair[1], None) if g_pair is not None else None,
            )
        if scale is not None:
            _record_grad_stats(precision, g)
            grad_a = grad_a / scale if grad_a is not None else None
            grad_b = grad_b / scale if grad_b is not None else None
        grad_a = grad_a.to(a.dtype) if grad_a is not None else None
        grad_b = grad_b.to(b.dtype) if grad_b is not None else None
        return grad_a, grad_b, (g_pair[2] if want_sums and g_pair is not None else None)


def forward_product(
    a: torch.Tensor,
    b: torch.Tensor,
    precision: MatmulPrecision,
    *,
    seeds: tuple[int, ...],
    counters: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
) -> torch.Tensor:
    """The forward GEMM of `qmatmul(a, b, precision, counters=, seeds=)` alone, in float32: no autograd and no
    call counter advanced (the caller hands the call's `seeds`); an installed observer sees it as qmatmul's
    forward. a (..., M, K) and b (..., K, N) with equal batch dims; `counters`: those of a and b."""
    with torch.no_grad():
        out, _, _ = _gemm(
            a,
            b,
            precision.fwd,
            a_axis=-1,
            b_axis=-2,
            transpose_a=False,
            transpose_b=False,
            seeds=(seeds[SEED_SLOTS["fwd.a"]], seeds[SEED_SLOTS["fwd.b"]], seeds[SEED_SLOTS["fwd.hadamard"]]),
            out_dtype=torch.float32,
            name=precision.name,
            label=precision.labels[0],
            counters=counters,
        )
    return out.float()


def qmatmul(
    a: torch.Tensor,
    b: torch.Tensor,
    precision: MatmulPrecision | None,
    *,
    counters: Counters | None = None,
    seeds: tuple[int, ...] | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """a @ b (+ bias) with the forward and both gradient GEMMs emulated as `precision` says.

    Returns `torch.matmul(a, b)` (+ bias) itself when `precision` is None. `bias` (N,), with a 2-D b
    only, is added in a's dtype to the forward's float32 accumulator before its one rounding to a's
    dtype, as nn.Linear's addmm adds it; its gradient is the output gradient summed over the rows.
    Otherwise a is (..., M, K) and
    b is (..., K, N) with the same leading (batch) dims, or b is 2-D and shared (then a's
    leading dims are flattened into M, so gradient blocks of b run across all rows of a).

    `counters` (int64 tensors of a, of b and of the output gradient, each broadcastable to its
    tensor) make stochastic rounding of an MX operand draw `mxlab.numerics.reference.random_bits24(counter,
    seed)` per element, instead of counting elements by their linear index in the padded operand:
    for products whose elements have a place beyond the layout (jagged attention, where padding and
    bucketing must not change the bits). `seeds` (one per SEED_SLOTS slot) replace this call's
    `precision.next_call_seeds()`. Refuses other shapes, counters with a shared 2-D b, and counters
    with a Hadamard GEMM (ValueError).
    """
    if precision is None:
        return torch.matmul(a, b) if bias is None else torch.matmul(a, b) + bias
    if not isinstance(precision, MatmulPrecision):
        raise ValueError(f"precision must be a MatmulPrecision or None, got {type(precision).__name__}")
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(
            f"qmatmul needs a (..., M, K) and b (..., K, N); got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"contraction sizes differ: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    if seeds is not None and len(seeds) != len(SEED_SLOTS):
        raise ValueError(f"seeds must hold one seed per slot of SEED_SLOTS ({len(SEED_SLOTS)}), got {len(seeds)}")
    if counters is None:
        counters = (None, None, None)
    elif len(counters) != 3:
        raise ValueError(f"counters must be (a_counter, b_counter, grad_counter), got {len(counters)} entries")
    if bias is not None and (b.dim() != 2 or bias.shape != (b.shape[-1],)):
        raise ValueError(
            f"bias must be (N,) = ({b.shape[-1]},) with a 2-D b; got bias {tuple(bias.shape)}, b {tuple(b.shape)}"
        )
    if bias is not None:
        bias = bias.to(a.dtype)
    if torch.compiler.is_compiling() and precision.draws_per_call:
        return _drawing_product_outside_the_graph(a, b, precision, counters, seeds, bias)
    return _apply(a, b, bias, precision, counters, seeds)


@torch._disable_dynamo  # torch.compiler.disable, importing torch._dynamo at the first call
def _drawing_product_outside_the_graph(a, b, precision, counters, seeds, bias) -> torch.Tensor:
    """A product that draws seeds (stochastic rounding, a random Hadamard transform) runs eagerly inside a compiled
    model: its seeds change every call, which a graph would specialize on (a recompile per call), so it is never
    traced. torch.compile(fullgraph=True) refuses it by this function's name; otherwise it is a graph break."""
    return _apply(a, b, bias, precision, counters, seeds)


def _apply(a, b, bias, precision, counters, seeds) -> torch.Tensor:
    if b.dim() == 2 and a.dim() > 2:
        if any(counter is not None for counter in counters):
            raise ValueError("stochastic-rounding counters need a and b with equal batch dims, not a shared 2-D b")
        out = _QMatmulFunction.apply(a.reshape(-1, a.shape[-1]), b, bias, precision, counters, seeds)
        return out.reshape(*a.shape[:-1], b.shape[-1])
    if a.shape[:-2] != b.shape[:-2]:
        raise ValueError(
            f"batch dims of a {tuple(a.shape[:-2])} and b {tuple(b.shape[:-2])} must be equal "
            "(or b must be 2-D); broadcast them explicitly first"
        )
    return _QMatmulFunction.apply(a, b, bias, precision, counters, seeds)
