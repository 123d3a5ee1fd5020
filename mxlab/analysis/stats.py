"""Statistics of paired comparisons: per-user influence values, the two-noise interval, DeLong.

A study compares an arm with the baseline on k seeds; each seed gives one paired delta d_s
(arm minus baseline, same seed, same eval examples). The model behind the interval
(docs/statistics.md):

    d_s = delta + tau_s + c + eta_s

tau_s is retraining noise (variance sigma^2, independent over seeds), c the eval-sampling error
shared by every seed (the eval set is the same), eta_s the seed-specific part of the eval-sampling
error. The eval terms are estimated from per-user influence values (the linearisation of the
delta in each user's sums: users are the resampling unit, their examples are not independent):
``eval_variances`` gives the mean per-seed eval variance v = Var(c) + Var(eta) and the variance of
the mean over seeds Var(c) + Var(eta) / k. The variance of the mean delta is then

    V = s^2 / k + Var(c),   Var(c) = max(0, (k Var(mean) - v) / (k - 1)),

with s^2 the sample variance of the d_s over seeds (it carries sigma^2 and Var(eta)); the interval
is a Student t on k - 1 degrees of freedom. No resampling: a study costs microseconds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from mxlab import metrics

# ----------------------------------------------------------------------------- per-user sums


@dataclass(frozen=True)
class RunSums:
    """One run's predictions on one task, reduced to per-user sums (n_users rows) and its metrics."""

    count: np.ndarray  # examples per user
    positives: np.ndarray
    log_loss: np.ndarray  # sum of per-example log loss
    predicted: np.ndarray  # sum of predictions
    ece_numerator: np.ndarray  # sum over ECE bins of sign(bin gap) x (prediction - label)
    auc_influence: np.ndarray  # sum of DeLong influence values (the AUC's linearisation)
    auc: float
    ece: float

    @classmethod
    def build(
        cls,
        labels: np.ndarray,
        probs: np.ndarray,
        user_index: np.ndarray,
        n_users: int,
        n_bins: int = metrics.ECE_BINS,
        order: np.ndarray | None = None,
        delong: tuple[float, np.ndarray] | None = None,
    ) -> RunSums:
        """Per-user sums of one task; refuses fewer than two examples of either class (AUC). When known:
        `order`, the stable argsort of the predictions; `delong`, their `delong_components`."""
        y = np.asarray(labels, dtype=np.float64)
        p = np.asarray(probs, dtype=np.float64)

        def per_user(weights: np.ndarray) -> np.ndarray:
            return np.bincount(user_index, weights=weights, minlength=n_users)

        if order is None:
            order = np.argsort(p, kind="stable")  # one sort serves the AUC and the ECE bins
        auc, component = delong if delong is not None else delong_components(y, p, order)
        positive = y == 1
        m, n = int(positive.sum()), int(y.size - positive.sum())
        influence = np.where(positive, (component - auc) / m, (component - auc) / n)
        bins = metrics.equal_mass_bin_index(p, n_bins, order)
        gap = np.bincount(bins, weights=p - y, minlength=n_bins)
        ece = float(np.abs(gap).sum() / y.size)
        return cls(
            per_user(np.ones_like(y)),
            per_user(y),
            per_user(metrics.per_example_log_loss(y, p)),
            per_user(p),
            per_user(np.sign(gap)[bins] * (p - y)),
            per_user(influence),
            auc,
            ece,
        )


def truth_log_loss(labels: np.ndarray, true_probs: np.ndarray, user_index: np.ndarray, n_users: int) -> np.ndarray:
    """Per-user sums of the log loss of the true probabilities (the Bayes-optimal predictions)."""
    return np.bincount(user_index, weights=metrics.per_example_log_loss(labels, true_probs), minlength=n_users)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, np.ndarray]:
    """sum(a) / sum(b) and each user's influence (a_u - r b_u) / sum(b)."""
    total = float(denominator.sum())
    r = float(numerator.sum()) / total
    return r, (numerator - r * denominator) / total


