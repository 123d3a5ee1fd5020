"""`mxlab data ...`: fetch datasets, describe a source (bodies in mxlab/data/commands.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from mxlab.cli.command import Command

app = typer.Typer(help="Data sources: fetch datasets, describe a source.", no_args_is_help=True)


@app.command("fetch", cls=Command)
def data_fetch_command(
    dataset: str = typer.Argument(..., metavar="DATASET", help="Dataset to fetch: movielens-100k."),
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        metavar="DIR",
        help="Target folder (default $MXLAB_CACHE/movielens-100k or ~/.cache/mxlab/movielens-100k).",
    ),
) -> None:
    """Download a dataset (MovieLens-100K from the recbole==1.2.1 wheel), extract and verify it.

    Example: mxlab data fetch movielens-100k
    """
    from mxlab.data import commands

    raise typer.Exit(commands.fetch(dataset, cache_dir))


@app.command("describe", cls=Command)
def data_describe_command(
    source: str = typer.Argument(..., metavar="SOURCE", help="synthetic | movielens-100k | criteo."),
    max_history: int = typer.Option(
        64, "--max-history", metavar="N", min=1, help="History cap (the model's max_history)."
    ),
    assignments: list[str] = typer.Option(
        [],
        "--set",
        metavar="KEY=VALUE",
        help='A data-table key, e.g. eval_examples=20000 or path="train.txt". Repeatable.',
    ),
) -> None:
    """Print a source's sizes, features, eval label rates and (synthetic) the metrics of the true probabilities.

    Example: mxlab data describe synthetic --set eval_examples=20000
    """
    from mxlab.data import commands

    raise typer.Exit(commands.describe(source, max_history, assignments))
