"""`mxlab check te`: how closely mxlab's emulation matches Transformer Engine's real kernels.

On a CUDA machine with TE, the same inputs go through both:

- operands: TE's quantizers against mxlab's emulation of the same scheme, element by element
  (bit patterns of the dequantized float32 values), with the scale:
  - `fp8_current e4m3` / `fp8_current e5m2`: TE's Float8CurrentScalingQuantizer against
    `mxlab.numerics.quant.fake_quantize(x, "fp8_tensor_e4m3" / "fp8_tensor_e5m2")`;
  - `mxfp8 rowwise` / `mxfp8 columnwise`: TE's MXFP8Quantizer against `mxlab.numerics.quant.quantize(x,
    "e4m3", block=32, scale_mode=...)` along the last / first dim, element codes and E8M0 scale bytes,
    for each of mxlab's scale modes (TE's kernels round the scale up: "rceil" is expected to match);
    only where TE runs MXFP8 (compute capability 10.0 and newer; on Hopper TE refuses MXFP8
    execution, and its quantizer's output there agreed with none of mxlab's scale modes);
- GEMMs: `te.Linear` forward and backward under `te.autocast(Float8CurrentScaling())` (and
  MXFP8BlockScaling where the GPU runs it) against `QLinear` with the same scheme emulated
  (recipe fp8-tensor / mxfp8-rceil policies): relative Frobenius error of y, dx and dW between the
  two, and of each against the FP32 product of the unquantized operands.

Cases: random (`normal`, `heavy_tail` log-normal magnitudes over ~12 binades, `outlier` one element
1e4 times the rest) and adversarial (`ties`: values halfway between FP8 neighbours at scale 1,
`tiny_amax`: amax ~1e-39, whose FP8 scale overflows float32, `zeros`). Every differing element is
put in a class that explains it: `scale` (TE's scale differs from mxlab's; the elements follow),
`one_step` (same scale, neighbouring FP8 values: rounding of x * scale), `nonfinite` (NaN/Inf in one
only), `unexplained` (anything else).

Refuses, before running anything, on a machine without CUDA or without TE (with how to install it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mxlab.recipe.backends.te import BackendUnavailableError, TEHandle, load_transformer_engine, te_recipe_support

CASES = ("normal", "heavy_tail", "outlier", "ties", "tiny_amax", "zeros")
MX_SCALE_MODES = ("rceil", "floor", "ceil", "even")
DEFAULT_SHAPE = (256, 512, 384)  # M, K, N of the GEMMs; multiples of 128 for every TE recipe


@dataclass
class OperandComparison:
    """TE's and mxlab's quantization of one tensor under one scheme."""

    case: str
    scheme: str  # fp8_current e4m3 | fp8_current e5m2 | mxfp8 rowwise MODE | mxfp8 columnwise MODE
    elements: int
    identical_fraction: float  # elements whose dequantized float32 bit patterns (MX: codes) agree
    scales_identical_fraction: float
    differences: list[str] = field(default_factory=list)  # "CLASS: count (detail)"


@dataclass
class GemmComparison:
    """TE's GEMM against mxlab's emulation of it (and both against FP32) for one product."""

    case: str
    scheme: str  # fp8_current | mxfp8
    gemm: str  # fwd | dgrad | wgrad
    rel_error_te_vs_mxlab: float
    rel_error_te_vs_fp32: float
    rel_error_mxlab_vs_fp32: float


@dataclass
class TECheckReport:
    """What `run_te_check` measured, and what it could not (scheme -> reason)."""

    device: str
    te_version: str
    shape: tuple[int, int, int]
    operands: list[OperandComparison] = field(default_factory=list)
    gemms: list[GemmComparison] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-serializable dict."""
        return asdict(self)

    def table(self) -> str:
        """The report as fixed-width text tables."""
        lines = [
            f"Transformer Engine {self.te_version} on {self.device}; "
            f"GEMMs M x K x N = {' x '.join(map(str, self.shape))}",
            "",
        ]
        lines.append("Quantized operands: fraction bit-identical (elements, scales), and the differences explained")
        rows = [["case", "scheme", "elements", "identical", "scales", "differences"]]
        rows += [
            [
                r.case,
                r.scheme,
                str(r.elements),
                f"{r.identical_fraction:.6f}",
                f"{r.scales_identical_fraction:.6f}",
                "; ".join(r.differences) or "-",
            ]
            for r in self.operands
        ]
        lines += _format_rows(rows)
        lines += ["", "GEMM outputs: relative Frobenius error"]
        rows = [["case", "scheme", "gemm", "TE vs mxlab", "TE vs FP32", "mxlab vs FP32"]]
        rows += [
            [
                r.case,
                r.scheme,
                r.gemm,
                f"{r.rel_error_te_vs_mxlab:.3e}",
                f"{r.rel_error_te_vs_fp32:.3e}",
                f"{r.rel_error_mxlab_vs_fp32:.3e}",
            ]
            for r in self.gemms
        ]
        lines += _format_rows(rows)
        for scheme, reason in self.not_run.items():
            lines.append(f"not run: {scheme}: {reason}")
        return "\n".join(lines)