def paired_delta(kind: str, arm: RunSums, base: RunSums, truth: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """(delta, per-user influence) of one metric kind (mxlab.experiment.report_settings.METRIC_KINDS) of an arm
    against the baseline on the same eval examples. Refuses an unknown kind and excess_ne without truth."""
    if kind == "ne":  # NE ratio = log-loss ratio: the two runs share the labels and so the base rate
        r, psi = _ratio(arm.log_loss, base.log_loss)
        return 100.0 * (r - 1.0), 100.0 * psi
    if kind == "excess_ne":
        if truth is None:
            raise ValueError("excess_ne needs the true probabilities (a source with truth)")
        r, psi = _ratio(arm.log_loss - base.log_loss, base.log_loss - truth)
        return 100.0 * r, 100.0 * psi
    if kind == "auc":
        return arm.auc - base.auc, arm.auc_influence - base.auc_influence
    if kind == "ece":
        total = float(arm.count.sum())
        return arm.ece - base.ece, (
            arm.ece_numerator - arm.ece * arm.count - base.ece_numerator + base.ece * base.count
        ) / total
    if kind == "calibration":  # 100 ln(P_arm / P_base): the labels cancel, the sign says which way
        total_a, total_b = float(arm.predicted.sum()), float(base.predicted.sum())
        return 100.0 * math.log(total_a / total_b), 100.0 * (arm.predicted / total_a - base.predicted / total_b)
    if kind == "calibration_error":
        (ca, pa), (cb, pb) = _ratio(arm.predicted, arm.positives), _ratio(base.predicted, base.positives)
        return abs(ca - 1) - abs(cb - 1), np.sign(ca - 1) * pa - np.sign(cb - 1) * pb
    raise ValueError(f"unknown metric kind {kind!r}; accepted: ne, excess_ne, auc, calibration, ece, calibration_error")


# ----------------------------------------------------------------------------- the interval


@dataclass(frozen=True)
class SeedDeltas:
    """The input of the interval: per-seed paired deltas and the eval-sampling variances behind them.

    ``eval_var`` is the mean over seeds of each seed's eval variance, ``eval_var_of_mean`` the eval
    variance of the mean over seeds (larger than eval_var / k: the seeds share the eval set)."""

    per_seed: dict[int, float]
    eval_var: float
    eval_var_of_mean: float


def eval_variances(influence: np.ndarray) -> tuple[float, float]:
    """(mean per-seed eval variance, eval variance of the mean over seeds) from per-user influence
    values (k seeds, n_users): the cluster (user) sandwich variance of each, with n / (n - 1)."""
    psi = np.atleast_2d(np.asarray(influence, dtype=np.float64))
    n = psi.shape[1]
    if n < 2:
        raise ValueError(f"eval variances need at least two users, got {n}")
    factor = n / (n - 1)
    centred = psi - psi.mean(axis=1, keepdims=True)
    per_seed = factor * np.einsum("ku,ku->k", centred, centred)
    mean = psi.mean(axis=0)
    mean -= mean.mean()
    return float(per_seed.mean()), float(factor * mean @ mean)


@dataclass(frozen=True)
class Estimate:
    """Mean delta over seeds, its standard error from both noises and the t degrees of freedom."""

    delta: float
    se: float
    df: float
    n_seeds: int
    seed_var: float  # sample variance of the per-seed deltas (nan with one seed)
    shared_eval_var: float  # Var(c), the eval error common to all seeds

    def interval(self, confidence: float) -> tuple[float, float]:
        """Two-sided interval at ``confidence``: delta +- t quantile x se (nan with fewer than two seeds)."""
        if self.n_seeds < 2 or not math.isfinite(self.se):
            return math.nan, math.nan
        half = t_quantile(0.5 + confidence / 2, self.df) * self.se
        return self.delta - half, self.delta + half

    def p_value(self, null: float = 0.0) -> float:
        """Two-sided p-value of delta = null (1.0 with fewer than two seeds)."""
        if self.n_seeds < 2 or not math.isfinite(self.se):
            return 1.0
        if self.se == 0:
            return 1.0 if self.delta == null else 0.0
        return float(2 * scipy_stats.t.sf(abs(self.delta - null) / self.se, self.df))


def t_quantile(q: float, df: float) -> float:
    """Student t quantile; the normal one for infinite degrees of freedom."""
    return float(scipy_stats.norm.ppf(q) if not math.isfinite(df) else scipy_stats.t.ppf(q, df))


def estimate(deltas: SeedDeltas) -> Estimate:
    """Mean over seeds with the variance V = s^2 / k + Var(c) (module docstring) on k - 1 degrees of
    freedom (Satterthwaite's larger df over-rejects at 3 seeds: 7.8% instead of 5% in the A/A simulation).
    With one seed: se from eval sampling alone, df nan."""
    values = np.array(list(deltas.per_seed.values()), dtype=np.float64)
    k = values.size
    if k == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, math.nan, math.nan)
    if k == 1:
        return Estimate(float(values[0]), math.sqrt(max(deltas.eval_var, 0.0)), math.nan, 1, math.nan, math.nan)
    s2 = float(values.var(ddof=1))
    shared = max(0.0, (k * deltas.eval_var_of_mean - deltas.eval_var) / (k - 1))
    variance = s2 / k + shared
    return Estimate(float(values.mean()), math.sqrt(variance), float(k - 1), k, s2, shared)


