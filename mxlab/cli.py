"""The `mxlab` command line: thin wrappers that parse options and call the library.

Each command imports its module lazily, so `mxlab --help` stays fast.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    help="mxlab: exact MX (microscaling) numerics and precision experiments for CTR/CVR models.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Speed benchmarks (CUDA): ratios against baselines measured in the same run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("attention")
def bench_attention_command(
    json_path: "Optional[Path]" = typer.Option(None, "--json", help="Also write the measurements as JSON to this path."),
    sweep_tiles: bool = typer.Option(False, "--sweep-tiles", help="Also time a few kernel tile sizes on the self-attention shapes."),
) -> None:
    """Jagged attention kernel (BF16, MXFP8) against padded SDPA and FlexAttention: forward + backward, useful TFLOP/s."""
    from mxlab.bench.attention import run_attention_bench

    run_attention_bench(json_path, sweep_tiles=sweep_tiles)


@bench_app.command("attention-sass")
def bench_attention_sass_command(
    integer_path: bool = typer.Option(False, "--integer-path", help="Count the integer quantization steps instead of the hardware FP8 path."),
    no_ablations: bool = typer.Option(False, "--no-ablations", help="Count the kernel alone, not each benchmark ablation too."),
) -> None:
    """Static sm_90 machine code of the MX attention kernels (no GPU needed): registers, spills, instructions per loop, per ablation."""
    from mxlab.bench.attention import attention_sass_counts, print_attention_sass_counts
    from mxlab.kernels.jagged_attention import ABLATIONS

    try:
        ablations = {"kernel": 0} if no_ablations else {"kernel": 0, **ABLATIONS}
        print_attention_sass_counts(attention_sass_counts(ablations, hw_fp8=not integer_path))
    except RuntimeError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)


@bench_app.command("quant")
def bench_quant_command(
    json_path: "Optional[Path]" = typer.Option(None, "--json", help="Also write the measurements as JSON to this path."),
    sweep_tiles: bool = typer.Option(False, "--sweep-tiles", help="Also time a few launch shapes at the headline size."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip torch.compile of the reference."),
) -> None:
    """MX casts (row, column, both, tiles, fake-quantize, stochastic) of BF16 tensors: bandwidth as a fraction of copy."""
    from mxlab.bench.quant import run_quant_bench

    run_quant_bench(json_path, compile_reference=not no_compile, sweep_tiles=sweep_tiles)


@bench_app.command("sass")
def bench_sass_command(
    tile: "Optional[str]" = typer.Option(None, "--tile", help="Launch shape for every cast: ROWSxCOL_BLOCKSxWARPS[xCOLUMN_PASSES[xROWS_IN_FLIGHT]]."),
    integer_path: bool = typer.Option(False, "--integer-path", help="Count the integer fast path instead of the hardware FP8 path."),
    json_path: "Optional[Path]" = typer.Option(None, "--json", help="Also write the counts as JSON to this path."),
) -> None:
    """Static sm_90 machine code of the MX casts `bench quant` times (no GPU needed): instructions per element, registers, spills."""
    from mxlab.bench.sass import parse_tile, run_sass_bench

    try:
        run_sass_bench(hw_fp8=not integer_path, tile=parse_tile(tile) if tile else None, json_path=json_path)
    except (RuntimeError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)


@bench_app.command("linear")
def bench_linear_command(
    shapes: "List[str]" = typer.Option([], "--shape", help="MxKxN to time (repeatable; default M = 16384, 65536 x K = N = 512, 1024, 4096)."),
    repeat: int = typer.Option(20, "--repeat", min=1, help="Timed repetitions per arm (median reported)."),
    json_path: "Optional[Path]" = typer.Option(None, "--json", help="Also write the measurements as JSON to this path."),
) -> None:
    """One linear layer, forward + backward: mxlab's emulation, TE's FP8 recipes and TE BF16 as ratios to BF16 nn.Linear."""
    from mxlab.bench.linear import DEFAULT_SHAPES, parse_shape, run_linear_bench

    try:
        run_linear_bench([parse_shape(text) for text in shapes] or DEFAULT_SHAPES, repeat=repeat, json_path=json_path, echo=typer.echo)
    except (RuntimeError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)


@bench_app.command("host")
def bench_host_command(
    recipes: "List[str]" = typer.Option([], "--recipe", help="Recipe to apply (repeatable; default mxfp8-rceil, mxfp8-hadamard, fp8-tensor)."),
    width: int = typer.Option(64, "--width", min=1, help="in_features = out_features of the layer."),
    tokens: int = typer.Option(64, "--tokens", min=1, help="Rows of the input."),
    steps: int = typer.Option(200, "--steps", min=1, help="Forward + backward steps per timed loop."),
    loops: int = typer.Option(5, "--loops", min=1, help="Timed loops (the best is reported)."),
    json_path: "Optional[Path]" = typer.Option(None, "--json", help="Also write the measurements as JSON to this path."),
) -> None:
    """Host (Python) time of one emulated linear layer, forward + backward, as a ratio to nn.Linear: on the CPU, with the MX cast launches stubbed out (no GPU needed)."""
    from dataclasses import asdict

    from mxlab.bench.host import DEFAULT_RECIPES, run_host_bench
    from mxlab.experiment.io import write_json

    try:
        results = run_host_bench(recipes or DEFAULT_RECIPES, width=width, tokens=tokens, steps=steps, loops=loops,
                                 echo=typer.echo)
    except (RuntimeError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    if json_path is not None:
        write_json(json_path, [asdict(result) for result in results])


@app.command("formats")
def formats_command() -> None:
    """Print the table of MX element formats and the E8M0 scale."""
    from mxlab.formats import format_table

    typer.echo(format_table())


# ---- experiments: run, report, compare, sweep-layers (bodies in mxlab/experiment/commands.py)

_SET_HELP = "Override a spec value: dotted key = TOML value, e.g. train.epochs=2 or seeds=[0]. Repeatable."


@app.command("run")
def run_command(
    spec: "Path" = typer.Argument(..., help="Experiment spec (experiments/NAME.toml)."),
    device: str = typer.Option("auto", "--device", help="cuda | cpu | auto (several GPUs: one run per GPU)."),
    out: "Optional[Path]" = typer.Option(None, "--out", help="Study folder (default reports/NAME)."),
    resume: bool = typer.Option(False, "--resume", help="Skip finished runs; continue interrupted ones from their checkpoint."),
    overrides: "List[str]" = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """Run every arm x seed of an experiment, then write the regression report."""
    from mxlab.experiment import commands

    raise typer.Exit(commands.run(spec, device=device, out=out, resume=resume, overrides=overrides))


@app.command("report")
def report_command(study_dir: "Path" = typer.Argument(..., help="Study folder written by `mxlab run`.")) -> None:
    """Re-render report.md, report.html, summary.json and figures from a study's run folders."""
    from mxlab.experiment import commands

    raise typer.Exit(commands.report(study_dir))


