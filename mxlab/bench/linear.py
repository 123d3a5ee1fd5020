"""`mxlab bench linear`: one linear layer's forward + backward, every implementation as a ratio to BF16.

Implementations ("arms"), all on BF16 inputs (M, K), weight (N, K), no bias, timed as
`y = layer(x); y.backward(dy)` (three GEMMs) by CUDA events, median of `repeat` after warm-up:

| arm | what runs |
|---|---|
| torch bf16 | `nn.Linear` in BF16 (cuBLAS): the baseline every ratio divides by |
| mxlab mxfp8 (emulated) | `QLinear`, mxfp8-rceil: operands MX-quantized (Triton casts), BF16 GEMMs, FP32 accumulation |
| mxlab mxfp8-hadamard (emulated) | the same, wgrad operands through the fused random Hadamard + MX cast |
| mxlab fp8-tensor (emulated) | `QLinear` with the fp8-tensor policy: per-tensor FP8 current scaling, emulated |
| TE bf16 | `te.Linear` without FP8 |
| TE fp8_current / fp8_delayed / fp8_block / mxfp8 | `te.Linear` under `te.autocast` with that recipe |
| torchao mxfp8 (emulated, compiled) | torchao's emulated MXFP8 RCEIL linear, compiled (`mxlab.bench.torchao_arm`) |

Shapes: recommendation-model token counts M = 16384 and 65536, K = N = 512, 1024, 4096. The
baseline is measured in the same run on the same tensors. TE arms are skipped, with the reason in
the note column, when TE is missing or the GPU cannot run the recipe (MXFP8 needs compute
capability 10.0). The torchao arm is omitted, with one line saying so, when torchao is not importable; where it
runs, its forward output is checked against mxlab's mxfp8-rceil layer (`same bits` in its note) and a line per
shape says which of the two MXFP8 layers is ahead. mxlab's emulation quantizes in Triton kernels and multiplies
the dequantized values with FP32 accumulation, so it is a numerics tool, not a fast path: expect it above 1x;
TE's FP8 at K = N <= 1024 is also slower than BF16 on the H200 (its fixed cost per call dominates small GEMMs;
see shared/te/README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mxlab.bench import parse_dims
from mxlab.bench.timing import events_ms
from mxlab.bench.torchao_arm import (
    TORCHAO_ARM,
    BitCheck,
    Torchao,
    bit_check,
    load_torchao,
    summary_lines,
    torchao_linear,
    torchao_summary,
)
from mxlab.io import write_json

DEFAULT_SHAPES: tuple[tuple[int, int, int], ...] = tuple((m, k, k) for m in (16384, 65536) for k in (512, 1024, 4096))
BASELINE = "torch bf16"
EMULATED_ARMS = {
    "mxlab mxfp8 (emulated)": "mxfp8-rceil",
    "mxlab mxfp8-hadamard (emulated)": "mxfp8-hadamard",
    "mxlab fp8-tensor (emulated)": "fp8-tensor",
}
TE_ARMS = ("TE bf16", "TE fp8_current", "TE fp8_delayed", "TE fp8_block", "TE mxfp8")
ARMS = (BASELINE, *EMULATED_ARMS, *TE_ARMS, TORCHAO_ARM)


@dataclass
class LinearMeasurement:
    """One arm on one shape: median ms of forward + backward and its ratio to BF16 nn.Linear (None: not run)."""

    m: int
    k: int
    n: int
    arm: str
    ms: float | None
    ratio_to_bf16: float | None
    note: str = ""


def parse_shape(text: str) -> tuple[int, int, int]:
    """(M, K, N) from "MxKxN"; refuses anything else (ValueError naming the text)."""
    return parse_dims(text, "MxKxN", "16384x1024x1024")  # type: ignore[return-value]


def _fwd_bwd(
    layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, context: Callable[[], Any] | None = None
) -> Callable[[], None]:
    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        if context is None:
            y = layer(x)
        else:
            with context():
                y = layer(x)
        y.backward(grad)

    return step


def _arm_steps(
    k: int,
    n: int,
    weight: torch.Tensor,
    x: torch.Tensor,
    grad: torch.Tensor,
    compile: bool = False,
    torchao: Torchao | None = None,
) -> tuple[dict[str, tuple[Callable[[], None] | None, str]], BitCheck | None]:
    """(arm -> (step, note), torchao's forward bit check or None); step None when the arm cannot run here (the
    note says why). With `compile`, the baseline and each emulated arm also as "<arm> compiled" (torch.compile,
    default settings; compiled in the warm-up calls, which are not timed). With `torchao`, its compiled arm too
    (compiled by the bit check, else in the warm-up); without it, no torchao arm at all."""
    from mxlab.nn.linear import QLinear
    from mxlab.recipe import load_recipe
    from mxlab.recipe.backends.te import (
        TE_RECIPES,
        BackendUnavailableError,
        TEPolicy,
        build_te_recipe,
        load_transformer_engine,
        unavailable_reason,
    )

    device = x.device
    steps: dict[str, tuple[Callable[[], None] | None, str]] = {}
    baseline = nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        baseline.weight.copy_(weight)
    steps[BASELINE] = (_fwd_bwd(baseline, x, grad), "cuBLAS BF16")
    layers: dict[str, nn.Module] = {}
    if compile:
        steps[f"{BASELINE} compiled"] = (_fwd_bwd(torch.compile(baseline), x, grad), "torch.compile")
    for arm, recipe_name in EMULATED_ARMS.items():
        recipe = load_recipe(recipe_name)
        layer = QLinear(
            k,
            n,
            bias=False,
            precision=recipe.policies[recipe.default].to_precision(arm),
            device=device,
            dtype=torch.bfloat16,
        )
        with torch.no_grad():
            layer.weight.copy_(weight)
        steps[arm] = (_fwd_bwd(layer, x, grad), f"recipe {recipe_name}")
        layers[recipe_name] = layer
        if compile:
            steps[f"{arm} compiled"] = (_fwd_bwd(torch.compile(layer), x, grad), f"recipe {recipe_name}, torch.compile")
    check = None
    if torchao is not None:
        compiled = torch.compile(torchao_linear(weight, torchao))
        note = f"torchao {torchao.version} MXFP8_EMULATED_RCEIL, torch.compile"
        try:
            check = bit_check(compiled, layers["mxfp8-rceil"], x)
            note += f"; {check.note()}"
        except Exception as error:  # the step fails the same way and says so in its note
            note += f"; bits not checked: {type(error).__name__}"
        steps[TORCHAO_ARM] = (_fwd_bwd(compiled, x, grad), note)
    try:
        handle = load_transformer_engine()
    except BackendUnavailableError as error:
        for arm in TE_ARMS:
            steps[arm] = (None, f"skipped: {error}")
        return steps, check

    def te_layer() -> nn.Module:  # one module per arm: TE keeps per-recipe state in the module
        layer = handle.pytorch.Linear(k, n, bias=False, params_dtype=torch.bfloat16, device=device)
        with torch.no_grad():
            layer.weight.copy_(weight)
        return layer

    steps["TE bf16"] = (_fwd_bwd(te_layer(), x, grad), f"transformer-engine {handle.version}")
    for te_name in TE_RECIPES:
        arm = f"TE {te_name}"
        reason = unavailable_reason([te_name], device)
        if reason is not None:
            steps[arm] = (None, f"skipped: {reason}")
            continue
        misaligned = [f"{label} {size}" for label, size in (("M", x.shape[0]), ("K", k), ("N", n)) if size % 32]
        if misaligned:
            steps[arm] = (None, f"skipped: {', '.join(misaligned)} not a multiple of 32")
            continue
        policy = TEPolicy("bench", te_name, {"fp8_current": "hybrid", "fp8_delayed": "hybrid"}.get(te_name, "e4m3"))
        te_recipe = build_te_recipe(policy, handle)
        steps[arm] = (
            _fwd_bwd(te_layer(), x, grad, lambda te_recipe=te_recipe: handle.autocast(te_recipe)),
            policy.scaling(),
        )
    return steps, check


def run_linear_bench(
    shapes: Sequence[tuple[int, int, int]] = DEFAULT_SHAPES,
    *,
    repeat: int = 20,
    json_path: Path | None = None,
    echo: Callable[[str], None] = print,
    compile: bool = False,
) -> list[LinearMeasurement]:
    """Time every arm on every shape (see the module docstring); returns the measurements and prints a table.
    `compile` adds each emulated arm and the baseline under torch.compile, as ratios to the same eager baseline.
    The torchao arm runs where torchao imports; else one printed line says it is omitted.

    Refuses (RuntimeError) without CUDA, (ValueError) an empty shape list or repeat < 1. An arm that
    fails on a shape (e.g. out of memory) is recorded with its error in the note.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "mxlab bench linear times CUDA kernels and torch.cuda.is_available() is False on this machine"
        )
    if not shapes:
        raise ValueError("no shapes to time; give at least one MxKxN")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device).manual_seed(0)
    torchao, omitted = load_torchao()
    if omitted:
        echo(omitted)
    checks: dict[tuple[int, int, int], BitCheck] = {}
    results: list[LinearMeasurement] = []
    for m, k, n in shapes:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_(True)
        weight = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=generator) / k**0.5
        grad = torch.randn(m, n, device=device, dtype=torch.bfloat16, generator=generator)
        timed: dict[str, tuple[float | None, str]] = {}
        steps, check = _arm_steps(k, n, weight, x, grad, compile, torchao)
        if check is not None:
            checks[(m, k, n)] = check
        for arm, (step, note) in steps.items():
            if step is None:
                timed[arm] = (None, note)
                continue
            try:
                timed[arm] = (events_ms(step, repeat=repeat), note)
            except Exception as error:  # out of memory, or a TE shape refusal
                timed[arm] = (
                    None,
                    f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                )
            torch.cuda.empty_cache()
        base_ms = timed[BASELINE][0]
        for arm, (ms, note) in timed.items():
            ratio = ms / base_ms if ms is not None and base_ms else None
            results.append(LinearMeasurement(m, k, n, arm, ms, ratio, note))
        del x, weight, grad
        del steps
        torch.cuda.empty_cache()
    echo(format_table(results, torch.cuda.get_device_name(device)))
    comparison = torchao_summary(results, checks)
    for line in summary_lines(comparison):
        echo(line)
    if json_path is not None:
        write_json(
            Path(json_path),
            {
                "device": torch.cuda.get_device_name(device),
                "torch": torch.__version__,
                "repeat": repeat,
                "compile": compile,
                "measurements": [asdict(r) for r in results],
                "torchao": {
                    "version": torchao.version if torchao else None,
                    "omitted": omitted or None,
                    "shapes": comparison,
                },
            },
        )
    return results


def format_table(results: Sequence[LinearMeasurement], device_name: str = "") -> str:
    """A fixed-width table: shape, arm, ms, ratio to BF16 nn.Linear, note."""
    rows = [["M x K x N", "arm", "ms (fwd+bwd)", "x BF16", "note"]]
    for r in results:
        rows.append(
            [
                f"{r.m} x {r.k} x {r.n}",
                r.arm,
                "-" if r.ms is None else f"{r.ms:.3f}",
                "-" if r.ratio_to_bf16 is None else f"{r.ratio_to_bf16:.2f}",
                r.note,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        f"linear forward + backward, BF16 inputs, no bias{' on ' + device_name if device_name else ''}; "
        f"x BF16 = ms / ms of torch bf16 nn.Linear on the same shape, same run"
    ]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(2, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


__all__ = ["ARMS", "DEFAULT_SHAPES", "LinearMeasurement", "format_table", "parse_shape", "run_linear_bench"]
