"""Per-GEMM numerics diagnostics, sampled every N steps, free when off, bounded in memory when on.

`NumericsMonitor(model, every, sample_rows=1024)` watches every emulated GEMM of the model's
QLinear modules and attention products (those `apply_recipe` set up). Inside
`with monitor.sampling(step):` on a sampled step (step % every == 0) it installs an observer in
mxlab.nn.qmatmul; on other steps nothing is installed and a GEMM pays one `is None` check. Run the
forward and the backward inside the block to see all three GEMMs of a linear layer (fwd, dgrad,
wgrad) and the six of attention (qk, pv and their `_grad_a` / `_grad_b` backward products).
Attention products that run in the fused Triton kernel (CUDA) are not observed: a sampled step
takes the same path as any other, so sampling does not change the training numerics.

Bounded rows. Each statistic reads at most `sample_rows` rows of each operand and of each product,
chosen deterministically and spread evenly over the tensor (row i of n kept = floor(i * total / n)),
and works on at most `MAX_SAMPLE_ELEMENTS` elements at a time, so a sampled step needs a few
temporaries of that size whatever the model's size (nothing of the operands' size is copied). A
row is one index of every dimension but the last of the operand as stored; where blocks run along
rows (blocks along dim -2, or 32x32 tiles) rows are taken 32 at a time, whole blocks, so every
sampled block gets the scale it got in the GEMM. With every row sampled (small operands) the
figures are those of the whole tensors.

For each (step, module, gemm) the record (`monitor.drain()`) holds:

- `sqnr_db`: 10 log10(sum ref^2 / sum (out - ref)^2) over the sampled rows of the product, where
  `out` is the emulated product (those rows of the quantized operands' product, as multiplied,
  with their per-tensor scales) and `ref` the same rows of a shadow product of the unquantized
  operands, both in float32 and accumulated over the contraction in slices of bounded size, so the
  figure isolates the quantization error and observing never changes the GEMM the layer runs.
  `math.inf` when the two are identical (e.g. exactly representable inputs); Python's json writes it as `Infinity`.
- `saturated_frac`: elements whose magnitude over their block scale exceeded the format's max
  normal (they were clipped to it); `flushed_frac`: non-zero elements quantized to zero;
  `subnormal_frac`: non-zero quantized elements below the format's min normal (in units of
  their scale). Fractions of the sampled elements of the quantized (non-high-precision)
  operands. Per-tensor FP8 operands count like MX ones with their single current scale (from the
  whole tensor's amax) and add nothing to the histogram.
- `scale_exp_hist`: {unbiased E8M0 exponent: number of blocks} over the sampled blocks of the MX operands.
- `amax_a`, `amax_b`: the largest magnitude of each whole operand (after a Hadamard transform, if any);
  `calls`: how many products were folded into the record (attention runs one per length bucket).
- `rows_sampled`, `rows`: rows read and rows there were, summed over the quantized operands and
  calls; `out_rows_sampled`, `out_rows`: the same for the product rows behind `sqnr_db`.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mxlab.nn import qmatmul as qmatmul_module
from mxlab.nn.qmatmul import OperandQuant

_FP8_TENSOR_MIN_NORMAL = {"fp8_tensor_e4m3": 2.0**-6, "fp8_tensor_e5m2": 2.0**-14}
DEFAULT_SAMPLE_ROWS = 1024
MAX_SAMPLE_ELEMENTS = 1 << 24  # elements of one temporary (64 MiB in float32)
BLOCK = 32


@dataclass
class OperandStats:
    """Element and scale statistics of one quantized operand, over `rows` of its `rows_total` rows."""

    elements: int = 0
    saturated: int = 0
    flushed: int = 0
    subnormal: int = 0
    scale_exponents: Counter = field(default_factory=Counter)
    amax: float = 0.0
    rows: int = 0
    rows_total: int = 0


def sample_index(total: int, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`min(count, total)` indices spread evenly over range(total): floor(i * total / n), int64, ascending.

    Refuses a negative total and a count below 1.
    """
    if total < 0 or count < 1:
        raise ValueError(f"sample_index needs total >= 0 and count >= 1, got total={total}, count={count}")
    count = min(count, total)
    return torch.arange(count, device=device, dtype=torch.int64) * total // max(count, 1)