@app.command("compare")
def compare_command(
    study_a: "Path" = typer.Argument(..., help="First study folder."),
    study_b: "Path" = typer.Argument(..., help="Second study folder."),
) -> None:
    """Show how two studies differ (spec, environment, per-arm deltas)."""
    from mxlab.experiment import commands

    raise typer.Exit(commands.compare(study_a, study_b))


@app.command("sweep-layers")
def sweep_layers_command(
    spec: "Path" = typer.Argument(..., help="Experiment spec (its data, model and train settings are used)."),
    recipe: str = typer.Option(..., "--recipe", help="Recipe to sweep (a name in the spec's recipes/ folder, or a .toml path)."),
    seeds: "Optional[str]" = typer.Option(None, "--seeds", help="Seeds, e.g. 0,1 (default: the spec's)."),
    steps: "Optional[int]" = typer.Option(None, "--steps", min=1, help="Training steps per run (default min(200, the spec's))."),
    device: str = typer.Option("auto", "--device", help="cuda | cpu | auto."),
    out: "Optional[Path]" = typer.Option(None, "--out", help="Study folder; the sweep goes to DIR/sweep (default reports/NAME)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep."),
    overrides: "List[str]" = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """Rank layers by the NE/AUC change of quantizing each alone, and all but each, against the baseline."""
    from mxlab.experiment import commands

    raise typer.Exit(
        commands.sweep_layers(spec, recipe=recipe, seeds=seeds, steps=steps, device=device, out=out, resume=resume, overrides=overrides)
    )


@app.command("recipe")
def recipe_command(
    name: "Optional[str]" = typer.Argument(None, help="Recipe name (experiments/recipes/NAME.toml) or .toml path; omit to list the shipped ones."),
) -> None:
    """Validate a recipe and print its policies, rules, attention and loss scaling (or list the recipes)."""
    from mxlab.recipe import available_recipes, describe_recipe, load_recipe

    if name is None:
        typer.echo("\n".join(available_recipes()))
        return
    try:
        typer.echo(describe_recipe(load_recipe(name)))
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)


# ---- data: fetch and describe the data sources (bodies in mxlab/data/commands.py)

data_app = typer.Typer(help="Data sources: fetch datasets, describe a source.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("fetch")
def data_fetch_command(
    dataset: str = typer.Argument(..., help="Dataset to fetch: movielens-100k."),
    cache_dir: "Optional[Path]" = typer.Option(None, "--cache-dir", help="Target folder (default $MXLAB_CACHE/movielens-100k or ~/.cache/mxlab/movielens-100k)."),
) -> None:
    """Download a dataset (MovieLens-100K from the recbole==1.2.1 wheel), extract and verify it."""
    from mxlab.data import commands

    raise typer.Exit(commands.fetch(dataset, cache_dir))


@data_app.command("describe")
def data_describe_command(
    source: str = typer.Argument(..., help="synthetic | movielens-100k | criteo."),
    max_history: int = typer.Option(64, "--max-history", min=1, help="History cap (the model's max_history)."),
    assignments: "List[str]" = typer.Option([], "--set", help="A [data] key, e.g. eval_examples=20000 or path=\"train.txt\". Repeatable."),
) -> None:
    """Print a source's sizes, features, eval label rates and (synthetic) the metrics of the true probabilities."""
    from mxlab.data import commands

    raise typer.Exit(commands.describe(source, max_history, assignments))


check_app = typer.Typer(help="Checks of mxlab's emulation against other implementations.", no_args_is_help=True)
app.add_typer(check_app, name="check")


@check_app.command("te")
def check_te_command(
    seed: int = typer.Option(0, "--seed", help="Seed of the random test tensors."),
    json_path: "Optional[Path]" = typer.Option(None, "--json", help="Also write the report as JSON to this path."),
) -> None:
    """Compare mxlab's emulation with Transformer Engine's kernels (CUDA + TE): bit-identical operands, GEMM errors."""
    from mxlab.check_te import check_te_main

    raise typer.Exit(check_te_main(seed=seed, json_path=json_path, echo=typer.echo, echo_error=lambda text: typer.echo(text, err=True)))

if __name__ == "__main__":
    app()
