"""Calibration diagnostics of one run's predictions: calibration by prediction decile, the calibration
slope, and NE after a held-out recalibration (docs/statistics.md, "Calibration diagnostics").

- **Deciles**: the run's predictions cut into 10 equal-count bins; per bin sum p / sum y (1 = calibrated,
  below 1 under-predicts).
- **Calibration slope**: the slope b of the logistic regression logit P(y = 1) = a + b logit(p), fitted
  by Newton's method (b = 1: calibrated spread; b < 1: predictions too extreme; b > 1: too timid).
- **Recalibrated NE**: the eval users are split in two fixed halves (a permutation of the sorted user
  ids with a fixed seed: the same split for every run of a study, so runs stay paired); a Platt
  recalibration (intercept and slope on logit p) is fitted on the first half and NE is scored on the
  second, next to the raw NE on that same second half. What recalibration removes is the calibration
  part of the NE; what stays is the ranking part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mxlab import metrics

DECILES = 10
SPLIT_SEED = 20261207
_CLIP = metrics.PROBABILITY_CLIP


@dataclass(frozen=True)
class RunCalibration:
    """One run's calibration diagnostics on one task."""

    deciles: tuple[float, ...]  # sum p / sum y per equal-count prediction bin, lowest predictions first
    slope: float  # calibration slope (nan when the fit fails)
    intercept: float
    raw_ne: float  # NE on the scoring half of the users
    recalibrated_ne: float  # NE on the scoring half after Platt recalibration fitted on the other half


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _CLIP, 1 - _CLIP)
    return np.log(p) - np.log1p(-p)


def logistic_fit(labels: np.ndarray, x: np.ndarray, steps: int = 50) -> tuple[float, float]:
    """(a, b) of the logistic regression P(y = 1) = sigmoid(a + b x) by Newton's method with step halving;
    (nan, nan) with a single label class or a singular fit."""
    y = np.asarray(labels, dtype=np.float64)
    if y.size == 0 or y.min() == y.max():
        return math.nan, math.nan
    design = np.column_stack([np.ones_like(x), x])
    beta = np.array([math.log(y.mean() / (1 - y.mean())), 0.0])

    def loss(b: np.ndarray) -> float:
        z = design @ b
        return float(np.sum(np.logaddexp(0, z) - y * z))

    current = loss(beta)
    for _ in range(steps):
        z = design @ beta
        p = 1 / (1 + np.exp(-z))
        gradient = design.T @ (p - y)
        hessian = design.T @ (design * (p * (1 - p))[:, None])
        try:
            step = np.linalg.solve(hessian + 1e-12 * np.eye(2), gradient)
        except np.linalg.LinAlgError:
            return math.nan, math.nan
        scale = 1.0
        while scale > 1e-6 and loss(beta - scale * step) > current:
            scale /= 2
        beta, previous, current = beta - scale * step, current, loss(beta - scale * step)
        if abs(previous - current) <= 1e-10 * max(1.0, abs(current)):
            break
    return float(beta[0]), float(beta[1])


def user_halves(user_id: np.ndarray) -> np.ndarray:
    """True for the examples of the fitting half of the users (a fixed permutation of the sorted ids)."""
    users = np.unique(user_id)
    fitting = np.random.default_rng(SPLIT_SEED).permutation(users.size) < users.size // 2
    return fitting[np.searchsorted(users, user_id)]


def run_calibration(labels: np.ndarray, probs: np.ndarray, user_id: np.ndarray) -> RunCalibration:
    """The diagnostics of one run on one task (module docstring); nan where a half has one label class."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    bins = metrics.equal_mass_bin_index(p, DECILES, order)
    predicted = np.bincount(bins, weights=p, minlength=DECILES)
    observed = np.bincount(bins, weights=y, minlength=DECILES)
    deciles = tuple(float(a / b) if b > 0 else math.nan for a, b in zip(predicted, observed))
    x = _logit(p)
    intercept, slope = logistic_fit(y, x)
    fit = user_halves(np.asarray(user_id))
    score = ~fit
    a, b = logistic_fit(y[fit], x[fit])
    raw = recalibrated = math.nan
    if score.any() and 0 < y[score].mean() < 1:
        raw = metrics.normalized_entropy(y[score], p[score])
        if math.isfinite(a):
            recalibrated = metrics.normalized_entropy(y[score], 1 / (1 + np.exp(-(a + b * x[score]))))
    return RunCalibration(deciles, slope, intercept, raw, recalibrated)


def eval_calibration(eval_arrays) -> dict[str, RunCalibration]:
    """{task: RunCalibration} of one run's eval arrays (an eval.npz path or loaded mapping)."""
    views = metrics.task_views(metrics.load_eval(eval_arrays))
    return {t: run_calibration(v.labels, v.probs, v.user_id) for t, v in views.items()}
