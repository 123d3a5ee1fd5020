"""Shared set-up for the planted-fault tests: a study of the stand-in plug-ins, the CLI run inline, fingerprints."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.experiment import standins

SPEC = standins.spec_text("faults", [0])


class Kill(Exception):
    """Raised from a step hook: the run stops as if the process were killed."""


def write_spec(folder: Path, text: str = SPEC) -> Path:
    """A spec with recipes base and noisy in `folder`; returns its path."""
    standins.write_recipes(folder, "base", "noisy")
    path = folder / "faults.toml"
    path.write_text(text)
    return path


def run_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Have `mxlab run` train on the inline executor and write no report (fast, in this process)."""
    from mxlab.experiment.executors import InlineExecutor

    monkeypatch.setattr(  # every executor inline, with the study's step hooks
        "mxlab.experiment.runner.make_executor",
        lambda *args, **kwargs: InlineExecutor("cpu", on_step=kwargs["on_step"]),
    )
    monkeypatch.setattr("mxlab.cli.study_commands.write_study_report", lambda out_dir: {})


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