def _format_rows(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    out.insert(1, "  ".join("-" * width for width in widths))
    return out


# --------------------------------------------------------------------------------- refusal
def te_check_refusal() -> str | None:
    """None when `mxlab check te` can run here; else why not and how to get there."""
    reasons = []
    try:
        load_transformer_engine()
    except BackendUnavailableError as error:
        reasons.append(str(error))
    if not torch.cuda.is_available():
        reasons.append(
            "it compares against TE's CUDA kernels and torch.cuda.is_available() is False on this machine; "
            "run it on a GPU machine (Hopper for per-tensor FP8, compute capability 10.0 for MXFP8)"
        )
    return "; ".join(reasons) if reasons else None


# --------------------------------------------------------------------------------- inputs
def make_case(
    case: str, rows: int, cols: int, generator: torch.Generator, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """The (rows, cols) test tensor of `case` (one of CASES) on the CPU, in `dtype`."""
    if case == "normal":
        x = torch.randn(rows, cols, generator=generator)
    elif case == "heavy_tail":
        x = torch.randn(rows, cols, generator=generator).sign() * torch.exp(
            2.0 * torch.randn(rows, cols, generator=generator)
        )
    elif case == "outlier":
        x = torch.randn(rows, cols, generator=generator)
        x[rows // 3, cols // 5] = 1e4
    elif case == "ties":
        # amax 448 (E4M3's max) gives scale 1; the rest lie halfway between neighbouring E4M3 values
        mantissa = torch.randint(0, 8, (rows, cols), generator=generator).float()
        exponent = torch.randint(-6, 8, (rows, cols), generator=generator).float()
        sign = torch.randint(0, 2, (rows, cols), generator=generator).float() * 2 - 1
        x = sign * (1.0 + (mantissa + 0.5) / 8.0) * torch.exp2(exponent)
        x[0, 0] = 448.0
    elif case == "tiny_amax":
        x = torch.randn(rows, cols, generator=generator) * 1e-39
    elif case == "zeros":
        x = torch.zeros(rows, cols)
    else:
        raise ValueError(f"unknown case {case!r}; accepted: {', '.join(CASES)}")
    return x.to(dtype)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference||_F / ||reference||_F in float64 (0 when both are zero, inf when only the reference is)."""
    value, reference = value.double(), reference.double()
    denominator = reference.norm().item()
    numerator = (value - reference).norm().item()
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else math.inf
    return numerator / denominator


# --------------------------------------------------------------------------------- operand checks
def classify_differences(
    te_values: torch.Tensor,
    mx_values: torch.Tensor,
    scales_agree: bool,
    fp8_dtype: torch.dtype,
    te_scale_inv: float,
    mx_scale_inv: float,
) -> list[str]:
    """The differing elements of two dequantized float32 tensors of one per-tensor FP8 scheme, by explanation:
    "CLASS: count ..." for the classes scale, one_step, nonfinite, unexplained (empty: bit-identical)."""
    te_bits, mx_bits = te_values.view(torch.int32), mx_values.view(torch.int32)
    differ = te_bits != mx_bits
    count = int(differ.sum())
    if count == 0:
        return []
    if not scales_agree:
        return [
            f"scale: {count} elements follow a different scale (scale_inv TE {te_scale_inv!r}, mxlab {mx_scale_inv!r})"
        ]
    nonfinite = differ & (~torch.isfinite(te_values) | ~torch.isfinite(mx_values))
    finite = differ & ~nonfinite
    one_step = torch.zeros_like(differ)
    if finite.any():
        # neighbouring FP8 values at the same scale: their codes differ by one
        te_codes = (te_values[finite] / mx_scale_inv).to(fp8_dtype).view(torch.uint8).int()
        mx_codes = (mx_values[finite] / mx_scale_inv).to(fp8_dtype).view(torch.uint8).int()
        one_step[finite] = (te_codes - mx_codes).abs() == 1
    other = finite & ~one_step
    out = []
    if int(one_step.sum()):
        out.append(f"one_step: {int(one_step.sum())} elements one FP8 step apart (rounding of x * scale)")
    if int(nonfinite.sum()):
        out.append(f"nonfinite: {int(nonfinite.sum())} elements NaN/Inf in one result only")
    if int(other.sum()):
        out.append(f"unexplained: {int(other.sum())} elements")
    return out


def _quantizer_class(handle: TEHandle, name: str, module: str) -> Any:
    """A TE quantizer class: exported by transformer_engine.pytorch (recent TE) or from its tensor module."""
    cls = getattr(handle.pytorch, name, None)
    if cls is None:
        import importlib

        cls = getattr(importlib.import_module(f"transformer_engine.pytorch.tensor.{module}"), name)
    return cls


def compare_per_tensor(handle: TEHandle, x: torch.Tensor, fmt: str, case: str) -> OperandComparison:
    """TE's Float8CurrentScalingQuantizer against mxlab's fake_quantize(x, "fp8_tensor_" + fmt) on one tensor."""
    import transformer_engine_torch as tex

    from mxlab.numerics.per_tensor import PER_TENSOR_FP8, per_tensor_fp8_scale
    from mxlab.numerics.quant import fake_quantize

    te_dtype = tex.DType.kFloat8E4M3 if fmt == "e4m3" else tex.DType.kFloat8E5M2
    fp8_dtype = PER_TENSOR_FP8[f"fp8_tensor_{fmt}"]
    quantizer = _quantizer_class(handle, "Float8CurrentScalingQuantizer", "float8_tensor")(
        te_dtype, x.device, rowwise=True, columnwise=False
    )
    quantized = quantizer(x)
    te_values = quantized.dequantize(dtype=torch.float32)
    te_scale_inv = float(quantized._scale_inv.float().reshape(-1)[0])
    mx_values = fake_quantize(x.float(), f"fp8_tensor_{fmt}")
    mx_scale = per_tensor_fp8_scale(x.float().abs().amax(), f"fp8_tensor_{fmt}")
    mx_scale_inv = float(torch.reciprocal(mx_scale))
    scales_agree = te_scale_inv == mx_scale_inv or (math.isnan(te_scale_inv) and math.isnan(mx_scale_inv))
    identical = (te_values.view(torch.int32) == mx_values.view(torch.int32)).float().mean().item()
    differences = classify_differences(te_values, mx_values, scales_agree, fp8_dtype, te_scale_inv, mx_scale_inv)
    return OperandComparison(
        case, f"fp8_current {fmt}", x.numel(), identical, 1.0 if scales_agree else 0.0, differences
    )


def _mx_parts(quantized: Any, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    prefix = "_rowwise" if rowwise else "_columnwise"
    data = getattr(quantized, f"{prefix}_data")
    scales = getattr(quantized, f"{prefix}_scale_inv")
    return data.view(torch.uint8), scales.view(torch.uint8)


def compare_mxfp8(handle: TEHandle, x: torch.Tensor, case: str) -> list[OperandComparison]:
    """TE's MXFP8Quantizer (E4M3) against mxlab's quantize(x, "e4m3") rowwise and columnwise, per scale mode."""
    import transformer_engine_torch as tex

    from mxlab.numerics.quant import quantize

    rows, cols = x.shape
    quantized = _quantizer_class(handle, "MXFP8Quantizer", "mxfp8_tensor")(
        tex.DType.kFloat8E4M3, rowwise=True, columnwise=True
    )(x)
    swizzled = bool(getattr(quantized, "_with_gemm_swizzled_scales", False))  # scales in the GEMM's tiled layout
    out = []
    for rowwise in (True, False):
        te_codes, te_scales = _mx_parts(quantized, rowwise)
        if te_codes.shape != x.shape and te_codes.shape == (cols, rows):
            te_codes = te_codes.t()
        scale_shape = (rows, cols // 32) if rowwise else (rows // 32, cols)
        te_scales = te_scales[: scale_shape[0], : scale_shape[1]]
        for mode in MX_SCALE_MODES:
            mx = quantize(x, "e4m3", block=32, axis=-1 if rowwise else 0, scale_mode=mode)
            same = te_codes == mx.codes
            if swizzled:
                differing = int((~same).sum())
                out.append(
                    OperandComparison(
                        case,
                        f"mxfp8 {'rowwise' if rowwise else 'columnwise'} {mode}",
                        x.numel(),
                        same.float().mean().item(),
                        float("nan"),
                        [f"unclassified: {differing} elements (TE's scales are swizzled for the GEMM; not compared)"]
                        if differing
                        else [],
                    )
                )
                continue
            same_scales = te_scales == mx.scales
            differences = []
            if not bool(same.all()):
                scale_rows = same_scales.repeat_interleave(32, dim=1 if rowwise else 0)
                with_scale = int((~same & ~scale_rows).sum())
                same_scale = int((~same & scale_rows).sum())
                if with_scale:
                    differences.append(f"scale: {with_scale} elements in blocks whose E8M0 scale differs")
                if same_scale:
                    differences.append(f"unexplained: {same_scale} elements differ under the same scale")
            out.append(
                OperandComparison(
                    case,
                    f"mxfp8 {'rowwise' if rowwise else 'columnwise'} {mode}",
                    x.numel(),
                    same.float().mean().item(),
                    same_scales.float().mean().item(),
                    differences,
                )
            )
    return out


# --------------------------------------------------------------------------------- GEMM checks
def compare_linear(
    handle: TEHandle, x: torch.Tensor, weight: torch.Tensor, grad_output: torch.Tensor, scheme: str, case: str
) -> list[GemmComparison]:
    """te.Linear forward+backward under `scheme`'s TE recipe against QLinear emulating it, and both against FP32."""
    from mxlab.nn.linear import QLinear
    from mxlab.recipe.backends.te import TEPolicy, build_te_recipe
    from mxlab.recipe.library import load_recipe

    te = handle.pytorch
    rows, in_features = x.shape
    out_features = weight.shape[0]
    te_linear = te.Linear(in_features, out_features, bias=False, params_dtype=x.dtype, device=x.device)
    with torch.no_grad():
        te_linear.weight.copy_(weight)
    te_x = x.detach().clone().requires_grad_(True)
    te_recipe = build_te_recipe(TEPolicy("check", scheme, "hybrid" if scheme == "fp8_current" else "e4m3"), handle)
    with handle.autocast(te_recipe):
        te_y = te_linear(te_x)
    te_y.backward(grad_output)

    recipe = load_recipe("fp8-tensor" if scheme == "fp8_current" else "mxfp8-rceil")
    precision = recipe.policies[recipe.default].to_precision("check")
    mx_linear = QLinear(in_features, out_features, bias=False, precision=precision, device=x.device, dtype=x.dtype)
    with torch.no_grad():
        mx_linear.weight.copy_(weight)
    mx_x = x.detach().clone().requires_grad_(True)
    mx_y = mx_linear(mx_x)
    mx_y.backward(grad_output)

    x32, w32, g32 = x.float(), weight.float(), grad_output.float()
    exact = {"fwd": x32 @ w32.t(), "dgrad": g32 @ w32, "wgrad": g32.t() @ x32}
    te_out = {"fwd": te_y.detach(), "dgrad": te_x.grad, "wgrad": te_linear.weight.grad}
    mx_out = {"fwd": mx_y.detach(), "dgrad": mx_x.grad, "wgrad": mx_linear.weight.grad}
    return [
        GemmComparison(
            case,
            scheme,
            gemm,
            relative_error(te_out[gemm], mx_out[gemm]),
            relative_error(te_out[gemm], exact[gemm]),
            relative_error(mx_out[gemm], exact[gemm]),
        )
        for gemm in ("fwd", "dgrad", "wgrad")
    ]


def _attempt(report: TECheckReport, scheme: str, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except Exception as error:  # TE refuses (unsupported GPU, shape) with its own exception types
        report.not_run.setdefault(scheme, f"{type(error).__name__}: {error}")
        return None


def run_te_check(
    *, seed: int = 0, shape: tuple[int, int, int] = DEFAULT_SHAPE, device: str | None = None
) -> TECheckReport:
    """Compare mxlab's emulation with TE's kernels (see the module docstring); returns the TECheckReport.

    Refuses (BackendUnavailableError, before running anything) without CUDA or TE, and (ValueError)
    a shape whose dims are not multiples of 128.
    """
    refusal = te_check_refusal()
    if refusal is not None:
        raise BackendUnavailableError(refusal)
    if any(dim % 128 for dim in shape):
        raise ValueError(f"shape {shape}: M, K and N must be multiples of 128 (every TE recipe runs them)")
    handle = load_transformer_engine()
    device = device or f"cuda:{torch.cuda.current_device()}"
    rows, in_features, out_features = shape
    report = TECheckReport(
        device=torch.cuda.get_device_name(torch.device(device)), te_version=handle.version, shape=shape
    )
    mxfp8_ok, mxfp8_reason = te_recipe_support(handle, "mxfp8")
    generator = torch.Generator().manual_seed(seed)
    for case in CASES:
        x = make_case(case, rows, in_features, generator).to(device)
        for fmt in ("e4m3", "e5m2"):
            row = _attempt(report, f"fp8_current {fmt}", lambda: compare_per_tensor(handle, x, fmt, case))
            if row is not None:
                report.operands.append(row)
        if mxfp8_ok:  # below compute capability 10.0 TE refuses MXFP8 execution; its quantizer is not compared either
            rows_mx = _attempt(report, "mxfp8 operands", lambda: compare_mxfp8(handle, x, case))
            report.operands.extend(rows_mx or [])
        if case in ("normal", "heavy_tail", "outlier"):
            weight = make_case("normal", out_features, in_features, generator).to(device) * 0.05
            grad_output = make_case(case, rows, out_features, generator).to(device) * 1e-3
            gemms = _attempt(
                report, "fp8_current GEMMs", lambda: compare_linear(handle, x, weight, grad_output, "fp8_current", case)
            )
            report.gemms.extend(gemms or [])
            if mxfp8_ok:
                gemms = _attempt(
                    report, "mxfp8 GEMMs", lambda: compare_linear(handle, x, weight, grad_output, "mxfp8", case)
                )
                report.gemms.extend(gemms or [])
    if not mxfp8_ok:
        report.not_run["mxfp8 operands and GEMMs"] = mxfp8_reason
    return report


__all__ = [
    "CASES",
    "GemmComparison",
    "check_te_main",
    "OperandComparison",
    "TECheckReport",
    "classify_differences",
    "compare_linear",
    "compare_mxfp8",
    "compare_per_tensor",
    "make_case",
    "relative_error",
    "run_te_check",
    "te_check_refusal",
]


def check_te_main(
    seed: int = 0,
    json_path: str | None = None,
    echo: Callable[[str], None] = print,
    echo_error: Callable[[str], None] = print,
) -> int:
    """`mxlab check te`: run the check and print its tables (returns 0), or say why it cannot run here (returns 2)."""
    try:
        report = run_te_check(seed=seed)
    except BackendUnavailableError as error:
        echo_error(f"mxlab check te cannot run here: {error}")
        return 2
    echo(report.table())
    if json_path is not None:
        import json
        import os
        import tempfile
        from pathlib import Path

        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(handle, "w") as stream:
            json.dump(report.to_dict(), stream, indent=2, default=str)
        os.replace(temporary, path)
    return 0
