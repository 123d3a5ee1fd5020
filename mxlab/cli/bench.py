"""`mxlab bench ...`: speed benchmarks (CUDA), ratios against baselines measured in the same run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from mxlab.cli.command import Command

app = typer.Typer(
    help="Speed benchmarks (CUDA): ratios against baselines measured in the same run.", no_args_is_help=True
)


def _exiting_on_bad_input(body: Callable[[], Any]) -> Any:
    """body(), or a one-line `error: ...` on stderr and exit status 2 when it refuses its input
    (ValueError) or cannot run here (RuntimeError: no CUDA, no Transformer Engine)."""
    try:
        return body()
    except (RuntimeError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


@app.command("attention", cls=Command)
def bench_attention_command(
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the measurements as JSON to this path."
    ),
    sweep_tiles: bool = typer.Option(
        False, "--sweep-tiles", help="Also time a few kernel tile sizes on the self-attention shapes."
    ),
) -> None:
    """Jagged attention kernel (BF16, MXFP8) against padded SDPA and FlexAttention: forward + backward, useful TFLOP/s.

    Example: mxlab bench attention --json bench_attention.json
    """
    from mxlab.bench.attention import run_attention_bench

    run_attention_bench(json_path, sweep_tiles=sweep_tiles)


@app.command("attention-sass", cls=Command)
def bench_attention_sass_command(
    integer_path: bool = typer.Option(
        False,
        "--integer-path",
        help="Count the software steps (in the element's units) instead of the hardware FP8 path.",
    ),
    stochastic_gradients: bool = typer.Option(
        False, "--stochastic-gradients", help="Round the gradients (dO, dS) stochastically, as the -sr recipes do."
    ),
    fmt: str = typer.Option(
        "e4m3", "--fmt", metavar="FORMAT", help="Element format of every operand: e4m3, e5m2, e3m2, e2m3 or e2m1."
    ),
    scale_mode: str = typer.Option(
        "floor", "--scale-mode", metavar="MODE", help="Block scale rule: floor, ceil, rceil or even."
    ),
) -> None:
    """Static sm_90 machine code of the MX attention kernels (no GPU needed): registers, spills, instructions per loop.

    Example: mxlab bench attention-sass --fmt e2m1 --scale-mode rceil
    """
    from mxlab.bench.attention.sass import attention_sass_counts, print_attention_sass_counts

    rounding = "stochastic" if stochastic_gradients else "nearest_even"
    _exiting_on_bad_input(
        lambda: print_attention_sass_counts(
            attention_sass_counts(hw_fp8=not integer_path, fmt=fmt, grad_rounding=rounding, scale_mode=scale_mode)
        )
    )


@app.command("quant", cls=Command)
def bench_quant_command(
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the measurements as JSON to this path."
    ),
    sweep_tiles: bool = typer.Option(
        False, "--sweep-tiles", help="Also time a few launch shapes at the headline size."
    ),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip torch.compile of the reference."),
    sizes: list[str] = typer.Option(
        [],
        "--size",
        metavar="ROWSxCOLS",
        help="Input size to time (repeatable; the first is the headline; default "
        "16384x8192, 8192x4096, 4096x4096, 2048x2048, 1024x1024). Multiples of 32.",
    ),
) -> None:
    """MX casts (row, column, both, tiles, fake-quantize, stochastic) of BF16 tensors: bandwidth as a fraction of copy.

    Example: mxlab bench quant --json bench_quant.json
    Example: mxlab bench quant --size 1482752x256 --size 1482752x1024 --no-compile   (a model's activation shapes)
    """
    from mxlab.bench.quant import DEFAULT_SIZES, parse_size, run_quant_bench

    _exiting_on_bad_input(
        lambda: run_quant_bench(
            json_path,
            sizes=tuple(parse_size(text) for text in sizes) or DEFAULT_SIZES,
            compile_reference=not no_compile,
            sweep_tiles=sweep_tiles,
        )
    )


@app.command("sass", cls=Command)
def bench_sass_command(
    tile: str | None = typer.Option(
        None, "--tile", metavar="SHAPE", help="Launch shape for every cast: ROWSxCOL_BLOCKSxWARPS."
    ),
    integer_path: bool = typer.Option(
        False, "--integer-path", help="Count the integer fast path instead of the hardware FP8 path."
    ),
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the counts as JSON to this path."
    ),
) -> None:
    """Static sm_90 machine code of the MX casts `bench quant` times (no GPU needed): instructions per element,
    registers, spills.

    Example: mxlab bench sass --integer-path
    """
    from mxlab.bench.sass import parse_tile, run_sass_bench

    _exiting_on_bad_input(
        lambda: run_sass_bench(hw_fp8=not integer_path, tile=parse_tile(tile) if tile else None, json_path=json_path)
    )


@app.command("linear", cls=Command)
def bench_linear_command(
    shapes: list[str] = typer.Option(
        [],
        "--shape",
        metavar="MxKxN",
        help="MxKxN to time (repeatable; default M = 16384, 65536 x K = N = 512, 1024, 4096).",
    ),
    repeat: int = typer.Option(20, "--repeat", metavar="N", min=1, help="Timed repetitions per arm (median reported)."),
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the measurements as JSON to this path."
    ),
    compile: bool = typer.Option(
        False, "--compile", help="Also time the baseline and each emulated arm under torch.compile (same BF16 ratio)."
    ),
) -> None:
    """One linear layer, forward + backward: mxlab's emulation, TE's FP8 recipes, TE BF16 and (where installed)
    torchao's emulated MXFP8 as ratios to BF16 nn.Linear.

    Example: mxlab bench linear --shape 65536x1024x1024
    """
    from mxlab.bench.linear import DEFAULT_SHAPES, parse_shape, run_linear_bench

    _exiting_on_bad_input(
        lambda: run_linear_bench(
            [parse_shape(text) for text in shapes] or DEFAULT_SHAPES,
            repeat=repeat,
            json_path=json_path,
            echo=typer.echo,
            compile=compile,
        )
    )


@app.command("host", cls=Command)
def bench_host_command(
    recipes: list[str] = typer.Option(
        [],
        "--recipe",
        metavar="NAME",
        help="Recipe to apply (repeatable; default mxfp8-rceil, mxfp8-hadamard, fp8-tensor).",
    ),
    width: int = typer.Option(64, "--width", metavar="N", min=1, help="in_features = out_features of the layer."),
    tokens: int = typer.Option(64, "--tokens", metavar="N", min=1, help="Rows of the input."),
    steps: int = typer.Option(200, "--steps", metavar="N", min=1, help="Forward + backward steps per timed loop."),
    loops: int = typer.Option(5, "--loops", metavar="N", min=1, help="Timed loops (the best is reported)."),
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the measurements as JSON to this path."
    ),
) -> None:
    """Host (Python) time of one emulated linear layer, forward + backward, as a ratio to nn.Linear: on the CPU,
    with the MX cast launches stubbed out (no GPU needed).

    Example: mxlab bench host --recipe mxfp8-rceil
    """
    from dataclasses import asdict

    from mxlab.bench.host import DEFAULT_RECIPES, run_host_bench
    from mxlab.io import write_json

    results = _exiting_on_bad_input(
        lambda: run_host_bench(
            recipes or DEFAULT_RECIPES, width=width, tokens=tokens, steps=steps, loops=loops, echo=typer.echo
        )
    )
    if json_path is not None:
        write_json(json_path, [asdict(result) for result in results])


@app.command("step", cls=Command)
def bench_step_command(
    spec: Path = typer.Option(
        Path("experiments/gem-synthetic.toml"),
        "--spec",
        metavar="SPEC",
        help="Experiment spec whose model, data, train settings and arms are timed.",
    ),
    arms: list[str] = typer.Option(
        [],
        "--arm",
        metavar="ARM",
        help="Arm (recipe name) to time (repeatable; default every arm "
        "of the spec). The spec's baseline is always timed first.",
    ),
    preset: str | None = typer.Option(
        None, "--preset", metavar="SIZE", help="Model size preset (tiny, h200); default the spec's."
    ),
    batch_size: int | None = typer.Option(
        None, "--batch", metavar="N", min=1, help="Examples per step; default the spec's train.batch_size."
    ),
    max_history: int | None = typer.Option(
        None, "--max-history", metavar="N", min=1, help="Longest history (model.max_history); default the spec's."
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a spec value, key=value (repeatable), as for `mxlab run`."
    ),
    warmup: int = typer.Option(
        5, "--warmup", metavar="N", min=0, help="Untimed steps per arm first (cover every batch once)."
    ),
    steps: int = typer.Option(20, "--steps", metavar="N", min=1, help="Timed steps per arm."),
    batches: int = typer.Option(
        4, "--batches", metavar="N", min=1, help="Distinct batches, generated once and kept on the device."
    ),
    device: str = typer.Option("cuda", "--device", metavar="DEVICE", help="cuda, cuda:N or cpu."),
    peak_tflops: float = typer.Option(
        989.0,
        "--peak-tflops",
        metavar="TFLOPS",
        help="BF16 peak the MFU divides by (989: dense BF16 of an H100/H200 SXM).",
    ),
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the measurements as JSON to this path."
    ),
    compile: bool = typer.Option(
        False,
        "--compile",
        help="Also time each arm with its model under torch.compile (default settings), as ratios to the same "
        "eager baseline.",
    ),
) -> None:
    """The whole training step (forward, loss, backward, loss scaler, optimizer) of every arm against the baseline:
    ms/step, ratio, model TFLOP/s, MFU, peak memory.

    Example: mxlab bench step --spec experiments/gem-synthetic.toml --preset h200 --batch 4096
    Example: mxlab bench step --preset h200 --batch 4096 --arm mxfp8-rceil --compile   (compiled against eager)
    """
    from mxlab.bench.step import run_step_bench

    _exiting_on_bad_input(
        lambda: run_step_bench(
            spec,
            arms=arms,
            preset=preset,
            batch_size=batch_size,
            max_history=max_history,
            overrides=overrides,
            warmup=warmup,
            steps=steps,
            batches=batches,
            device=device,
            peak_tflops=peak_tflops,
            json_path=json_path,
            echo=typer.echo,
            compile=compile,
        )
    )


@app.command("study", cls=Command)
def bench_study_command(
    spec: Path = typer.Argument(
        ..., metavar="SPEC", help="Experiment spec (experiments/NAME.toml) whose arms are timed."
    ),
    steps: int = typer.Option(20, "--steps", metavar="N", min=1, help="Steps each timed run trains."),
    runs_per_device: int | None = typer.Option(
        None, "--runs-per-device", metavar="K", min=1, help="Runs at once on the device; default the spec's."
    ),
    device: str = typer.Option(
        "cuda", "--device", metavar="DEVICE", help="cuda (the first GPU), cuda:N, cpu or auto (a GPU if there is one)."
    ),
    mps: bool = typer.Option(False, "--mps", help="Run the K runs under CUDA MPS, as `mxlab run --mps` does."),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a spec value, key=value (repeatable), as for `mxlab run`."
    ),
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the measurements as JSON to this path."
    ),
) -> None:
    """A study's arms at its own sizes and runs per device: ms/step, the ratio to the baseline, each run's fixed
    cost (start, data, evaluation), and the study's projected time and GPU-hours.

    Example: mxlab bench study experiments/gem-mxfp8.toml --steps 30 --mps
    """
    from mxlab.bench.study import run_study_bench

    _exiting_on_bad_input(
        lambda: run_study_bench(
            spec,
            steps=steps,
            runs_per_device=runs_per_device,
            device=device,
            mps=mps,
            overrides=overrides,
            json_path=json_path,
            echo=typer.echo,
        )
    )
