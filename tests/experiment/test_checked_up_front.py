"""Bad data and settings are found once, before any run; the closing line counts runs by outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxlab.experiment.runner import StudyResult
from tests.data.test_criteo import write_file
from tests.experiment import standins
from tests.experiment.faults import cli, run_inline, write_spec

CRITEO_SPEC = """
name = "criteo-bad"
seeds = [0, 1]
baseline = "bf16"
arms = ["bf16", "mxfp8-rceil"]

[data]
source = "criteo"
path = "{path}"
eval_examples = 8

[model]
size = "tiny"
max_history = 4

[train]
batch_size = 8
max_steps = 2
"""


def test_a_malformed_data_row_is_one_line_with_file_and_line_before_any_run(tmp_path):
    data = write_file(tmp_path / "day_0.txt", 40, broken_line=23)
    spec = tmp_path / "criteo.toml"
    spec.write_text(CRITEO_SPEC.format(path=data))
    out = tmp_path / "out"
    code, lines = cli("run", str(spec), "--device", "cpu", "--out", str(out))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {data}, line 23: ") and "columns" in lines[0]
    assert not out.exists()  # no run started, nothing written


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_non_finite_learning_rate_is_refused_like_nan(tmp_path, monkeypatch, value):
    run_inline(monkeypatch)
    spec = write_spec(tmp_path / "spec")
    code, lines = cli("run", str(spec), "--device", "cpu", "--out", str(tmp_path / "o"), "--set", f"train.lr={value}")
    assert code == 2 and lines == [f"error: train.lr must be a finite number, got {float(value)}"]
    assert not (tmp_path / "o").exists()


def test_the_closing_line_counts_finished_diverged_and_failed_runs_apart(tmp_path, monkeypatch):
    from mxlab.cli.study_commands import closing_line

    result = StudyResult(
        out_dir=Path("o"),
        trained=["a/seed0", "b/seed0", "c/seed0", "d/seed0"],
        already_done=["a/seed1"],
        diverged=["b/seed0"],
        failed={"c/seed0": "boom", "d/seed0": "boom"},
    )
    assert closing_line("s", result) == (
        "study s: 2 finished, 1 diverged, 2 failed (2 runs trained, 1 already done); diverged: b/seed0"
    )

    run_inline(monkeypatch)
    spec = write_spec(tmp_path / "spec")
    standins.write_recipes(spec.parent, "poisoned")
    arms, poison = 'arms=["base", "poisoned"]', "model.nan_loss_from_step=5"  # poisoned quantizes: only it diverges
    code, lines = cli("run", str(spec), "--device", "cpu", "--out", str(tmp_path / "o"), "--set", arms, "--set", poison)
    assert code == 0, lines
    assert "study faults: 1 finished, 1 diverged, 0 failed (2 runs trained, 0 already done)" in "\n".join(lines)
