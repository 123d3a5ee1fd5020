import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from mxlab import metrics


def _sample(n=3000, seed=0, ties=False):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.6, n)
    if ties:
        p = np.round(p, 2)  # many exact ties
    y = (rng.uniform(size=n) < p).astype(np.float32)
    return y, p


@pytest.mark.parametrize("ties", [False, True])
def test_auc_and_log_loss_match_sklearn(ties):
    y, p = _sample(ties=ties)
    assert metrics.auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert metrics.log_loss(y, p) == pytest.approx(sk_log_loss(y, p), rel=1e-10)


def test_auc_all_tied_is_one_half_and_perfect_is_one():
    y = np.array([0, 1, 0, 1, 1])
    assert metrics.auc(y, np.full(5, 0.3)) == 0.5
    assert metrics.auc(y, y * 0.5 + 0.1) == 1.0


def test_log_loss_clips_extreme_predictions():
    y = np.array([1.0, 0.0])
    p = np.array([0.0, 0.0])
    assert metrics.log_loss(y, p) == pytest.approx(
        -(np.log(metrics.PROBABILITY_CLIP) + np.log1p(-metrics.PROBABILITY_CLIP)) / 2, rel=1e-12
    )


def test_ne_is_one_for_base_rate_prediction_and_uses_base_rate_entropy():
    y, p = _sample(seed=1)
    rate = float(y.astype(np.float64).mean())
    assert metrics.normalized_entropy(y, np.full(y.size, rate)) == pytest.approx(1.0, rel=1e-9)
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    assert metrics.normalized_entropy(y, p) == pytest.approx(sk_log_loss(y, p) / entropy, rel=1e-10)
    assert metrics.normalized_entropy(y, p) < 1


def test_calibration_and_ece():
    y, p = _sample(seed=2)
    assert metrics.calibration(y, p) == pytest.approx(p.sum() / y.sum())
    assert metrics.calibration(y, 1.1 * p) == pytest.approx(1.1 * p.sum() / y.sum())
    # ECE by hand with equal-count bins (n divisible by bins: exact tenths)
    order = np.argsort(p, kind="stable")
    manual = np.mean([abs(p[b].mean() - y[b].astype(np.float64).mean()) for b in np.array_split(order, 10)])
    assert metrics.expected_calibration_error(y, p) == pytest.approx(manual, rel=1e-12)
    # a biased model has a larger ECE than a calibrated one
    assert (
        metrics.expected_calibration_error(y, np.clip(p * 1.5, 0, 1)) > metrics.expected_calibration_error(y, p) + 0.02
    )


def test_reliability_bins_have_equal_counts():
    bins = metrics.reliability_bins(np.array([0, 1] * 11), np.linspace(0.01, 0.99, 22), n_bins=4)
    assert sorted(bins.count.tolist()) == [5, 5, 6, 6]
    with pytest.raises(ValueError, match="n_bins"):
        metrics.reliability_bins(np.array([0, 1]), np.array([0.1, 0.2]), n_bins=3)


def test_gauc_matches_per_user_loop_and_skips_single_class_users():
    rng = np.random.default_rng(3)
    n = 4000
    users = rng.integers(0, 300, n)
    y, p = _sample(n, seed=4, ties=True)
    users[users == 7] = 7
    y[users == 7] = 0  # single-class user
    total, weight, count = 0.0, 0.0, 0
    for u in np.unique(users):
        m = users == u
        if 0 < y[m].sum() < m.sum():
            total += roc_auc_score(y[m], p[m]) * m.sum()
            weight += m.sum()
            count += 1
    value, used = metrics.group_auc(y, p, users)
    assert used == count
    assert value == pytest.approx(total / weight, abs=1e-12)


def _eval_arrays(n=5000, seed=5, truth=True):
    rng = np.random.default_rng(seed)
    true_ctr = rng.uniform(0.05, 0.5, n)
    true_cvr = rng.uniform(0.05, 0.5, n)
    click = (rng.uniform(size=n) < true_ctr).astype(np.float32)
    conversion = click * (rng.uniform(size=n) < true_cvr)
    p_ctr = np.clip(true_ctr + rng.normal(0, 0.03, n), 0.01, 0.99)
    p_cvr = np.clip(true_cvr + rng.normal(0, 0.03, n), 0.01, 0.99)
    arrays = dict(
        click=click,
        conversion=conversion.astype(np.float32),
        p_ctr=p_ctr,
        p_cvr=p_cvr,
        p_ctcvr=p_ctr * p_cvr,
        user_id=rng.integers(0, 200, n),
    )
    if truth:
        arrays.update(true_ctr=true_ctr, true_cvr=true_cvr)
    return arrays


def test_evaluate_run_tasks_use_the_right_examples(tmp_path):
    arrays = _eval_arrays()
    np.savez(tmp_path / "eval.npz", **arrays)
    result = metrics.evaluate_run(tmp_path / "eval.npz")
    assert set(result) == {"ctr", "cvr", "ctcvr"}
    clicked = arrays["click"] == 1
    assert result["cvr"]["n"] == clicked.sum()
    assert result["cvr"]["auc"] == pytest.approx(roc_auc_score(arrays["conversion"][clicked], arrays["p_cvr"][clicked]))
    assert result["ctcvr"]["auc"] == pytest.approx(roc_auc_score(arrays["conversion"], arrays["p_ctcvr"]))
    assert result["ctr"]["mae_truth"] == pytest.approx(np.abs(arrays["p_ctr"] - arrays["true_ctr"]).mean())
    truth_ctcvr = arrays["true_ctr"] * arrays["true_cvr"]
    assert result["ctcvr"]["calibration_truth"] == pytest.approx(arrays["p_ctcvr"].sum() / truth_ctcvr.sum())
    ceiling = metrics.truth_metrics(arrays)
    assert ceiling["ctr"]["mae_truth"] == 0
    assert ceiling["ctr"]["auc"] > result["ctr"]["auc"]
    assert "mae_truth" not in metrics.evaluate_run(_eval_arrays(truth=False))["ctr"]


def test_bad_inputs_are_refused_with_names():
    arrays = _eval_arrays(truth=False)
    with pytest.raises(ValueError, match="p_cvr"):
        metrics.evaluate_run({k: v for k, v in arrays.items() if k != "p_cvr"})
    with pytest.raises(ValueError, match="finite probabilities"):
        metrics.evaluate_run(dict(arrays, p_ctr=np.full(arrays["click"].size, np.nan)))
    with pytest.raises(ValueError, match="single label class"):
        metrics.auc(np.zeros(4), np.arange(4.0))
    with pytest.raises(ValueError, match="0 or 1"):
        metrics.auc(np.array([0, 2]), np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="without a click"):
        metrics.evaluate_run(dict(arrays, conversion=np.ones_like(arrays["click"])))


def test_gauc_is_nan_when_no_user_has_both_classes():
    arrays = _eval_arrays(n=500, truth=False)
    arrays["user_id"] = np.arange(500)  # one impression per user
    result = metrics.evaluate_run(arrays)
    assert np.isnan(result["ctr"]["gauc"]) and result["ctr"]["gauc_users"] == 0
    with pytest.raises(ValueError, match="none of the 500 users"):
        metrics.group_auc(arrays["click"], arrays["p_ctr"], arrays["user_id"])
