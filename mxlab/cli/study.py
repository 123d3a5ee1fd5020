"""`mxlab run`, `report`, `compare`, `sweep-layers`: the study commands (bodies in mxlab/cli/study_commands.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from mxlab.cli.command import Command

_commands = typer.Typer()


_SET_HELP = "Override a spec value: dotted key = TOML value, e.g. train.epochs=2 or seeds=[0]. Repeatable."


@_commands.command("run", cls=Command)
def run_command(
    spec: Path = typer.Argument(..., metavar="SPEC", help="Experiment spec (experiments/NAME.toml)."),
    device: str = typer.Option("auto", "--device", metavar="DEVICE", help="cuda | cpu | auto."),
    out: Path | None = typer.Option(None, "--out", metavar="DIR", help="Study folder (default reports/NAME)."),
    resume: bool = typer.Option(
        False, "--resume", help="Skip finished runs; continue interrupted ones from their checkpoint."
    ),
    rerun_diverged: bool = typer.Option(
        False,
        "--rerun-diverged",
        help="With --resume: move the diverged runs aside (DIR/diverged/N) and train them again from scratch "
        "with the changed train.* settings given by --set; study.json records the rerun, the report warns.",
    ),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=_SET_HELP),
    only_arms: str | None = typer.Option(
        None,
        "--only-arms",
        metavar="ARM,...",
        help="Train only these arms' runs in this call (with the runs they start from), e.g. bf16,placebo; "
        "study.json keeps every arm, the report covers the runs finished so far, and a later --resume trains "
        "the rest. For a study split over machines or visits.",
    ),
    executor: str | None = typer.Option(
        None,
        "--executor",
        metavar="NAME",
        help="local (a worker process per run, one per GPU) | ray (a "
        "Ray task per run); default: the spec's [execution].",
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", metavar="ADDRESS", help="Ray cluster to join (e.g. auto); default: start a local Ray."
    ),
    gpus: int | None = typer.Option(
        None, "--gpus", metavar="N", min=0, help="GPUs to use, one run per GPU (0 = every visible one)."
    ),
    nproc_per_node: int = typer.Option(
        1,
        "--nproc-per-node",
        metavar="N",
        min=1,
        help="Train each run data-parallel over N processes (DDP: NCCL on GPUs, gloo on CPUs).",
    ),
    runs_per_device: int | None = typer.Option(
        None,
        "--runs-per-device",
        metavar="K",
        min=1,
        help="Runs at once per device, each in its own process (small models "
        "leave a GPU idle); default: the spec's [execution], else 1.",
    ),
    mps: bool | None = typer.Option(
        None,
        "--mps/--no-mps",
        help="Start the CUDA MPS daemon for the study, so runs sharing a GPU run side by side "
        "(needs nvidia-cuda-mps-control); default: the spec's [execution] mps.",
    ),
    keep_runs: bool = typer.Option(
        True,
        "--keep-runs/--no-keep-runs",
        help="Keep each run's full folder (runs/ARM/seedK: checkpoint, eval.npz) beside its compact record "
        "(records/ARM/seedK.npz, always written); --no-keep-runs removes the folders once recorded.",
    ),
) -> None:
    """Run every arm x seed of an experiment, then write the regression report.

    Example: mxlab run experiments/quickstart.toml --device cpu --resume
    """
    from mxlab.cli import study_commands
    from mxlab.experiment.execution import ExecutionOptions

    options = ExecutionOptions(
        executor=executor,
        ray_address=ray_address,
        gpus=gpus,
        runs_per_device=runs_per_device,
        mps=mps,
        nproc_per_node=nproc_per_node,
        keep_runs=keep_runs,
    )
    raise typer.Exit(
        study_commands.run(
            spec,
            device=device,
            out=out,
            resume=resume,
            overrides=overrides,
            options=options,
            rerun_diverged=rerun_diverged,
            only_arms=[arm.strip() for arm in only_arms.split(",")] if only_arms is not None else None,
        )
    )


@_commands.command("merge", cls=Command)
def merge_command(
    out: Path = typer.Argument(..., metavar="OUT", help="New study folder to write (must not exist, or be empty)."),
    folders: list[Path] = typer.Argument(..., metavar="DIR...", help="Study folders whose run records to merge."),
) -> None:
    """Merge the run records of study folders (several machines or days) into one study folder, then write its
    report: the same report as one folder of all the full runs.

    The folders must share the spec (all but the seeds, the execution and the paths), the eval set and the
    numerics version; otherwise the merge is refused with the differing value. OUT gets study.json (the
    first folder's, with the union of the seeds) and records/; the inputs are left as they are.

    Example: mxlab merge reports/gem-all reports/gem-machine-a reports/gem-machine-b
    """
    from mxlab.cli import study_commands

    raise typer.Exit(study_commands.merge(out, folders))


@_commands.command("report", cls=Command)
def report_command(
    study_dir: Path = typer.Argument(..., metavar="DIR", help="Study folder written by `mxlab run`."),
    settings: Path | None = typer.Option(
        None,
        "--settings",
        metavar="SPEC.toml",
        help="Judge with this spec's [report] table instead of the study's (verdicts then marked post hoc).",
    ),
) -> None:
    """Re-render report.md, report.html, summary.json and figures from a study's run folders.

    Example: mxlab report reports/quickstart
    """
    from mxlab.cli import study_commands

    raise typer.Exit(study_commands.report(study_dir, settings))


@_commands.command("compare", cls=Command)
def compare_command(
    study_a: Path = typer.Argument(..., metavar="DIR_A", help="First study folder."),
    study_b: Path = typer.Argument(..., metavar="DIR_B", help="Second study folder."),
) -> None:
    """Show how two studies differ (spec, environment, per-arm deltas).

    Example: mxlab compare reports/quickstart reports/quickstart-cuda
    """
    from mxlab.cli import study_commands

    raise typer.Exit(study_commands.compare(study_a, study_b))


@_commands.command("sweep-layers", cls=Command)
def sweep_layers_command(
    spec: Path = typer.Argument(
        ..., metavar="SPEC", help="Experiment spec (its data, model and train settings are used)."
    ),
    recipe: str = typer.Option(
        ...,
        "--recipe",
        metavar="RECIPE",
        help="Recipe to sweep (a name in the spec's recipes/ folder, or a .toml path).",
    ),
    seeds: str | None = typer.Option(None, "--seeds", metavar="SEEDS", help="Seeds, e.g. 0,1 (default: the spec's)."),
    steps: int | None = typer.Option(
        None, "--steps", metavar="N", min=1, help="Training steps per run (default min(200, the spec's))."
    ),
    device: str = typer.Option("auto", "--device", metavar="DEVICE", help="cuda | cpu | auto."),
    out: Path | None = typer.Option(
        None, "--out", metavar="DIR", help="Study folder; the sweep goes to DIR/sweep (default reports/NAME)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep."),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=_SET_HELP),
    runs_per_device: int | None = typer.Option(
        None,
        "--runs-per-device",
        metavar="K",
        min=1,
        help="Runs at once per device, each in its own process; default: one at a time in this process.",
    ),
    mps: bool = typer.Option(
        False,
        "--mps/--no-mps",
        help="Start the CUDA MPS daemon for the sweep, so runs sharing a GPU "
        "run side by side (needs nvidia-cuda-mps-control).",
    ),
) -> None:
    """Rank layers by the NE/AUC change of quantizing each alone, and all but each, against the baseline.

    Example: mxlab sweep-layers experiments/quickstart.toml --recipe mxfp8-rceil --seeds 0 --steps 50
    """
    from mxlab.cli import study_commands

    raise typer.Exit(
        study_commands.sweep_layers(
            spec,
            recipe=recipe,
            seeds=seeds,
            steps=steps,
            device=device,
            out=out,
            resume=resume,
            overrides=overrides,
            runs_per_device=runs_per_device,
            mps=mps,
        )
    )


def register(app: typer.Typer) -> None:
    """Add the study commands to the top-level app."""
    app.registered_commands.extend(_commands.registered_commands)
