"""The execution options: one object from the command line to the runner, filled from the spec's [execution]."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mxlab.cli import app
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.spec import ExecutionConfig

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.toml"


def test_options_left_open_take_the_spec_values_and_set_ones_win():
    spec = ExecutionConfig(executor="ray", gpus=2, ray_address="auto", runs_per_device=3, mps=True)
    resolved = ExecutionOptions(gpus=1, mps=False, nproc_per_node=2).resolved(spec)
    assert resolved == ExecutionOptions(
        executor="ray", ray_address="auto", gpus=1, runs_per_device=3, mps=False, nproc_per_node=2, keep_runs=True
    )
    record = ExecutionOptions(executor="local", keep_runs=False).record(spec, ["cpu"])
    assert record["executor"] == "local" and record["gpus"] == 2 and record["devices"] == ["cpu"]
    assert record["cpus_per_run"] == 1 and "keep_runs" not in record


def test_flags_name_only_the_options_asked_for():
    assert ExecutionOptions().flags() == []
    assert ExecutionOptions(executor="inline").flags() == []
    options = ExecutionOptions(executor="ray", ray_address="auto", gpus=2, mps=False, keep_runs=False)
    assert options.flags() == [
        "--executor",
        "ray",
        "--ray-address",
        "auto",
        "--gpus",
        "2",
        "--no-mps",
        "--no-keep-runs",
    ]
    assert ExecutionOptions(runs_per_device=2, mps=True, nproc_per_node=4).flags() == [
        "--runs-per-device",
        "2",
        "--mps",
        "--nproc-per-node",
        "4",
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ExecutionOptions(executor="slurm"), "unknown executor 'slurm'; accepted: local, ray"),
        (ExecutionOptions(gpus=-1), "--gpus must be >= 0, got -1"),
        (ExecutionOptions(runs_per_device=0), "--runs-per-device must be >= 1, got 0"),
        (ExecutionOptions(nproc_per_node=0), "--nproc-per-node must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_naming_the_value(options, message):
    with pytest.raises(ValueError, match=message):
        options.resolved(ExecutionConfig())


def test_the_command_line_builds_one_options_object_and_hands_it_down(monkeypatch, tmp_path):
    seen = {}

    def fake_run_study(spec, out, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr("mxlab.experiment.runner.run_study", fake_run_study)
    flags = ["--executor", "ray", "--ray-address", "auto", "--gpus", "2", "--runs-per-device", "3", "--no-mps"]
    result = CliRunner().invoke(
        app, ["run", str(QUICKSTART), "--out", str(tmp_path / "o"), *flags, "--nproc-per-node", "1", "--no-keep-runs"]
    )
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen["options"] == ExecutionOptions(
        executor="ray", ray_address="auto", gpus=2, runs_per_device=3, mps=False, nproc_per_node=1, keep_runs=False
    )
    assert seen["options"].flags() == [*flags, "--no-keep-runs"]
