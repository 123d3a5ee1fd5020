"""Per-GEMM numerics diagnostics, sampled every N steps, free when off.

`NumericsMonitor(model, every)` watches every emulated GEMM of the model's QLinear modules and
attention products (those `apply_recipe` set up). Inside `with monitor.sampling(step):` on a
sampled step (step % every == 0) it installs an observer in mxlab.nn.qmatmul; on other steps
nothing is installed and a GEMM pays one `is None` check. Run the forward and the backward
inside the block to see all three GEMMs of a linear layer (fwd, dgrad, wgrad) and the six of
attention (qk, pv and their `_grad_a` / `_grad_b` backward products). Attention products that
run in the fused Triton kernel (CUDA) are not observed: a sampled step takes the same path as
any other, so sampling does not change the training numerics (or its memory).

For each (step, module, gemm) the record (`monitor.drain()`) holds:

- `sqnr_db`: 10 log10(sum ref^2 / sum (out - ref)^2), where `out` is the emulated product and
  `ref` a shadow product of the unquantized operands computed the same way (float32
  accumulation), so the figure isolates the quantization error. `math.inf` when the two are
  identical (e.g. exactly representable inputs); Python's json writes it as `Infinity`.
- `saturated_frac`: elements whose magnitude over their block scale exceeded the format's max
  normal (they were clipped to it); `flushed_frac`: non-zero elements quantized to zero;
  `subnormal_frac`: non-zero quantized elements below the format's min normal (in units of
  their scale). Fractions of all elements of the quantized (non-high-precision) operands.
  Per-tensor FP8 operands count like MX ones with their single current scale (and add nothing
  to the histogram).
- `scale_exp_hist`: {unbiased E8M0 exponent: number of blocks} over the MX operands.
- `amax_a`, `amax_b`: the largest magnitude of each operand (after a Hadamard transform, if any);
  `calls`: how many products were folded into the record (attention runs one per length bucket).
"""
from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

from mxlab.nn import qmatmul as qmatmul_module
from mxlab.nn.qmatmul import OperandQuant

_FP8_TENSOR_MIN_NORMAL = {"fp8_tensor_e4m3": 2.0 ** -6, "fp8_tensor_e5m2": 2.0 ** -14}


@dataclass
class OperandStats:
    """Element and scale statistics of one quantized operand."""

    elements: int = 0
    saturated: int = 0
    flushed: int = 0
    subnormal: int = 0
    scale_exponents: Counter = field(default_factory=Counter)
    amax: float = 0.0


