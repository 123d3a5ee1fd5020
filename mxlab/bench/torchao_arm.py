"""The torchao arm of `mxlab bench linear`: torchao's emulated MXFP8 linear layer under torch.compile.

torchao is optional (`pip install 'mxlab[torchao]'`, checked against 0.18). Its layer is torchao's
`MXFP8Linear` with `KernelPreference.EMULATED` and `ScaleCalculationMode.RCEIL` (the layer that
`MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL` configures; built directly, since `quantize_`'s conversion asserts a
torch newer than 2.11): every GEMM operand of the forward, dgrad and wgrad quantized to E4M3 in blocks of 32
along the contraction dimension with RCEIL E8M0 scales, round to nearest even, then dequantized and multiplied
in BF16 (`KernelPreference.EMULATED`) -- the semantics of this project's mxfp8-rceil recipe, which the bench
checks per shape on the forward output (`same bits`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TORCHAO_ARM = "torchao mxfp8 (emulated, compiled)"
MXLAB_ARMS = ("mxlab mxfp8 (emulated)", "mxlab mxfp8 (emulated) compiled")  # mxfp8-rceil, eager and compiled


@dataclass(frozen=True)
class Torchao:
    """What the arm needs from torchao: its version, its MXFP8Linear class and the emulated RCEIL options."""

    version: str
    layer_class: Any
    options: dict[str, Any]


@dataclass(frozen=True)
class BitCheck:
    """Forward outputs of torchao's layer and mxlab's mxfp8-rceil QLinear on the same x and weight."""

    same_bits: bool
    max_abs_diff: float

    def note(self) -> str:
        return "same bits: yes" if self.same_bits else f"same bits: no (max |diff| {self.max_abs_diff:.3g})"


def load_torchao() -> tuple[Torchao | None, str]:
    """(handle, "") when torchao's emulated MXFP8 linear imports and builds on this torch; else
    (None, one line saying that the torchao arm is omitted and why). Never raises."""
    try:
        torchao = importlib.import_module("torchao")
        linear = importlib.import_module("torchao.prototype.moe_training.mxfp8_linear")
        options = {"kernel_preference": linear.KernelPreference.EMULATED}
        options["scale_calculation_mode"] = linear.ScaleCalculationMode.RCEIL
        handle = Torchao(str(getattr(torchao, "__version__", "?")), linear.MXFP8Linear, options)
        torchao_linear(torch.zeros(32, 32), handle)  # a torch this torchao refuses fails here, not mid-bench
    except Exception as error:  # missing, or an API other than 0.18's
        reason = str(error).splitlines()[0] if str(error) else ""
        return None, (
            f"torchao arm omitted: torchao's emulated MXFP8 linear is not importable ({type(error).__name__}: "
            f"{reason}); pip install 'mxlab[torchao]'"
        )
    return handle, ""


def torchao_linear(weight: torch.Tensor, torchao: Torchao) -> nn.Module:
    """A torchao MXFP8Linear (emulated, RCEIL), no bias, holding a copy of `weight` (N, K)."""
    n, k = weight.shape
    layer = torchao.layer_class(k, n, bias=False, device=weight.device, dtype=weight.dtype, **torchao.options)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def bit_check(torchao_layer: nn.Module, mxlab_layer: nn.Module, x: torch.Tensor) -> BitCheck:
    """Both layers' forward on x (torchao's with autograd as timed, so a compiled layer is not recompiled)."""
    theirs = torchao_layer(x).detach()
    with torch.no_grad():
        ours = mxlab_layer(x)
    same = ours.dtype == theirs.dtype and torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    diff = 0.0 if same else float((ours.float() - theirs.float()).abs().max())
    return BitCheck(same, diff)


def torchao_summary(results: Sequence[Any], checks: dict[tuple[int, int, int], BitCheck]) -> list[dict[str, Any]]:
    """Per shape with a torchao row (LinearMeasurement): its ms and ratio, the fastest mxlab mxfp8-rceil row
    (eager or compiled), `mxlab_ahead` (True when that row's ms is below torchao's; None when either did not
    run) and the forward bit check (None where it was not made)."""
    by_shape: dict[tuple[int, int, int], dict[str, Any]] = {}
    for r in results:
        by_shape.setdefault((r.m, r.k, r.n), {})[r.arm] = r
    rows = []
    for shape, arms in by_shape.items():
        theirs = arms.get(TORCHAO_ARM)
        if theirs is None:
            continue
        ours = min(
            (arms[a] for a in MXLAB_ARMS if a in arms and arms[a].ms is not None), key=lambda r: r.ms, default=None
        )
        check = checks.get(shape)
        rows.append(
            {
                "m": shape[0],
                "k": shape[1],
                "n": shape[2],
                "torchao_ms": theirs.ms,
                "torchao_ratio_to_bf16": theirs.ratio_to_bf16,
                "mxlab_arm": ours.arm if ours else None,
                "mxlab_ms": ours.ms if ours else None,
                "mxlab_ahead": None if ours is None or theirs.ms is None else ours.ms < theirs.ms,
                "same_bits": check.same_bits if check else None,
                "max_abs_diff": check.max_abs_diff if check else None,
            }
        )
    return rows


def summary_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per shape: which of mxlab's and torchao's MXFP8 layers is ahead, and the bit check."""
    lines = []
    for row in rows:
        shape = f"{row['m']} x {row['k']} x {row['n']}"
        if row["mxlab_ahead"] is None:
            verdict = "not compared (an arm did not run)"
        else:
            leader = "mxlab" if row["mxlab_ahead"] else "torchao"
            times = f"{row['mxlab_arm']} {row['mxlab_ms']:.3f} ms vs torchao {row['torchao_ms']:.3f} ms"
            verdict = f"{leader} ahead ({times})"
        bits = "not checked" if row["same_bits"] is None else BitCheck(row["same_bits"], row["max_abs_diff"]).note()
        lines.append(f"torchao vs mxlab MXFP8 at {shape}: {verdict}; {bits}")
    return lines


__all__ = [
    "TORCHAO_ARM",
    "BitCheck",
    "Torchao",
    "bit_check",
    "load_torchao",
    "summary_lines",
    "torchao_linear",
    "torchao_summary",
]
