"""The diagnostics below the ship table: calibration slope, deciles and NE after a held-out recalibration
(planted miscalibrations), and the stability endpoint (planted diverged and stuck runs)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mxlab.analysis import RunStatus, StudyData
from mxlab.analysis.recalibration import logistic_fit, run_calibration, user_halves
from mxlab.analysis.stability import MAD_FLOOR, STUCK_MADS, stability, stuck_threshold
from mxlab.report import write_report
from tests.report.fake_study import make_fake_study


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.fixture(scope="module")
def eval_set():
    rng = np.random.default_rng(0)
    n = 60_000
    users = rng.integers(0, 3000, n)
    true_logit = rng.normal(-2.0, 1.0, n)
    labels = (rng.uniform(size=n) < _sigmoid(true_logit)).astype(np.float64)
    return labels, true_logit, users


def test_the_slope_reads_a_planted_spread_and_recalibration_removes_only_calibration(eval_set):
    labels, true_logit, users = eval_set
    calibrated = run_calibration(labels, _sigmoid(true_logit), users)
    extreme = run_calibration(labels, _sigmoid(2 * true_logit + 2.0), users)  # logit doubled: slope 1/2
    under = run_calibration(labels, _sigmoid(true_logit - 0.4), users)  # a uniform under-prediction
    assert calibrated.slope == pytest.approx(1.0, abs=0.05) and extreme.slope == pytest.approx(0.5, abs=0.03)
    assert under.slope == pytest.approx(1.0, abs=0.05) and under.intercept == pytest.approx(0.4, abs=0.06)
    assert all(d < 0.85 for d in under.deciles) and all(0.8 < d < 1.25 for d in calibrated.deciles)
    # a monotone distortion keeps the ranking: recalibrated, both score as the calibrated predictions do
    for run in (extreme, under):
        assert run.raw_ne > calibrated.raw_ne + 0.005
        assert run.recalibrated_ne == pytest.approx(calibrated.recalibrated_ne, abs=2e-4)
    noisy = run_calibration(labels, _sigmoid(true_logit + np.random.default_rng(1).normal(0, 1.0, labels.size)), users)
    assert noisy.recalibrated_ne > calibrated.recalibrated_ne + 0.01  # worse ranking stays after recalibration


def test_logistic_fit_matches_the_maximum_likelihood(eval_set):
    labels, true_logit, _ = eval_set
    a, b = logistic_fit(labels, true_logit)
    x = np.column_stack([np.ones_like(true_logit), true_logit])
    from scipy.optimize import minimize

    nll = lambda beta: float(np.sum(np.logaddexp(0, x @ beta) - labels * (x @ beta)))  # noqa: E731
    reference = minimize(nll, np.zeros(2), method="BFGS").x
    assert (a, b) == pytest.approx(tuple(reference), abs=2e-3)
    assert math.isnan(logistic_fit(np.ones(10), np.arange(10.0))[0])  # one label class: no fit


def test_the_user_split_is_fixed_and_keeps_users_whole(eval_set):
    *_, users = eval_set
    fit = user_halves(users)
    assert np.array_equal(fit, user_halves(users.copy()))
    assert not set(users[fit]) & set(users[~fit])
    assert abs(fit.mean() - 0.5) < 0.05


def _study(runs: dict[str, list[str]], spec: dict | None = None) -> StudyData:
    seeds = list(range(len(next(iter(runs.values())))))
    statuses = {
        (arm, s): RunStatus(arm, s, status, Path("/nowhere"))
        for arm, states in runs.items()
        for s, status in enumerate(states)
    }
    return StudyData(Path("/nowhere"), spec or {}, "planted", next(iter(runs)), list(runs), seeds, statuses)


def test_planted_diverged_and_stuck_runs_are_found_and_tested_exactly():
    rng = np.random.default_rng(0)
    n = 12
    runs = {
        "bf16": ["finished"] * n,
        "fine": ["finished"] * (n - 1) + ["diverged"],
        "unstable": ["diverged"] * 3 + ["finished"] * (n - 3),
    }
    auc = {arm: {s: {"ctr": {"auc": 0.75 + rng.normal(0, 0.002)}} for s in range(n)} for arm in runs}
    for s in (3, 4, 5, 6):
        auc["unstable"][s]["ctr"]["auc"] = 0.62  # stuck: far below the baseline's runs
    auc["fine"][0]["ctr"]["auc"] = 0.745  # a little worse, not stuck
    base = [auc["bf16"][s]["ctr"]["auc"] for s in range(n)]
    mad = np.median(np.abs(np.array(base) - np.median(base)))
    threshold, by_oracle, rows = stability(_study(runs), auc)
    assert not by_oracle
    assert threshold == pytest.approx(np.median(base) - STUCK_MADS * max(mad, MAD_FLOOR))
    by_arm = {r.arm: r for r in rows}
    assert by_arm["unstable"].diverged == [0, 1, 2] and by_arm["unstable"].stuck == [3, 4, 5, 6]
    assert by_arm["fine"].diverged == [11] and by_arm["fine"].stuck == []
    assert by_arm["bf16"].failed == 0
    exact = stats.fisher_exact([[7, 5], [0, 12]], alternative="greater")[1]
    assert by_arm["unstable"].p_value == pytest.approx(exact) and by_arm["unstable"].less_stable
    assert by_arm["fine"].p_value == pytest.approx(0.5) and not by_arm["fine"].less_stable
    assert math.isnan(stuck_threshold([0.7, 0.71]))  # two baseline runs: no stuck criterion


def test_with_the_oracles_recorded_a_run_at_or_below_the_no_history_oracle_is_stuck():
    runs = {"bf16": ["finished"] * 4, "mx": ["finished"] * 4}
    auc = {arm: {s: {"ctr": {"auc": 0.80}} for s in range(4)} for arm in runs}
    auc["bf16"][2]["ctr"]["auc"] = 0.74  # below the oracle: stuck, though the baseline's own
    auc["mx"][1]["ctr"]["auc"] = 0.745  # exactly the oracle's AUC: stuck
    auc["mx"][3]["ctr"]["auc"] = 0.7451  # just above it: learned the history
    spec = {"oracles": {"no_history": {"ctr.auc": 0.745, "ctr.ne": 0.93}, "truth": {"ctr.auc": 0.87}}}
    threshold, by_oracle, rows = stability(_study(runs, spec), auc)
    by_arm = {r.arm: r for r in rows}
    assert by_oracle and threshold == 0.745
    assert by_arm["bf16"].stuck == [2] and by_arm["mx"].stuck == [1]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    arms = {"bf16": "same", "mx-same": "same", "mx-regress": "regress", "mx-diverged": "diverged"}
    directory = make_fake_study(
        tmp_path_factory.mktemp("diagnostics") / "study", arms=arms, seeds=(0, 1, 2), n_examples=6000, n_users=600
    )
    write_report(directory)
    return directory


def test_the_report_shows_the_diagnostics_below_the_ship_table(rendered):
    text = (rendered / "report.md").read_text()
    assert text.index("## Ship table") < text.index("## Calibration diagnostics") < text.index("## Stability")
    assert "calibration slope" in text and "NE recalibrated" in text and "Calibration by prediction decile" in text
    stability_rows = [line for line in text.splitlines() if line.startswith("| mx-diverged |")]
    assert any("| 3 | 1 | - | 1/3 (33%) |" in line for line in stability_rows)  # seed 1 diverged


def test_without_run_folders_the_diagnostics_say_so(rendered, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("study.json", "summary.json"):
        shutil.copy(rendered / name, copy / name)
    write_report(copy)
    text = (copy / "report.md").read_text()
    assert "**⚠ Not computed: the run folders (eval.npz) are not in this study folder.**" in text
    assert "## Stability" in text  # run statuses and final AUCs are in summary.json
