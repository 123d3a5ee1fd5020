import json
from dataclasses import asdict

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from mxlab import analysis, metrics
from tests.report.fake_study import make_fake_study


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ----------------------------------------------------------------------------- DeLong


def _brute_force_delong(y, scores):
    """DeLong's structural components by their O(m n) definition."""
    pos, neg = y == 1, y == 0
    v_pos, v_neg, aucs = [], [], []
    for s in scores:
        x, z = s[pos][:, None], s[neg][None, :]
        psi = (x > z) + 0.5 * (x == z)
        aucs.append(psi.mean())
        v_pos.append(psi.mean(axis=1))
        v_neg.append(psi.mean(axis=0))
    cov = np.cov(np.array(v_pos)) / pos.sum() + np.cov(np.array(v_neg)) / neg.sum()
    return np.array(aucs), cov


def test_fast_delong_equals_brute_force_with_ties():
    rng = np.random.default_rng(0)
    y = (rng.uniform(size=80) < 0.4).astype(float)
    a = np.round(y * 0.3 + rng.uniform(size=80), 1)  # coarse: many ties
    b = np.round(y * 0.1 + rng.uniform(size=80), 1)
    aucs, cov = analysis.delong_covariance(y, [a, b])
    ref_aucs, ref_cov = _brute_force_delong(y, [a, b])
    np.testing.assert_allclose(aucs, ref_aucs, rtol=1e-12)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-10)
    result = analysis.delong_test(y, a, b)
    assert result.auc_a == pytest.approx(roc_auc_score(y, a))
    se = np.sqrt(ref_cov[0, 0] + ref_cov[1, 1] - 2 * ref_cov[0, 1])
    assert result.se == pytest.approx(se, rel=1e-10)
    assert result.p_value == pytest.approx(2 * stats.norm.sf(abs(result.delta) / se), rel=1e-9)


def test_delong_detects_a_better_scorer_and_not_itself():
    rng = np.random.default_rng(1)
    logit = rng.normal(0, 1.5, 4000)
    y = (rng.uniform(size=4000) < _sigmoid(logit)).astype(float)
    good, bad = logit + rng.normal(0, 0.3, 4000), logit + rng.normal(0, 2.0, 4000)
    assert analysis.delong_test(y, good, bad).p_value < 1e-6
    same = analysis.delong_test(y, good, good)
    assert same.delta == 0 and same.p_value == 1.0


# ----------------------------------------------------------------------------- bootstrap


def _toy(n=3000, n_users=300, seed=2, round_to=None):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, n)
    logit = -1.5 + rng.normal(0, 0.7, n_users)[users] + rng.normal(0, 0.8, n)
    y = (rng.uniform(size=n) < _sigmoid(logit)).astype(float)
    p = _sigmoid(logit + rng.normal(0, 0.3, n))
    if round_to is not None:
        p = np.round(p, round_to)
    return y, p, users


@pytest.mark.parametrize("round_to", [None, 2])
def test_weighted_metrics_equal_metrics_on_the_explicitly_resampled_data(round_to):
    y, p, users = _toy(round_to=round_to)
    n_users = 300
    prepared = analysis._SortedRun.build(y, p, users, n_users, metrics.ECE_BINS)
    ones = np.ones((1, n_users))
    unit = prepared.weighted_metrics(ones, ones.astype(np.float32))
    reference = metrics.task_metrics(y, p)
    for name in ("auc", "ne", "calibration", "ece"):
        assert unit[name][0] == pytest.approx(reference[name], rel=1e-9)
    # one cluster resample: repeat every example as often as its user was drawn
    counts = analysis.user_resample_counts(n_users, 1, np.random.default_rng(3))
    weighted = prepared.weighted_metrics(counts.astype(float), counts.astype(np.float32))
    repeat = counts[0][users]
    y_rep, p_rep = np.repeat(y, repeat), np.repeat(p, repeat)
    assert weighted["auc"][0] == pytest.approx(roc_auc_score(y_rep, p_rep), rel=1e-9)
    assert weighted["ne"][0] == pytest.approx(metrics.normalized_entropy(y_rep, p_rep), rel=1e-9)
    assert weighted["calibration"][0] == pytest.approx(metrics.calibration(y_rep, p_rep), rel=1e-9)


def test_user_resample_counts_draw_users_with_replacement():
    counts = analysis.user_resample_counts(50, 400, np.random.default_rng(0))
    assert counts.shape == (400, 50)
    assert (counts.sum(axis=1) == 50).all()
    assert counts.mean() == pytest.approx(1.0)
    assert counts.var() == pytest.approx(1 - 1 / 50, abs=0.05)  # binomial(50, 1/50)
    again = analysis.user_resample_counts(50, 400, np.random.default_rng(0))
    assert np.array_equal(counts, again)


