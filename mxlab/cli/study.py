"""`mxlab run`, `report`, `compare`, `sweep-layers`: the study commands (bodies in mxlab/experiment/commands.py)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

_commands = typer.Typer()


_SET_HELP = "Override a spec value: dotted key = TOML value, e.g. train.epochs=2 or seeds=[0]. Repeatable."


@_commands.command("run")
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


@_commands.command("report")
def report_command(study_dir: "Path" = typer.Argument(..., help="Study folder written by `mxlab run`.")) -> None:
    """Re-render report.md, report.html, summary.json and figures from a study's run folders."""
    from mxlab.experiment import commands

    raise typer.Exit(commands.report(study_dir))


@_commands.command("compare")
def compare_command(
    study_a: "Path" = typer.Argument(..., help="First study folder."),
    study_b: "Path" = typer.Argument(..., help="Second study folder."),
) -> None:
    """Show how two studies differ (spec, environment, per-arm deltas)."""
    from mxlab.experiment import commands

    raise typer.Exit(commands.compare(study_a, study_b))


@_commands.command("sweep-layers")
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


def register(app: typer.Typer) -> None:
    """Add the study commands to the top-level app."""
    app.registered_commands.extend(_commands.registered_commands)
