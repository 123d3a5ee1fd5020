"""`mxlab bench quant`: effective bandwidth of the Triton MX casts against a device-to-device copy.

Effective bandwidth = (bytes of the input read + bytes of codes, scales or values written) / time.
Each figure is divided by the bandwidth of `dst.copy_(x)` measured in the same process on the same
tensor, next to `torch.compile` of the PyTorch reference. Kernels are timed by replaying a CUDA
graph (Python launch overhead excluded), the compiled reference with CUDA events.

Where the GPU's FP8 conversion applies (e4m3/e5m2, nearest even, sm_90+; see
`mxlab.kernels.cast.hardware_fp8_applies`) the casts use it (note "hardware FP8 convert"), and rows
"..., integer fast path" time the same casts with it switched off, in the same run.
Random Hadamard rows (block 32) time the fused transform + fake-quantize kernel next to the random
Hadamard transform in PyTorch followed by the fake-quantize kernel (float32 values out, as qmatmul uses them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mxlab.bench import parse_dims
from mxlab.bench.timing import do_bench_graph_ms, do_bench_ms
from mxlab.io import write_json

DEFAULT_SIZES: tuple[tuple[int, int], ...] = ((16384, 8192), (8192, 4096), (4096, 4096), (2048, 2048), (1024, 1024))
FORMAT = "e4m3"
# Bandwidth targets on an H200 at the headline size (fraction of copy)
TARGETS: dict[str, float] = {
    "row cast": 0.85,
    "row fake-quantize": 0.85,
    "column cast": 0.75,
    "both cast (one read)": 0.75,
    "row stochastic fake-quantize": 0.75,
}


@dataclass
class Measurement:
    """One timed operation on one input size."""

    rows: int
    cols: int
    op: str
    ms: float
    bytes_moved: int
    gb_per_s: float
    ratio_to_copy: float
    note: str = ""


def _operations(x: torch.Tensor, kernels, fmt) -> dict[str, tuple[Callable[[], object], int]]:
    """name -> (callable, bytes moved) for the Triton casts of x (2-D BF16)."""
    from mxlab.kernels.cast import CastLaunch

    n = x.numel()
    size_in = n * x.element_size()
    codes, scales, tile_scales = n, n // 32, n // 1024
    values = n * x.element_size()
    integer = CastLaunch(hw_fp8=False)

    def hadamard_then_cast(axis: int):
        from mxlab.numerics.hadamard import random_hadamard

        return lambda: kernels.fake_quantize(random_hadamard(x.float(), 32, axis, 7), fmt, axis=axis)

    float32_values = n * 4  # Hadamard-transformed values are float32
    return {
        "row cast": (lambda: kernels.quantize(x, fmt), size_in + codes + scales),
        "column cast": (lambda: kernels.quantize(x, fmt, axis=0), size_in + codes + scales),
        "both cast (one read)": (lambda: kernels.quantize_rowcol(x, fmt), size_in + 2 * (codes + scales)),
        "(32,32) tile cast": (lambda: kernels.quantize(x, fmt, block=(32, 32)), size_in + codes + tile_scales),
        "row fake-quantize": (lambda: kernels.fake_quantize(x, fmt), size_in + values),
        "column fake-quantize": (lambda: kernels.fake_quantize(x, fmt, axis=0), size_in + values),
        "both fake-quantize (one read)": (lambda: kernels.fake_quantize_rowcol(x, fmt), size_in + 2 * values),
        "row stochastic cast": (
            lambda: kernels.quantize(x, fmt, rounding="stochastic", seed=1),
            size_in + codes + scales,
        ),
        "row stochastic fake-quantize": (
            lambda: kernels.fake_quantize(x, fmt, rounding="stochastic", seed=1),
            size_in + values,
        ),
        "row Hadamard fake-quantize (fused)": (
            lambda: kernels.hadamard_fake_quantize(x, fmt, axis=-1, hadamard_seed=7),
            size_in + float32_values,
        ),
        "row Hadamard fake-quantize, torch transform then cast": (hadamard_then_cast(-1), size_in + float32_values),
        "column Hadamard fake-quantize (fused)": (
            lambda: kernels.hadamard_fake_quantize(x, fmt, axis=0, hadamard_seed=7),
            size_in + float32_values,
        ),
        "column Hadamard fake-quantize, torch transform then cast": (hadamard_then_cast(0), size_in + float32_values),
        "row cast, integer fast path": (lambda: kernels.quantize(x, fmt, _launch=integer), size_in + codes + scales),
        "row fake-quantize, integer fast path": (
            lambda: kernels.fake_quantize(x, fmt, _launch=integer),
            size_in + values,
        ),
        "column cast, integer fast path": (
            lambda: kernels.quantize(x, fmt, axis=0, _launch=integer),
            size_in + codes + scales,
        ),
        "both cast (one read), integer fast path": (
            lambda: kernels.quantize_rowcol(x, fmt, _launch=integer),
            size_in + 2 * (codes + scales),
        ),
        "row cast, exact integer path only": (
            lambda: kernels.quantize(x, fmt, _launch=CastLaunch(fast=False)),
            size_in + codes + scales,
        ),
    }


def _straightforward_cast(fmt_name: str) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """A plain PyTorch MX row cast (OCP floor scale, saturating RNE through torch's FP8 dtypes), to be
    compiled: the baseline the kernels are measured against. Returns (codes as FP8, scale bytes)."""
    from mxlab.numerics.formats import get_format

    fmt = get_format(fmt_name)
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt_name]

    def cast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = x.float().reshape(x.shape[0], -1, 32)
        amax = blocks.abs().amax(dim=-1, keepdim=True)
        exponent = torch.floor(torch.log2(amax)).clamp(-127 + fmt.emax, 127 + fmt.emax) - fmt.emax
        exponent = torch.where(amax == 0, torch.full_like(exponent, -127.0), exponent)
        scaled = (blocks * torch.exp2(-exponent)).clamp(-fmt.max_normal, fmt.max_normal)
        return scaled.to(fp8).reshape(x.shape), (exponent + 127).to(torch.uint8).squeeze(-1)

    return cast


def _compiled_reference(x: torch.Tensor, fmt_name: str) -> dict[str, tuple[Callable[[], object], int]]:
    """torch.compile of a straightforward PyTorch MX row cast, and of mxlab's reference cast and
    fake-quantize (row-wise, whose exactness checks break the graph)."""
    from mxlab.numerics import reference
    from mxlab.numerics.formats import get_format

    fmt = get_format(fmt_name)
    rows, cols = x.shape

    def cast(t):
        return reference.quantize_blocks(t.float().reshape(rows, cols // 32, 32), (2,), fmt, "floor", "nearest_even")

    def fake(t):
        values = reference.fake_quantize_blocks(
            t.float().reshape(rows, cols // 32, 32), (2,), fmt, "floor", "nearest_even"
        )
        return values.reshape(rows, cols).to(t.dtype)

    n = x.numel()
    cast_bytes = n * x.element_size() + n + n // 32
    operations = {}
    if fmt_name in ("e4m3", "e5m2"):
        compiled_plain = torch.compile(_straightforward_cast(fmt_name))
        operations["torch.compile straightforward row cast"] = (lambda: compiled_plain(x), cast_bytes)
    compiled_cast, compiled_fake = torch.compile(cast), torch.compile(fake)
    operations["torch.compile mxlab reference row cast"] = (lambda: compiled_cast(x), cast_bytes)
    operations["torch.compile mxlab reference row fake-quantize"] = (lambda: compiled_fake(x), 2 * n * x.element_size())
    return operations


def _tile_sweep(x: torch.Tensor, kernels, fmt) -> list[dict]:
    """Time row cast, row (stochastic) fake-quantize, column cast and both cast over a few launch shapes (rows x
    column blocks, warps)."""
    from mxlab.kernels.cast import CastLaunch, TileConfig

    n = x.numel()
    results = []
    row_configs = [
        TileConfig(r, c, w)
        for r, c, w in [
            (16, 8, 4),
            (32, 8, 4),
            (16, 16, 4),
            (32, 8, 8),
            (64, 8, 8),
            (16, 8, 2),
            (8, 8, 2),
            (4, 8, 2),
            (8, 4, 2),
            (8, 16, 2),
            (4, 8, 1),
            (2, 8, 1),
            (4, 4, 1),
        ]
    ]
    col_configs = [TileConfig(32, c, w) for c, w in [(4, 2), (8, 2), (2, 2), (4, 1), (4, 4), (8, 4), (16, 4)]]
    for config in row_configs:
        launch = CastLaunch(tile=config)
        for op, fn, moved in [
            ("row cast", lambda c=launch: kernels.quantize(x, fmt, _launch=c), n * 3 + n // 32),
            ("row fake-quantize", lambda c=launch: kernels.fake_quantize(x, fmt, _launch=c), n * 4),
            (
                "row stochastic fake-quantize",
                lambda c=launch: kernels.fake_quantize(x, fmt, rounding="stochastic", seed=1, _launch=c),
                n * 4,
            ),
        ]:
            ms = do_bench_graph_ms(fn)
            results.append(dict(op=op, tile=asdict(config), ms=ms, gb_per_s=moved / ms / 1e6))
    for config in col_configs:
        launch = CastLaunch(tile=config)
        for op, fn, moved in [
            ("column cast", lambda c=launch: kernels.quantize(x, fmt, axis=0, _launch=c), n * 3 + n // 32),
            ("both cast (one read)", lambda c=launch: kernels.quantize_rowcol(x, fmt, _launch=c), n * 4 + n // 16),
        ]:
            ms = do_bench_graph_ms(fn)
            results.append(dict(op=op, tile=asdict(config), ms=ms, gb_per_s=moved / ms / 1e6))
    return results


def parse_size(text: str) -> tuple[int, int]:
    """(rows, cols) from "ROWSxCOLS", cols a multiple of 32 (whole blocks along a row); refuses anything else
    (ValueError naming the text)."""
    rows, cols = parse_dims(text, "ROWSxCOLS", "1482752x256")
    if rows % 32 or cols % 32:
        raise ValueError(f"size {text!r}: rows and columns must be multiples of 32 (whole blocks both ways)")
    return rows, cols


def run_quant_bench(
    json_path: Path | str | None = None,
    sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES,
    fmt: str = FORMAT,
    compile_reference: bool = True,
    sweep_tiles: bool = False,
) -> dict:
    """Time the Triton MX casts on BF16 inputs of `sizes` and print a table; returns the results dict
    (also written atomically to `json_path` when given). The first size is the headline: the integer-path rows,
    the tile sweep, the compiled reference and the bandwidth targets are measured there.

    Refuses (RuntimeError) to run without a CUDA device or without Triton, and (ValueError) no sizes.
    """
    if not sizes:
        raise ValueError("bench quant needs at least one size")
    if not torch.cuda.is_available():
        raise RuntimeError("mxlab bench quant needs a CUDA device")
    from rich.console import Console
    from rich.table import Table

    from mxlab.numerics.formats import get_format
    from mxlab.numerics.quant import _import_kernels

    kernels = _import_kernels()  # mxlab.kernels.cast
    if kernels is None:
        raise RuntimeError("mxlab bench quant needs Triton")
    element_format = get_format(fmt)
    console = Console(width=160)  # one line per measurement, also when the output is a file
    measurements: list[Measurement] = []
    sweep: list[dict] = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    copy_rates: dict[tuple[int, int], float] = {}

    def record(rows: int, cols: int, name: str, ms: float, moved: int, note: str = "") -> None:
        rate = moved / ms / 1e6
        ratio = rate / copy_rates[(rows, cols)] if (rows, cols) in copy_rates else 1.0
        measurements.append(Measurement(rows, cols, name, ms, moved, rate, ratio, note))
        console.print(f"{rows}x{cols}  {name:42s} {ms:9.4f} ms {rate:8.0f} GB/s  {ratio:6.3f} x copy  {note}")

    def make_input(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device="cuda", dtype=torch.float32, generator=generator).to(torch.bfloat16)

    hardware_fp8 = kernels.hardware_fp8_applies(torch.device("cuda"), element_format, "nearest_even")
    console.print(f"hardware FP8 conversion for {fmt} nearest_even casts: {'yes' if hardware_fp8 else 'no'}")

    def note_for(name: str) -> str:
        nearest_even_cast = "stochastic" not in name
        uses_hardware = hardware_fp8 and nearest_even_cast and "integer" not in name
        return "hardware FP8 convert" if uses_hardware else ""

    for index, (rows, cols) in enumerate(sizes):
        x = make_input(rows, cols)
        destination = torch.empty_like(x)
        copy_bytes = 2 * x.numel() * x.element_size()
        copy_ms = do_bench_graph_ms(functools.partial(destination.copy_, x))
        record(rows, cols, "copy (device to device)", copy_ms, copy_bytes)
        copy_rates[(rows, cols)] = copy_bytes / measurements[-1].ms / 1e6
        for name, (fn, moved) in _operations(x, kernels, element_format).items():
            if "integer" in name and index > 0:
                continue
            record(rows, cols, name, do_bench_graph_ms(fn), moved, note_for(name))
        if index == 0 and sweep_tiles:
            sweep = _tile_sweep(x, kernels, element_format)
            for entry in sweep:
                entry["ratio_to_copy"] = entry["gb_per_s"] / copy_rates[(rows, cols)]
                console.print(
                    f"  sweep {entry['op']:28s} {entry['tile']}  "
                    f"{entry['ms']:.4f} ms  {entry['ratio_to_copy']:.3f} x copy"
                )
        del x, destination
        torch.cuda.empty_cache()
    import triton

    def results() -> dict:
        return {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "format": fmt,
            "input_dtype": "bfloat16",
            "hardware_fp8": hardware_fp8,
            "measurements": [asdict(m) for m in measurements],
            "targets": target_summary(measurements, *sizes[0]),
            "tile_sweep": sweep,
        }

    if json_path is not None:  # written now and again after the compiled reference, which can take minutes
        write_json(Path(json_path), results())
    if compile_reference:
        rows, cols = sizes[0]
        x = make_input(rows, cols)
        try:
            for name, (fn, moved) in _compiled_reference(x, fmt).items():
                record(rows, cols, name, do_bench_ms(fn), moved, "CUDA events")
        except Exception as error:  # noqa: BLE001 - report, do not hide, a failed compile
            measurements.append(
                Measurement(
                    rows,
                    cols,
                    "torch.compile reference",
                    float("nan"),
                    0,
                    float("nan"),
                    float("nan"),
                    f"failed: {type(error).__name__}: {error}"[:200],
                )
            )
            console.print(f"torch.compile reference failed: {type(error).__name__}: {error}"[:300])
        del x
        torch.cuda.empty_cache()

    table = Table(title=f"MX {fmt} casts of BF16 tensors on {torch.cuda.get_device_name()}")
    for column in ("size", "operation", "ms", "GB/s", "x copy", "note"):
        table.add_column(column, justify="left" if column in ("size", "operation", "note") else "right")
    for m in measurements:
        table.add_row(f"{m.rows}x{m.cols}", m.op, f"{m.ms:.4f}", f"{m.gb_per_s:.0f}", f"{m.ratio_to_copy:.3f}", m.note)
    console.print(table)
    summary = Table(title=f"targets at {sizes[0][0]}x{sizes[0][1]} (fraction of copy)")
    for column in ("operation", "target", "measured", "met"):
        summary.add_column(column)
    for entry in target_summary(measurements, *sizes[0]):
        summary.add_row(entry["op"], f"{entry['target']:.2f}", f"{entry['ratio']:.3f}", "yes" if entry["met"] else "no")
    console.print(summary)
    if sweep:
        sweep_table = Table(title="launch shapes (headline size)")
        for column in ("operation", "rows", "col blocks", "warps", "ms", "x copy"):
            sweep_table.add_column(column)
        for entry in sweep:
            tile = entry["tile"]
            sweep_table.add_row(
                entry["op"],
                str(tile["rows"]),
                str(tile["col_blocks"]),
                str(tile["num_warps"]),
                f"{entry['ms']:.4f}",
                f"{entry['ratio_to_copy']:.3f}",
            )
        console.print(sweep_table)
    if json_path is not None:
        write_json(Path(json_path), results())
        console.print(f"wrote {json_path}")
    return results()


def target_summary(measurements: list[Measurement], rows: int, cols: int) -> list[dict]:
    """One entry per TARGETS operation measured at rows x cols: op, target, ratio to copy and whether the target
    is met."""
    ratios = {m.op: m.ratio_to_copy for m in measurements if (m.rows, m.cols) == (rows, cols)}
    return [
        dict(op=op, target=target, ratio=ratios[op], met=ratios[op] >= target)
        for op, target in TARGETS.items()
        if op in ratios
    ]
