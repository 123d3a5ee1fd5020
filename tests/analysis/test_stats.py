"""Statistics: DeLong, per-user influence values against a brute-force user bootstrap, the two-noise estimate."""

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from mxlab import analysis, metrics
from mxlab.analysis import SeedDeltas, estimate, eval_variances, paired_delta
from mxlab.analysis.stats import RunSums


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


# ----------------------------------------------------------------------------- influence values


def _toy(n=3000, n_users=300, seed=2):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, n)
    logit = -1.5 + rng.normal(0, 0.7, n_users)[users] + rng.normal(0, 0.8, n)
    y = (rng.uniform(size=n) < _sigmoid(logit)).astype(float)
    base = _sigmoid(
        logit - 0.3 + rng.normal(0, 0.6, n)
    )  # miscalibrated, and far enough from the truth that the excess is well determined
    arm = _sigmoid(logit + 0.1 + rng.normal(0, 0.7, n))
    return y, base, arm, users, _sigmoid(logit)


def _metric(kind, y, p, truth):
    if kind == "ne":
        return metrics.normalized_entropy(y, p)
    if kind == "excess_ne":
        return metrics.normalized_entropy(y, p) - metrics.normalized_entropy(y, truth)
    if kind == "calibration_error":
        return abs(metrics.calibration(y, p) - 1)
    if kind == "calibration":
        return 100 * np.log(p.sum())
    return metrics.auc(y, p)


@pytest.mark.parametrize("kind", ["ne", "excess_ne", "auc", "calibration_error", "calibration"])
def test_influence_variance_matches_a_brute_force_user_bootstrap(kind):
    y, base, arm, users, truth = _toy()
    n_users = 300
    sums_arm, sums_base = RunSums.build(y, arm, users, n_users), RunSums.build(y, base, users, n_users)
    truth_loss = np.bincount(users, weights=metrics.per_example_log_loss(y, truth), minlength=n_users)
    delta, psi = paired_delta(kind, sums_arm, sums_base, truth_loss)
    scale = {
        "ne": 100 / metrics.normalized_entropy(y, base),
        "excess_ne": 100 / (metrics.normalized_entropy(y, base) - metrics.normalized_entropy(y, truth)),
    }.get(kind, 1.0)
    direct = (_metric(kind, y, arm, truth) - _metric(kind, y, base, truth)) * scale
    if kind == "ne":
        direct = 100 * (metrics.normalized_entropy(y, arm) / metrics.normalized_entropy(y, base) - 1)
    assert delta == pytest.approx(direct, rel=1e-9)
    rng = np.random.default_rng(3)
    boot = []
    by_user = [np.flatnonzero(users == u) for u in range(n_users)]
    for _ in range(300):
        idx = np.concatenate([by_user[u] for u in rng.integers(0, n_users, n_users)])
        a = _metric(kind, y[idx], arm[idx], truth[idx])
        b = _metric(kind, y[idx], base[idx], truth[idx])
        if kind == "ne":
            boot.append(100 * (a / b - 1))
        elif kind == "excess_ne":
            boot.append(100 * (a - b) / b)
        else:
            boot.append(a - b)
    var, _ = eval_variances(psi[None, :])
    assert var == pytest.approx(np.var(boot, ddof=1), rel=0.25)


def test_estimate_adds_the_shared_eval_variance_to_the_seed_variance():
    seeds = SeedDeltas({0: 1.0, 1: 2.0, 2: 3.0}, eval_var=0.3, eval_var_of_mean=0.2)
    e = estimate(seeds)
    shared = (3 * 0.2 - 0.3) / 2
    assert e.delta == 2.0 and e.df == 2 and e.shared_eval_var == pytest.approx(shared)
    assert e.se == pytest.approx(np.sqrt(1.0 / 3 + shared))
    low, high = e.interval(0.95)
    assert high - 2.0 == pytest.approx(stats.t.ppf(0.975, 2) * e.se)
    assert estimate(SeedDeltas({0: 1.5}, 0.04, 0.04)).se == pytest.approx(0.2)


def test_eval_variances_of_identical_seeds_are_fully_shared():
    psi = np.random.default_rng(0).normal(0, 1, 500)
    per_seed, of_mean = eval_variances(np.stack([psi, psi, psi]))
    assert per_seed == pytest.approx(of_mean)
    independent = np.random.default_rng(1).normal(0, 1, (4, 500))
    per_seed, of_mean = eval_variances(independent)
    assert of_mean == pytest.approx(per_seed / 4, rel=0.2)


def test_outlying_values_flags_a_collapsed_baseline_seed_and_normal_seeds_at_the_stated_rate():
    from mxlab.analysis import OUTLIER_FALSE_ALARM, outlier_threshold, outlying_values

    # gem-mxfp8's BF16 CTCVR NE per seed (2026-12-03 afternoon run): seeds 3 and 5 trained badly
    ne = dict(enumerate([0.869, 0.8557, 0.8601, 0.9512, 0.8571, 0.9363, 0.861, 0.8541]))
    flagged = outlying_values(ne)
    assert sorted(flagged) == [3, 5]
    median = float(np.median(list(ne.values())))
    mad = float(np.median([abs(v - median) for v in ne.values()]))
    assert flagged[5] == pytest.approx(0.6745 * (ne[5] - median) / mad)  # Iglewicz and Hoaglin's score
    # a low outlier too, with the score's sign
    low = outlying_values({0: 1.0, 1: 1.1, 2: 0.9, 3: 1.05, 4: 0.95, 5: 1.02, 6: 0.98, 7: -2.0})
    assert list(low) == [7] and low[7] < 0
    # normal seeds (fresh draws, not the calibration's): flagged in about OUTLIER_FALSE_ALARM of sets, where
    # Iglewicz and Hoaglin's fixed cut of 3.5 flags 8 normal seeds in about 14% of sets
    generator = np.random.default_rng(7)
    for n in (8, 16):
        sets = generator.normal(size=(4000, n))
        rate = np.mean([bool(outlying_values(dict(enumerate(row)))) for row in sets])
        assert abs(rate - OUTLIER_FALSE_ALARM) < 0.006, (n, rate)
    assert outlier_threshold(8) > 3.5 and outlier_threshold(16) < outlier_threshold(8)
    # too few values, or no spread: nothing to say
    assert outlying_values({0: 1.0, 1: 1.0, 2: 5.0, 3: 1.0}) == {}
    assert outlying_values({s: 1.0 for s in range(6)} | {6: 2.0}) == {}
