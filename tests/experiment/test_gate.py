"""The fork warm-up gate: a planted bad warm-up is replaced by the next spare seed before any arm runs, the
report counts and names it, a resume keeps the decision, and bad [gate] tables are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mxlab.experiment.gate as gate_module
from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.gate import GateConfig, judge
from mxlab.experiment.runner import run_study
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

GATED = MICRO + [
    "seeds=[0, 1, 2]",
    'arms=["bf16"]',
    "train.fork_from=bf16",
    "train.fork_steps=3",
    "train.max_steps=2",
    "gate.median_band=['ctr.auc']",
    "gate.band=0.3",
    "gate.spare_seeds=[7, 8]",
]


@pytest.fixture
def planted(monkeypatch):
    """Seed 1's warm-up scores a CTR AUC of 0.1 (a planted bad warm-up); the others their real values."""
    real = gate_module.warmup_metrics

    def metrics(run_dir: Path) -> dict[str, float]:
        values = real(run_dir)
        return {**values, "ctr.auc": 0.1} if Path(run_dir).name == "seed1" else values

    monkeypatch.setattr(gate_module, "warmup_metrics", metrics)


def test_a_bad_warmup_is_replaced_by_the_next_spare_seed_and_the_report_names_it(tmp_path, planted):
    from mxlab.report.gate import gate_text

    result = run_study(
        load_spec(QUICKSTART, GATED),
        tmp_path,
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    assert not result.failed
    decision = json.loads((tmp_path / "gate.json").read_text())
    assert decision["replaced"] == {"1": 7} and decision["unfilled"] == [] and decision["accepted_seeds"] == [0, 7, 2]
    assert "ctr.auc 0.1000 outside 30% of the seeds' median" in decision["judged"]["1"]["failed"][0]
    assert (tmp_path / "runs/_fork/seed7/done.json").is_file() and not (tmp_path / "runs/_fork/seed8").exists()
    assert (tmp_path / "runs/bf16/seed7/done.json").is_file() and not (tmp_path / "runs/bf16/seed1").exists()
    study = json.loads((tmp_path / "study.json").read_text())
    assert study["seeds"] == [0, 7, 2] and study["gate"]["decision"]["replaced"] == {"1": 7}
    text = gate_text(study)
    assert "1 of 3 declared seeds replaced (seed 1 by seed 7)" in text and "seed 1: ctr.auc 0.1000" in text

    again = run_study(
        load_spec(QUICKSTART, GATED),
        tmp_path,
        device="cpu",
        show_progress=False,
        resume=True,
        options=ExecutionOptions(executor="inline"),
    )
    assert again.trained == [] and json.loads((tmp_path / "gate.json").read_text()) == decision
    with pytest.raises(ValueError, match=r"\[gate\] differs from the one its gate.json decided with"):
        run_study(
            load_spec(QUICKSTART, GATED + ["gate.band=0.5"]),
            tmp_path,
            device="cpu",
            resume=True,
            options=ExecutionOptions(executor="inline"),
        )


def test_the_rules_compare_with_the_oracle_and_the_median():
    gate = GateConfig(beat_oracle=("ctr.auc", "ctr.ne"), oracle_margin=0.01, median_band=("ctr.ne",), band=0.02)
    oracle, median = {"ctr.auc": 0.74, "ctr.ne": 0.90}, {"ctr.ne": 0.85}
    assert judge({"ctr.auc": 0.76, "ctr.ne": 0.86}, gate, oracle, median) == []
    failed = judge({"ctr.auc": 0.745, "ctr.ne": 0.895}, gate, oracle, median)
    assert len(failed) == 3 and "not above the no_history oracle's 0.7400 by 0.01" in failed[0]
    assert "not below" in failed[1] and "outside 2% of the seeds' median 0.8500" in failed[2]
    assert judge(None, gate, oracle, median) == ["the warm-up did not finish (diverged)"]
    one_class = judge({"ctr.auc": None, "ctr.ne": None}, gate, oracle, median)  # an eval set of one class
    assert one_class == [
        "ctr.auc undefined: the eval set labels one class only",
        "ctr.ne undefined: the eval set labels one class only",
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("gate.beat_oracle=['ctr.gauc']", r"gate\.beat_oracle names unknown metric 'ctr\.gauc'; accepted: ctr\.auc"),
        ("gate.median_band=['loss']", r"gate\.median_band names unknown metric 'loss'; accepted: ctr\.auc, ctr\.ne"),
        ("gate.oracle='bayes'", r"gate\.oracle 'bayes' is not one of: truth, no_history, no_item_bias"),
        ("gate.spare_seeds=[1]", r"gate\.spare_seeds must be distinct and not among seeds \[0, 1, 2\], got \[1\]"),
        ("gate.band=1.5", r"gate\.band must be in \(0, 1\) .*got 1\.5"),
        ("gate.threshold=1", r"unknown key 'gate\.threshold'; accepted keys in \[gate\]: spare_seeds"),
    ],
)
def test_bad_gate_tables_are_refused_naming_value_and_accepted(override, message):
    with pytest.raises(ValueError, match=message):
        load_spec(QUICKSTART, GATED + [override])


def test_a_gate_needs_the_fork_design():
    with pytest.raises(ValueError, match=r"\[gate\] judges fork warm-ups"):
        load_spec(QUICKSTART, GATED + ['train.fork_from=""', "train.fork_steps=0"])
