"""The `mxlab` command line: thin wrappers that parse options and call the library.

One module per command group (bench, study, data, check); this module assembles the app.

Each command imports its module lazily, so `mxlab --help` stays fast. Help is plain text
(rich_markup_mode=None): boolean flags show as flags, and each command's help ends with an example.
"""

from __future__ import annotations

from pathlib import Path

import typer

from mxlab.cli.command import Command

app = typer.Typer(
    help="mxlab: exact MX (microscaling) numerics and precision experiments for CTR/CVR models.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@app.command("formats", cls=Command)
def formats_command() -> None:
    """Print the table of MX element formats and the E8M0 scale.

    Example: mxlab formats
    """
    from mxlab.numerics.formats import format_table

    typer.echo(format_table())


@app.command("recipe", cls=Command)
def recipe_command(
    name: str | None = typer.Argument(
        None,
        metavar="NAME",
        help="Recipe name (experiments/recipes/NAME.toml) or .toml path; omit to list the shipped ones.",
    ),
) -> None:
    """Validate a recipe and print its policies, rules, attention and loss scaling (or list the recipes).

    Example: mxlab recipe mxfp8-rceil-sr
    """
    from mxlab.recipe import available_recipes, describe_recipe, load_recipe

    if name is None:
        typer.echo("\n".join(available_recipes()))
        return
    try:
        typer.echo(describe_recipe(load_recipe(name)))
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


@app.command("spec-doc", cls=Command)
def spec_doc_command(
    path: Path = typer.Argument(..., metavar="FILE", help="The document to rebuild (docs/spec.md)."),
    check: bool = typer.Option(False, "--check", help="Only report how FILE differs; exit 1 when it does."),
) -> None:
    """Rebuild the table of every experiment spec key (type, default) from the spec's dataclasses, keeping each
    key's written meaning; a new key gets an empty meaning to write.

    Example: mxlab spec-doc docs/spec.md
    """
    from mxlab.experiment.spec_doc import problems, render

    text = path.read_text() if path.is_file() else ""
    if check:
        found = problems(text)
        typer.echo("\n".join(found) if found else f"{path}: every spec key documented, types and defaults current")
        raise typer.Exit(1 if found else 0)
    path.write_text(render(text))
    left = [line for line in problems(path.read_text()) if line.endswith("no meaning written")]
    typer.echo(f"written: {path}" + "".join(f"\n{line}" for line in left))


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
