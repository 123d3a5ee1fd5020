"""The study and data commands: help text that shows how to call them, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mxlab.cli import app

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.toml"
COMMANDS = [
    ["run"],
    ["report"],
    ["compare"],
    ["sweep-layers"],
    ["formats"],
    ["recipe"],
    ["data", "fetch"],
    ["data", "describe"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_shows_flags_plainly_and_ends_with_an_example(command):
    result = CliRunner().invoke(app, [*command, "--help"], prog_name="mxlab", terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "<bool>" not in text and "<list[str]>" not in text and "{" not in text.splitlines()[0]
    assert text.splitlines()[0].startswith(f"Usage: mxlab {' '.join(command)} [OPTIONS]")
    description = text.split("\n\n")[2] if len(text.split("\n\n")) > 2 else ""
    assert description.strip().startswith(f"Example: mxlab {' '.join(command)}"), text


def test_run_help_names_each_flag_with_its_value():
    text = CliRunner().invoke(app, ["run", "--help"], prog_name="mxlab", terminal_width=200).output
    assert "Usage: mxlab run [OPTIONS] SPEC" in text
    for shown in (
        "--resume ",
        "--set KEY=VALUE",
        "--out DIR",
        "--executor NAME",
        "--ray-address ADDRESS",
        "--gpus N",
        "--nproc-per-node N",
    ):
        assert shown in text, shown
    assert "--resume <" not in text and "--resume BOOL" not in text


def test_run_with_out_an_existing_file_is_a_one_line_error(tmp_path):
    existing = tmp_path / "taken.txt"
    existing.write_text("x")
    result = CliRunner().invoke(app, ["run", str(QUICKSTART), "--device", "cpu", "--out", str(existing)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: --out {existing} is a file, not a folder; choose a folder (it is created if missing)"
    ]


def test_an_unknown_executor_is_refused_naming_the_accepted_ones(tmp_path):
    result = CliRunner().invoke(
        app, ["run", str(QUICKSTART), "--device", "cpu", "--executor", "slurm", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "unknown executor 'slurm'; accepted: local, ray" in result.output
    assert not (tmp_path / "o").exists()
