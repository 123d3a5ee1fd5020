"""Shared set-up for the planted-fault tests: a stand-in study folder, the CLI run inline, file fingerprints."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.experiment import standins

SPEC = """
name = "faults"
seeds = [0]
baseline = "base"
arms = ["base", "noisy"]

[data]
source = "synthetic"

[model]
dim = 8
max_history = 4

[train]
batch_size = 16
lr = 0.05
epochs = 2
checkpoint_every = 4
log_every = 3
cpu_threads = 1
"""


class Kill(Exception):
    """Raised from a step hook: the run stops as if the process were killed."""


def write_spec(folder: Path, text: str = SPEC) -> Path:
    """A spec with recipes base and noisy in `folder`; returns its path."""
    (folder / "recipes").mkdir(parents=True, exist_ok=True)
    (folder / "recipes" / "base.toml").write_text('name = "base"\n')
    (folder / "recipes" / "noisy.toml").write_text('name = "noisy"\nnoise = 0.01\n')
    path = folder / "faults.toml"
    path.write_text(text)
    return path


def install(monkeypatch: pytest.MonkeyPatch) -> standins.StandinSource:
    """Stand-in modules, and `mxlab run` on the inline executor without a report (fast, in this process)."""
    from mxlab.experiment.executors import InlineExecutor

    source = standins.StandinSource()
    standins.install(monkeypatch, source)
    monkeypatch.setattr(  # every executor inline, with the study's step hooks
        "mxlab.experiment.runner.make_executor",
        lambda *args, **kwargs: InlineExecutor("cpu", on_step=kwargs["on_step"]),
    )
    monkeypatch.setattr("mxlab.cli.study_commands.write_study_report", lambda out_dir: {})
    return source


def cli(*args: str) -> tuple[int, list[str]]:
    """(exit code, output lines) of `mxlab ARGS`."""
    from mxlab.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an unexpected error is the test's failure, with its traceback
    return result.exit_code, result.output.strip().splitlines()


def fingerprints(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder` (progress.json aside: it shows, not records)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file() and path.name != "progress.json"
    }
