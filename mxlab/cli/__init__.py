"""The `mxlab` command line: thin wrappers that parse options and call the library.

One module per command group (bench, study, data, check); this module assembles the app.

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


@app.command("formats")
def formats_command() -> None:
    """Print the table of MX element formats and the E8M0 scale."""
    from mxlab.numerics.formats import format_table

    typer.echo(format_table())


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


def _register() -> None:
    from mxlab.cli import bench, check, data, power, study

    app.add_typer(bench.app, name="bench")
    app.add_typer(data.app, name="data")
    app.add_typer(check.app, name="check")
    study.register(app)
    power.register(app)


_register()

if __name__ == "__main__":
    app()