def test_bootstrap_intervals_cover_a_null_delta_and_detect_a_shift():
    """Two equally good models (A/A): about 5% of 95% intervals exclude zero; a shifted model: nearly all."""
    reps, false_auc, false_ne, detected = 60, 0, 0, 0
    for rep in range(reps):
        y, truth, users = _toy(n=1500, n_users=300, seed=100 + rep)
        rng = np.random.default_rng(rep)
        logit = np.log(truth) - np.log1p(-truth)
        runs = {name: {"ctr": _sigmoid(logit + rng.normal(0, 0.3, y.size) + shift)}
                for name, shift in (("a", 0.0), ("b", 0.0), ("biased", 0.5))}
        boot = analysis.bootstrap_run_metrics({"ctr": y}, {"ctr": users}, 300, runs, n_resamples=100, seed=rep)
        null = analysis.metric_deltas(boot["a"]["ctr"], boot["b"]["ctr"])
        shifted = analysis.metric_deltas(boot["biased"]["ctr"], boot["b"]["ctr"])
        lo, hi = np.percentile(null["auc"], [2.5, 97.5])
        false_auc += lo > 0 or hi < 0
        lo, hi = np.percentile(null["ne_pct"], [2.5, 97.5])
        false_ne += lo > 0 or hi < 0
        detected += np.percentile(shifted["calibration_error"], 2.5) > 0
    assert false_auc / reps <= 0.15 and false_ne / reps <= 0.15
    assert detected / reps >= 0.95


# ----------------------------------------------------------------------------- verdicts and settings


def test_judge_needs_interval_and_threshold_on_the_same_side():
    auc, ne = analysis.DELTA_METRIC_BY_NAME["auc"], analysis.DELTA_METRIC_BY_NAME["ne_pct"]
    assert analysis.judge(-0.003, -0.004, -0.002, auc, 0.001) == "regression"
    assert analysis.judge(-0.0005, -0.0007, -0.0003, auc, 0.001) == "neutral"  # significant but below threshold
    assert analysis.judge(-0.003, -0.008, 0.002, auc, 0.001) == "neutral"  # large but the interval holds zero
    assert analysis.judge(0.003, 0.002, 0.004, auc, 0.001) == "improvement"
    assert analysis.judge(0.5, 0.1, 0.9, ne, 0.02) == "regression"
    assert analysis.judge(-0.5, -0.9, -0.1, ne, 0.02) == "improvement"
    with pytest.raises(ValueError, match="no worse direction"):
        analysis.judge(0.1, 0.0, 0.2, analysis.DELTA_METRIC_BY_NAME["calibration"], 0.01)


def test_report_settings_validation():
    assert analysis.ReportSettings.from_dict(None).ne_regression_pct == 0.02
    assert analysis.ReportSettings.from_dict({"auc_regression": 0.01}).auc_regression == 0.01
    with pytest.raises(ValueError, match="unknown report setting.*ne_regression"):
        analysis.ReportSettings.from_dict({"ne_regresion_pct": 0.1})
    with pytest.raises(ValueError, match="bootstrap_resamples"):
        analysis.ReportSettings.from_dict({"bootstrap_resamples": 2.5})
    with pytest.raises(ValueError, match="confidence"):
        analysis.ReportSettings.from_dict({"confidence": 1.5})


# ----------------------------------------------------------------------------- whole studies


