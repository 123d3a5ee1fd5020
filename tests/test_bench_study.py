"""`mxlab bench study` on the CPU: every arm and the fork warm-up timed in runs of their own, the projection the
sum of each run's fixed cost and steps at its arm's time per step over the runs at once."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from mxlab.bench.study import run_study_bench
from mxlab.cli import app
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

FORK = [item for item in MICRO if not item.startswith(("train.fork", "seeds="))]
FORK += ['train.fork_from="bf16"', "train.fork_steps=6", "seeds=[0, 1, 2]"]


def test_the_projection_adds_every_runs_fixed_cost_and_steps_at_its_arms_time(tmp_path):
    lines: list[str] = []
    result = run_study_bench(
        QUICKSTART,
        steps=2,
        runs_per_device=2,
        device="cpu",
        overrides=FORK,
        json_path=tmp_path / "s.json",
        echo=lines.append,
    )
    rows = {row["arm"]: row for row in result["arms"]}
    assert list(rows) == ["warm-up (bf16)", "bf16", "mxfp8-rceil-sr"]
    assert rows["bf16"]["ratio"] == pytest.approx(1.0) and rows["mxfp8-rceil-sr"]["ratio"] > 0
    assert rows["warm-up (bf16)"]["steps_per_run"] == 6 and rows["bf16"]["steps_per_run"] == 4
    for row in rows.values():
        assert row["runs"] == 3 and row["fixed_s"] >= 0
        expected = 3 * (row["fixed_s"] + row["steps_per_run"] * row["ms_per_step"] / 1e3) / 2  # K = 2 at once
        assert row["projected_s"] == pytest.approx(expected)
    assert result["projected_s"] == pytest.approx(sum(row["projected_s"] for row in rows.values()))
    assert json.loads((tmp_path / "s.json").read_text())["projected_s"] == pytest.approx(result["projected_s"])
    assert "projected study:" in lines[-1] and result["projected_gpu_hours"] is None  # a CPU has no GPU-hours


def test_bad_input_is_refused_in_one_line():
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "study", str(QUICKSTART), "--steps", "0", "--device", "cpu"])
    assert result.exit_code == 2 and "--steps" in result.output
    with pytest.raises(ValueError, match="--steps must be >= 1, got 0"):
        run_study_bench(QUICKSTART, steps=0, device="cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        run_study_bench(QUICKSTART, steps=1, device="tpu")


def test_cuda_on_a_machine_without_it_is_refused_before_any_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, on any machine
    result = CliRunner().invoke(app, ["bench", "study", str(QUICKSTART), "--steps", "1"])
    assert result.exit_code == 2 and "CUDA is not available" in result.output


@pytest.mark.gpu
def test_the_default_device_times_every_arm_on_the_first_gpu():
    """--device cuda (the default) names the first GPU to the workers, which need an index."""
    result = run_study_bench(QUICKSTART, steps=2, runs_per_device=2, overrides=FORK, echo=lambda line: None)
    assert result["device"] == "cuda:0"
    assert all(row["ms_per_step"] and row["ms_per_step"] > 0 for row in result["arms"]), result["arms"]