# Outlying values among seeds: Iglewicz and Hoaglin's modified z-score, 0.6745 (x - median) / MAD. Their
# fixed cut (3.5) flags one of 8 normal values in 14% of sets; the cut here is calibrated per number of
# values so that a set of normal values is flagged with probability OUTLIER_FALSE_ALARM.
OUTLIER_FALSE_ALARM = 0.01
MIN_OUTLIER_SAMPLES = 5
_CALIBRATION_DRAWS = 50_000


@functools.lru_cache(maxsize=64)
def outlier_threshold(n: int, false_alarm: float = OUTLIER_FALSE_ALARM) -> float:
    """The modified z-score that the largest |z| of n independent normal values exceeds with probability
    `false_alarm` (Monte Carlo, 50,000 sets, a fixed seed: the same cut on every call). Refuses n < 3."""
    if n < 3:
        raise ValueError(f"an outlier cut needs at least 3 values, got {n}")
    draws = np.random.default_rng(20261203).standard_normal((_CALIBRATION_DRAWS, n))
    median = np.median(draws, axis=1, keepdims=True)
    mad = np.median(np.abs(draws - median), axis=1, keepdims=True)
    largest = np.max(np.abs(0.6745 * (draws - median) / mad), axis=1)
    return float(np.quantile(largest, 1.0 - false_alarm))


def outlying_values(values: dict[int, float], false_alarm: float = OUTLIER_FALSE_ALARM) -> dict[int, float]:
    """{key: modified z-score} of the values whose |modified z-score| exceeds `outlier_threshold` for their
    number (so that normal values are flagged in a share `false_alarm` of sets); {} with fewer than
    MIN_OUTLIER_SAMPLES finite values or a median absolute deviation of 0."""
    finite = {key: float(v) for key, v in values.items() if math.isfinite(v)}
    if len(finite) < MIN_OUTLIER_SAMPLES:
        return {}
    array = np.array(list(finite.values()))
    median = float(np.median(array))
    mad = float(np.median(np.abs(array - median)))
    if mad == 0:
        return {}
    cut = outlier_threshold(len(finite), false_alarm)
    scores = {key: 0.6745 * (v - median) / mad for key, v in finite.items()}
    return {key: z for key, z in scores.items() if abs(z) > cut}