ARMS = {"bf16": "same", "mx-same": "same", "mx-regress": "regress", "mx-diverged": "diverged"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    directory = make_fake_study(tmp_path_factory.mktemp("studies") / "planted", arms=ARMS)
    return analysis.analyze_study(directory)


def test_planted_regression_is_detected(study):
    arm = study.arms["mx-regress"]
    assert arm.verdict == "regression" and "REGRESSION" in arm.conclusion
    for task in ("ctr", "ctcvr"):
        ne = study.comparison("mx-regress", task, "ne_pct")
        assert ne.verdict == "regression" and ne.delta > ne.threshold and ne.interval.low > 0
        assert ne.basis == "t over seeds" and ne.interval.n_seeds == 3
    for task in metrics.TASKS:
        assert study.comparison("mx-regress", task, "calibration_error").verdict == "regression"
        assert study.comparison("mx-regress", task, "calibration").delta > 0  # the planted bias over-predicts
    assert study.comparison("mx-regress", "ctr", "auc").delta < 0
    assert study.settings.interval_confidence == pytest.approx(1 - 0.05 / 12)
    delong = study.delong[("mx-regress", "ctr", 0)]
    assert delong.delta < 0 and delong.p_value < 0.01


def test_aa_arm_and_noise_floor_are_neutral(study):
    assert study.arms["mx-same"].verdict == "neutral"
    assert all(c.verdict in (None, "neutral") for c in study.comparisons if c.arm == "mx-same")
    assert study.noise_floor and all(c.verdict in (None, "neutral") for c in study.noise_floor)
    assert sorted(study.noise_floor[0].per_seed) == [1, 2]


def test_diverged_run_is_listed_excluded_and_named_in_the_verdict(study):
    arm = study.arms["mx-diverged"]
    assert arm.verdict == "diverged"
    assert arm.diverged == {1: 37} and arm.paired_seeds == [0, 2]
    assert "DIVERGED" in arm.conclusion and "seed 1 at step 37" in arm.conclusion
    comparison = study.comparison("mx-diverged", "ctr", "auc")
    assert sorted(comparison.per_seed) == [0, 2]
    assert comparison.basis == "bootstrap"  # 2 paired seeds < min_seeds_for_t
    summary = json.loads(json.dumps(study.to_dict()))
    assert summary["verdicts"]["mx-diverged"]["verdict"] == "diverged"
    assert {"arm": "mx-diverged", "seed": 1, "status": "diverged"}.items() <= next(
        r for r in summary["runs"] if r["arm"] == "mx-diverged" and r["seed"] == 1).items()


def test_deltas_are_paired_by_seed(study):
    comparison = study.comparison("mx-regress", "ctr", "auc")
    for seed, delta in comparison.per_seed.items():
        expected = study.run_metrics["mx-regress"][seed]["ctr"]["auc"] - study.run_metrics["bf16"][seed]["ctr"]["auc"]
        assert delta == pytest.approx(expected, abs=1e-15)
    values = list(comparison.per_seed.values())
    low, high = stats.t.interval(1 - 0.05 / 12, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert (comparison.t_interval.low, comparison.t_interval.high) == pytest.approx((low, high))


def test_single_seed_verdict_rests_on_the_bootstrap_and_says_so(tmp_path):
    directory = make_fake_study(tmp_path / "one", arms={"bf16": "same", "mx-regress": "regress"}, seeds=(0,),
                                n_examples=8000, n_users=1000)
    result = analysis.analyze_study(directory)
    ne = result.comparison("mx-regress", "ctr", "ne_pct")
    assert ne.t_interval is None and ne.basis == "bootstrap" and ne.verdict == "regression"
    assert ne.interval is ne.bootstrap and ne.interval.n_resamples == 50
    assert "bootstrap" in result.arms["mx-regress"].conclusion
    assert result.noise_floor == [] and "needs at least two" in result.noise_floor_note
    again = analysis.analyze_study(directory)  # a fixed bootstrap seed gives the same intervals
    assert again.comparison("mx-regress", "ctr", "ne_pct").bootstrap == ne.bootstrap
    other_seed = analysis.analyze_study(directory, bootstrap_seed=1)
    assert other_seed.comparison("mx-regress", "ctr", "ne_pct").bootstrap != ne.bootstrap


def test_thresholds_come_from_the_study(tmp_path):
    directory = make_fake_study(tmp_path / "lenient", arms={"bf16": "same", "mx-regress": "regress"}, seeds=(0, 1, 2),
                                n_examples=8000, n_users=1000,
                                report={"ne_regression_pct": 50.0, "auc_regression": 0.5, "calibration_tolerance": 1.0,
                                        "ece_regression": 1.0, "bootstrap_resamples": 20})
    result = analysis.analyze_study(directory)
    assert result.arms["mx-regress"].verdict == "neutral"
    assert result.comparison("mx-regress", "ctr", "ne_pct").threshold == 50.0


def test_broken_pairing_and_bad_status_are_refused(tmp_path):
    directory = make_fake_study(tmp_path / "broken", arms={"bf16": "same", "mx": "same"}, seeds=(0,), n_examples=2000,
                                n_users=200)
    path = directory / "runs" / "mx" / "seed0" / "eval.npz"
    arrays = dict(np.load(path))
    arrays["click"] = 1 - arrays["click"]
    arrays["conversion"] = np.zeros_like(arrays["conversion"])
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="different 'click'"):
        analysis.analyze_study(directory)
    (directory / "runs" / "mx" / "seed0" / "done.json").write_text(json.dumps({"status": "exploded"}))
    with pytest.raises(ValueError, match="'exploded'.*'finished', 'diverged'"):
        analysis.load_study(directory)


def test_summary_is_json_ready(study):
    summary = study.to_dict()
    text = json.dumps(summary)
    assert "NaN" not in text
    assert summary["settings"] == asdict(study.settings)
    assert summary["n_eval_examples"]["ctr"] == 20_000


def test_skipped_arm_is_listed_with_its_reason(tmp_path):
    directory = make_fake_study(tmp_path / "skip", arms={"bf16": "same", "mx-cuda": "same"}, seeds=(0, 1),
                                n_examples=2000, n_users=300, report={"bootstrap_resamples": 10})
    for seed in (0, 1):
        run = directory / "runs" / "mx-cuda" / f"seed{seed}"
        (run / "eval.npz").unlink()
        (run / "done.json").write_text(json.dumps({"status": "skipped", "reason": "needs a CUDA device"}))
    result = analysis.analyze_study(directory)
    arm = result.arms["mx-cuda"]
    assert arm.verdict == "skipped" and arm.skipped == {0: "needs a CUDA device", 1: "needs a CUDA device"}
    assert "SKIPPED on seeds [0, 1] (needs a CUDA device)" in arm.conclusion
    assert result.comparisons == [] and len(result.noise_floor) > 0
