"""The `mxlab` command line: thin wrappers that parse options and call the library.

Each command imports its module lazily, so `mxlab --help` stays fast.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    help="mxlab: exact MX (microscaling) numerics and precision experiments for CTR/CVR models.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Speed benchmarks (CUDA): ratios against baselines measured in the same run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@app.command("formats")
def formats_command() -> None:
    """Print the table of MX element formats and the E8M0 scale."""
    from mxlab.formats import format_table

    typer.echo(format_table())


if __name__ == "__main__":
    app()