def detectable_effect(se: float, df: float, alpha: float, power: float) -> float:
    """Smallest true delta a one-sided level-alpha/2 t test (the two-sided interval at 1 - alpha) finds with
    probability ``power``, for a standard error ``se`` on df degrees of freedom: the noncentrality solving
    P(noncentral t > critical value) = power, times se. nan when se or df is not finite."""
    if not (math.isfinite(se) and math.isfinite(df)) or df <= 0:
        return math.nan
    critical = t_quantile(1 - alpha / 2, df)
    low, high = 0.0, critical + 10 * t_quantile(power, df) + 10
    for _ in range(60):
        mid = (low + high) / 2
        if scipy_stats.nct.sf(critical, df, mid) < power:
            low = mid
        else:
            high = mid
    return high * se


# ----------------------------------------------------------------------------- DeLong (a test of two fitted models)


@dataclass(frozen=True)
class DeLongResult:
    """DeLong test of AUC_a - AUC_b on the same examples: delta, its standard error, z, two-sided p, interval."""

    auc_a: float
    auc_b: float
    delta: float
    se: float
    z: float
    p_value: float
    low: float
    high: float


def delong_components(
    labels: np.ndarray, scores: np.ndarray, order: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """(AUC, structural component of every example in eval order), from one sort (Sun and Xu 2014;
    `order`: the stable argsort of the scores, when known).

    A positive's component is the fraction of negatives it outranks (ties half); a negative's is the
    fraction of positives that outrank it. Refuses fewer than two examples of either class."""
    y = np.asarray(labels, dtype=np.float64)
    positive = y == 1
    m, n = int(positive.sum()), int(y.size - positive.sum())
    if m < 2 or n < 2:
        raise ValueError(f"DeLong needs at least two positives and two negatives, got {m} and {n}")
    s = np.asarray(scores, dtype=np.float64)
    if order is None:
        order = np.argsort(s, kind="stable")
    s_sorted, pos_sorted = s[order], positive[order]
    rank_all = metrics.midranks_of_sorted(s_sorted)
    component = np.empty(y.size)
    # midrank among all minus midrank within the own class = how many of the other class rank below (ties half)
    component[order[pos_sorted]] = (rank_all[pos_sorted] - metrics.midranks_of_sorted(s_sorted[pos_sorted])) / n
    component[order[~pos_sorted]] = (
        1.0 - (rank_all[~pos_sorted] - metrics.midranks_of_sorted(s_sorted[~pos_sorted])) / m
    )
    auc = float(component[positive].mean())
    return auc, component


def delong_from_components(
    labels: np.ndarray, aucs: list[float], components: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    positive = np.asarray(labels) == 1
    stacked = np.array(components)
    cov = (
        np.atleast_2d(np.cov(stacked[:, positive])) / positive.sum()
        + np.atleast_2d(np.cov(stacked[:, ~positive])) / (~positive).sum()
    )
    return np.array(aucs), cov


def delong_covariance(labels: np.ndarray, scores: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Fast DeLong (Sun and Xu 2014): (AUCs (k,), covariance matrix (k, k)) of k score vectors on the
    same labelled examples, O(k n log n). Refuses fewer than two examples of either class."""
    parts = [delong_components(labels, s) for s in scores]
    return delong_from_components(labels, [a for a, _ in parts], [c for _, c in parts])


def delong_result(aucs: np.ndarray, cov: np.ndarray, confidence: float) -> DeLongResult:
    delta = float(aucs[0] - aucs[1])
    var = float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    se = math.sqrt(max(var, 0.0))
    if se == 0.0:
        z, p = (0.0, 1.0) if delta == 0 else (math.copysign(math.inf, delta), 0.0)
    else:
        z = delta / se
        p = float(2 * scipy_stats.norm.sf(abs(z)))
    q = float(scipy_stats.norm.ppf(0.5 + confidence / 2))
    return DeLongResult(float(aucs[0]), float(aucs[1]), delta, se, z, p, delta - q * se, delta + q * se)


def delong_test(
    labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, confidence: float = 0.95
) -> DeLongResult:
    """DeLong test of AUC(scores_a) - AUC(scores_b) on the same examples (see :func:`delong_covariance`)."""
    return delong_result(*delong_covariance(labels, [scores_a, scores_b]), confidence)