def tensor_amax(x: torch.Tensor) -> float:
    """The largest magnitude of x (NaN if x holds one; 0 for an empty x), without a temporary of x's size."""
    if x.numel() == 0:
        return 0.0
    low, high = torch.aminmax(x.detach())
    return float(torch.maximum(low.abs(), high).float())


def _row_sampler(
    shape: tuple[int, ...], unit: int, sample_rows: int, device: torch.device
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor, int, int]:
    """For a tensor of `shape` (..., R, C): (take, valid, rows_sampled, rows_total). `take(t)` gathers the
    sampled rows of any tensor of that shape as (k, unit, C), in groups of `unit` consecutive rows
    (1, or 32 for blocks along rows); rows past R in the last group read as zeros and `valid` (k, unit)
    marks the real ones."""
    *lead, rows, cols = shape
    lead_size = math.prod(lead)
    groups_per_lead = -(-rows // unit)
    groups = lead_size * groups_per_lead
    budget = max(1, min(sample_rows, MAX_SAMPLE_ELEMENTS // max(cols, 1)) // unit)
    chosen = sample_index(groups, budget, device)
    first = (chosen % groups_per_lead) * unit
    row_index = first[:, None] + torch.arange(unit, device=device)[None, :]
    valid = row_index < rows
    row_index = row_index.clamp(max=max(rows - 1, 0))
    lead_index = (
        [index[:, None] for index in torch.unravel_index(chosen // groups_per_lead, tuple(lead))] if lead else []
    )

    def take(t: torch.Tensor) -> torch.Tensor:
        gathered = t[(*lead_index, row_index)]
        return (
            gathered
            if unit == 1
            else torch.where(valid[..., None], gathered, torch.zeros((), dtype=gathered.dtype, device=gathered.device))
        )

    return take, valid, int(valid.sum()), lead_size * rows


def _expand_scales(scale_exp: torch.Tensor, blocked_dims: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    for dim in blocked_dims:
        scale_exp = scale_exp.repeat_interleave(BLOCK, dim=dim)
    return scale_exp[tuple(slice(0, size) for size in shape)]


def operand_stats(
    x: torch.Tensor,
    x_q: torch.Tensor,
    quant: OperandQuant,
    axis: int,
    *,
    factor: torch.Tensor | None = None,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
) -> OperandStats:
    """Statistics of x (before quantization) against x_q (its fake-quantized values, times `factor` when
    given: a per-tensor FP8 scale), over at most `sample_rows` rows (see the module docstring); `amax` is
    that of the whole of x.

    Refuses a high-precision operand (nothing was quantized), x_q of another shape, a blocked axis
    other than the last two and `sample_rows` < 1.
    """
    if quant.high_precision:
        raise ValueError(f"operand format {quant.fmt!r} is high precision; there are no quantization statistics")
    if tuple(x_q.shape) != tuple(x.shape):
        raise ValueError(f"x_q has shape {tuple(x_q.shape)}, x has {tuple(x.shape)}; they must match")
    if isinstance(sample_rows, bool) or not isinstance(sample_rows, int) or sample_rows < 1:
        raise ValueError(f"sample_rows must be an integer >= 1, got {sample_rows!r}")
    x, x_q = (x.detach(), x_q.detach()) if x.dim() >= 2 else (x.detach()[None], x_q.detach()[None])
    tiles = quant.block_scaled and quant.block == (BLOCK, BLOCK)
    axis = axis % x.dim() - x.dim() if quant.block_scaled and not tiles else -1
    if axis not in (-1, -2):
        raise ValueError(f"blocked axis {axis} of a {x.dim()}-D operand: accepted axes are the last two")
    unit = BLOCK if tiles or axis == -2 else 1
    take, valid, rows, rows_total = _row_sampler(tuple(x.shape), unit, sample_rows, x.device)
    sample = take(x).float()
    sample_q = take(x_q).float()
    if factor is not None:
        sample_q = sample_q * factor.float()
    real = valid[..., None].expand(sample.shape)
    stats = OperandStats(elements=rows * x.shape[-1], amax=tensor_amax(x), rows=rows, rows_total=rows_total)
    finite = torch.isfinite(sample) & real
    stats.flushed = int(((sample_q == 0) & (sample != 0) & finite).sum())
    if quant.block_scaled:
        from mxlab.numerics.formats import get_format
        from mxlab.numerics.quant import quantize

        fmt = get_format(quant.fmt)
        mxt = quantize(sample, quant.fmt, block=quant.block, axis=axis, scale_mode=quant.scale_mode, pad=True)
        exponents = mxt.scales.to(torch.int64) - 127
        stats.scale_exponents = Counter(exponents[mxt.scales != 0xFF].tolist())
        blocked_dims = (1, 2) if tiles else ((2,) if axis == -1 else (1,))
        scale = torch.ldexp(
            torch.ones_like(sample), _expand_scales(exponents, blocked_dims, tuple(sample.shape)).to(torch.int32)
        )
        max_normal, min_normal = fmt.max_normal, fmt.min_normal
    else:  # per-tensor FP8 with current scaling: scale = fp8_max / amax of the whole tensor
        dtype = torch.float8_e4m3fn if quant.fmt.endswith("e4m3") else torch.float8_e5m2
        max_normal, min_normal = torch.finfo(dtype).max, _FP8_TENSOR_MIN_NORMAL[quant.fmt]
        scale = torch.full_like(sample, stats.amax / max_normal if stats.amax > 0 else 1.0)
    stats.saturated = int(((sample.abs() / scale > max_normal) & finite).sum())
    stats.subnormal = int(((sample_q.abs() / scale < min_normal) & (sample_q != 0) & real).sum())
    return stats


def sampled_product_rows(
    products: Sequence[tuple[torch.Tensor, torch.Tensor]], sample_rows: int
) -> tuple[list[torch.Tensor], int, int]:
    """([rows of a @ b for each (a, b)], rows_sampled, rows_total): the same at most `sample_rows` rows
    of each float32 product a @ b (a (..., M, K), b (..., K, N) or (K, N), every pair of one shape; leading
    dims broadcast as in torch.matmul), each (rows, N), accumulated over K in slices of bounded size,
    so no temporary of a product's size is made."""
    a, b = products[0]
    if b.dim() > 2:
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        *lead, rows, inner = (*shape, *a.shape[-2:])
    else:
        *lead, rows, inner = a.shape
    cols = b.shape[-1]
    chosen = sample_index(math.prod(lead) * rows, sample_rows, a.device)
    lead_index = list(torch.unravel_index(chosen // rows, tuple(lead))) if lead else []
    row_index = chosen % rows
    batched = b.dim() > 2
    step = max(1, MAX_SAMPLE_ELEMENTS // (len(chosen) * cols if batched else max(len(chosen), cols)))
    results = []
    for a, b in products:
        if batched:  # both to the broadcast leading shape (views, no copies)
            a, b = a.expand(*lead, *a.shape[-2:]), b.expand(*lead, *b.shape[-2:])
        out = torch.zeros(len(chosen), cols, dtype=torch.float32, device=a.device)
        for start in range(0, inner, step):
            part = slice(start, min(start + step, inner))
            a_part = a[(*lead_index, row_index, part)].float()
            if batched:
                out += torch.bmm(a_part[:, None, :], b[(*lead_index, part)].float()).squeeze(1)
            else:
                out += a_part @ b[part].float()
        results.append(out)
    return results, len(chosen), math.prod(lead) * rows


@dataclass
class _GemmAccumulator:
    """One record in the making: the product's signal and noise energies, and its operands' statistics summed."""

    signal: float = 0.0
    noise: float = 0.0
    calls: int = 0
    operands: OperandStats = field(default_factory=OperandStats)
    amax_a: float = 0.0
    amax_b: float = 0.0
    out_rows: int = 0
    out_rows_sampled: int = 0

    def add_operand(self, stats: OperandStats) -> None:
        total = self.operands
        for name in ("elements", "saturated", "flushed", "subnormal", "rows", "rows_total"):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        total.scale_exponents.update(stats.scale_exponents)


def sqnr_db(signal_energy: float, noise_energy: float) -> float:
    """10 log10(signal / noise); inf when the noise is exactly 0, NaN when either is not finite."""
    if not (math.isfinite(signal_energy) and math.isfinite(noise_energy)):
        return math.nan
    if noise_energy == 0:
        return math.inf
    if signal_energy == 0:
        return -math.inf
    return 10.0 * math.log10(signal_energy / noise_energy)


class NumericsMonitor:
    """Samples per-GEMM numerics every `every` steps, at most `sample_rows` rows per operand and product
    (see the module docstring).

    Refuses `every` < 1 and `sample_rows` < 1.
    """

    def __init__(
        self, model: nn.Module | None = None, every: int = 100, sample_rows: int = DEFAULT_SAMPLE_ROWS
    ) -> None:
        for key, value in (("every", every), ("sample_rows", sample_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        self.model = model
        self.every = every
        self.sample_rows = sample_rows
        self._step: int | None = None
        self._accumulators: dict[tuple[int, str, str], _GemmAccumulator] = {}

    def should_sample(self, step: int) -> bool:
        """Whether `step` is a sampled step (step % every == 0)."""
        return step % self.every == 0

    @contextlib.contextmanager
    def sampling(self, step: int) -> Iterator[bool]:
        """Observe every emulated GEMM inside the block when `step` is sampled; yields whether it is."""
        if not self.should_sample(step):
            yield False
            return
        self._step = int(step)
        previous = qmatmul_module.set_gemm_observer(self._observe)
        try:
            yield True
        finally:
            qmatmul_module.set_gemm_observer(previous)
            self._step = None

    @torch.no_grad()
    def _observe(
        self,
        *,
        name: str,
        gemm: str,
        quant: Any,
        shadow_a: torch.Tensor,
        shadow_b: torch.Tensor,
        product_a: torch.Tensor,
        product_b: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        a_q: torch.Tensor,
        b_q: torch.Tensor,
        a_axis: int,
        b_axis: int,
        a_factor: torch.Tensor | None = None,
        b_factor: torch.Tensor | None = None,
    ) -> None:
        key = (self._step if self._step is not None else -1, name, gemm)
        accumulator = self._accumulators.setdefault(key, _GemmAccumulator())
        (reference, got), rows, total = sampled_product_rows(
            [(shadow_a.detach(), shadow_b.detach()), (product_a.detach(), product_b.detach())], self.sample_rows
        )
        reference, got = reference.double(), got.double()
        for factor in (a_factor, b_factor):  # per-tensor FP8 scales multiply the accumulator
            if factor is not None:
                got = got * factor.double()
        accumulator.signal += float((reference * reference).sum())
        accumulator.noise += float(((got - reference) ** 2).sum())
        accumulator.out_rows += total
        accumulator.out_rows_sampled += rows
        accumulator.calls += 1
        for operand, operand_q, factor, operand_quant, axis, slot in (
            (a, a_q, a_factor, quant.a, a_axis, "a"),
            (b, b_q, b_factor, quant.b, b_axis, "b"),
        ):
            if operand_quant.high_precision:
                amax = tensor_amax(operand)
            else:
                stats = operand_stats(
                    operand, operand_q, operand_quant, axis, factor=factor, sample_rows=self.sample_rows
                )
                accumulator.add_operand(stats)
                amax = stats.amax
            attribute = f"amax_{slot}"
            setattr(accumulator, attribute, max(getattr(accumulator, attribute), amax))

    def drain(self) -> list[dict[str, Any]]:
        """The records gathered since the last drain (one per step, module and GEMM), then forget them."""
        records = []
        for (step, module, gemm), acc in self._accumulators.items():
            ops = acc.operands
            fraction = (lambda count: count / ops.elements) if ops.elements else (lambda count: 0.0)
            records.append(
                {
                    "step": step,
                    "module": module,
                    "gemm": gemm,
                    "sqnr_db": sqnr_db(acc.signal, acc.noise),
                    "saturated_frac": fraction(ops.saturated),
                    "flushed_frac": fraction(ops.flushed),
                    "subnormal_frac": fraction(ops.subnormal),
                    "scale_exp_hist": {
                        int(exponent): int(count) for exponent, count in sorted(ops.scale_exponents.items())
                    },
                    "amax_a": acc.amax_a,
                    "amax_b": acc.amax_b,
                    "calls": acc.calls,
                    "rows_sampled": ops.rows,
                    "rows": ops.rows_total,
                    "out_rows_sampled": acc.out_rows_sampled,
                    "out_rows": acc.out_rows,
                }
            )
        self._accumulators = {}
        return records


def append_jsonl(records: list[dict[str, Any]], path: str | Path) -> None:
    """Append records to a JSON-lines file (inf/NaN written as Infinity/NaN, which json reads back)."""
    if not records:
        return
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