def _expand_scales(scale_exp: torch.Tensor, blocked_dims: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    for dim in blocked_dims:
        scale_exp = scale_exp.repeat_interleave(32, dim=dim)
    return scale_exp[tuple(slice(0, size) for size in shape)]


def operand_stats(x: torch.Tensor, x_q: torch.Tensor, quant: OperandQuant, axis: int) -> OperandStats:
    """Statistics of x (float32, before quantization) against x_q (its fake-quantized values).

    Refuses a high-precision operand (nothing was quantized).
    """
    if quant.high_precision:
        raise ValueError(f"operand format {quant.fmt!r} is high precision; there are no quantization statistics")
    x = x.detach().float()
    x_q = x_q.detach().float()
    finite = torch.isfinite(x)
    stats = OperandStats(elements=x.numel(), amax=float(x.abs().max()) if x.numel() else 0.0)
    stats.flushed = int(((x_q == 0) & (x != 0) & finite).sum())
    if quant.block_scaled:
        from mxlab.numerics.formats import get_format
        from mxlab.numerics.quant import quantize

        fmt = get_format(quant.fmt)
        axis = axis if quant.block == 32 else -1
        mxt = quantize(x, quant.fmt, block=quant.block, axis=axis, scale_mode=quant.scale_mode, pad=True)
        valid_blocks = mxt.scales != 0xFF
        exponents = mxt.scales.to(torch.int64) - 127
        stats.scale_exponents = Counter(exponents[valid_blocks].tolist())
        blocked_dims = (x.dim() - 2, x.dim() - 1) if quant.block == (32, 32) else (axis % x.dim(),)
        scale = torch.ldexp(torch.ones_like(x), _expand_scales(exponents, blocked_dims, tuple(x.shape)).to(torch.int32))
        max_normal, min_normal = fmt.max_normal, fmt.min_normal
    else:  # per-tensor FP8 with current scaling: scale = fp8_max / amax
        dtype = torch.float8_e4m3fn if quant.fmt.endswith("e4m3") else torch.float8_e5m2
        max_normal, min_normal = torch.finfo(dtype).max, _FP8_TENSOR_MIN_NORMAL[quant.fmt]
        scale = torch.full_like(x, stats.amax / max_normal if stats.amax > 0 else 1.0)
    element_magnitude = x.abs() / scale
    stats.saturated = int(((element_magnitude > max_normal) & finite).sum())
    quantized_magnitude = x_q.abs() / scale
    stats.subnormal = int(((quantized_magnitude < min_normal) & (x_q != 0)).sum())
    return stats


@dataclass
class _GemmAccumulator:
    signal: float = 0.0
    noise: float = 0.0
    calls: int = 0
    elements: int = 0
    saturated: int = 0
    flushed: int = 0
    subnormal: int = 0
    scale_exponents: Counter = field(default_factory=Counter)
    amax_a: float = 0.0
    amax_b: float = 0.0

    def add_operand(self, stats: OperandStats) -> None:
        self.elements += stats.elements
        self.saturated += stats.saturated
        self.flushed += stats.flushed
        self.subnormal += stats.subnormal
        self.scale_exponents.update(stats.scale_exponents)


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
    """Samples per-GEMM numerics every `every` steps (see the module docstring).

    Refuses `every` < 1.
    """

    def __init__(self, model: Optional[nn.Module] = None, every: int = 100) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.model = model
        self.every = every
        self._step: Optional[int] = None
        self._accumulators: dict[tuple[int, str, str], _GemmAccumulator] = {}

    def should_sample(self, step: int) -> bool:
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
    def _observe(self, *, name: str, gemm: str, quant: Any, shadow_a: torch.Tensor, shadow_b: torch.Tensor,
                 out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_q: torch.Tensor, b_q: torch.Tensor,
                 a_axis: int, b_axis: int) -> None:
        key = (self._step if self._step is not None else -1, name, gemm)
        accumulator = self._accumulators.setdefault(key, _GemmAccumulator())
        reference = torch.matmul(shadow_a.detach().float(), shadow_b.detach().float()).double()
        out = out.detach().double()
        accumulator.signal += float((reference * reference).sum())
        accumulator.noise += float(((out - reference) ** 2).sum())
        accumulator.calls += 1
        for operand, operand_q, operand_quant, axis, slot in ((a, a_q, quant.a, a_axis, "a"), (b, b_q, quant.b, b_axis, "b")):
            if operand_quant.high_precision:
                amax = float(operand.detach().abs().max()) if operand.numel() else 0.0
            else:
                stats = operand_stats(operand, operand_q, operand_quant, axis)
                accumulator.add_operand(stats)
                amax = stats.amax
            attribute = f"amax_{slot}"
            setattr(accumulator, attribute, max(getattr(accumulator, attribute), amax))

    def drain(self) -> list[dict[str, Any]]:
        """The records gathered since the last drain (one per step, module and GEMM), then forget them."""
        records = []
        for (step, module, gemm), acc in self._accumulators.items():
            fraction = (lambda count: count / acc.elements) if acc.elements else (lambda count: 0.0)
            records.append({
                "step": step,
                "module": module,
                "gemm": gemm,
                "sqnr_db": sqnr_db(acc.signal, acc.noise),
                "saturated_frac": fraction(acc.saturated),
                "flushed_frac": fraction(acc.flushed),
                "subnormal_frac": fraction(acc.subnormal),
                "scale_exp_hist": {int(exponent): int(count) for exponent, count in sorted(acc.scale_exponents.items())},
                "amax_a": acc.amax_a,
                "amax_b": acc.amax_b,
                "calls": acc.calls,
            })
        self._accumulators = {}
        return records


def append_jsonl(records: list[dict[str, Any]], path: str | Path) -> None:
    """Append records to a JSON-lines file (inf/NaN written as Infinity/NaN, which json reads back)."""
    if not records:
        return
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
