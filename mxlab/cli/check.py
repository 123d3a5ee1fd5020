"""`mxlab check ...`: checks of mxlab's emulation against other implementations."""

from __future__ import annotations

from pathlib import Path

import typer

from mxlab.cli.command import Command

app = typer.Typer(help="Checks of mxlab's emulation against other implementations.", no_args_is_help=True)


@app.command("te", cls=Command)
def check_te_command(
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the random test tensors."),
    json_path: Path | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write the report as JSON to this path."
    ),
) -> None:
    """Compare mxlab's emulation with Transformer Engine's kernels (CUDA + TE): bit-identical operands, GEMM errors.

    Example: mxlab check te --json check_te.json
    """
    from mxlab.recipe.backends.te_check import check_te_main

    raise typer.Exit(
        check_te_main(
            seed=seed, json_path=json_path, echo=typer.echo, echo_error=lambda text: typer.echo(text, err=True)
        )
    )
