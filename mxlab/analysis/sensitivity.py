"""What a study can decide under the rule actually used: the smallest margin it shows non-inferiority
(or equivalence) at, and the smallest regression it calls a regression, each with a given power.

The per-seed deltas give an estimate d-bar ~ N(delta, se^2) and an estimated standard error
se-hat = se sqrt(W / df), W ~ chi^2(df) (df = k - 1, the seed variance's degrees of freedom; the
shared eval variance is treated as estimated with it, which slightly overstates the uncertainty).
Both probabilities are averaged over a fixed grid of chi^2 quantiles, so they are deterministic.

- Non-inferiority (one-sided, level alpha): d-bar + t(1 - alpha) se-hat < M on the bad side;
  equivalence (the calibration shift, two one-sided tests): |d-bar| + t(1 - alpha) se-hat < M.
- Regression: the two-sided test of zero at level alpha rejects (|d-bar| > t(1 - alpha / 2) se-hat)
  on the bad side and the point is beyond the margin (d-bar > M).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as scipy_stats

GRID = 400


@functools.lru_cache(maxsize=256)
def _scale_grid(df: float) -> np.ndarray:
    """sqrt(W / df) at the midpoint quantiles of W ~ chi^2(df)."""
    q = (np.arange(GRID) + 0.5) / GRID
    return np.sqrt(scipy_stats.chi2.ppf(q, df) / df)


def pass_probability(delta: float, margin: float, se: float, df: float, alpha: float, equivalence: bool) -> float:
    """Probability that a true bad-side ``delta`` passes non-inferiority (``equivalence``: the two-sided
    equivalence test) at one-sided level ``alpha`` against ``margin``."""
    reach = scipy_stats.t.ppf(1 - alpha, df) * se * _scale_grid(df)
    upper = scipy_stats.norm.cdf((margin - reach - delta) / se)
    if not equivalence:
        return float(upper.mean())
    lower = scipy_stats.norm.cdf((-margin + reach - delta) / se)
    return float(np.clip(upper - lower, 0, 1).mean())


def regression_probability(delta: float, margin: float, se: float, df: float, alpha: float) -> float:
    """Probability that a true bad-side ``delta`` (> 0) is called a regression: the two-sided test of
    zero at ``alpha`` rejects on the bad side and the point is beyond ``margin``."""
    bar = np.maximum(scipy_stats.t.ppf(1 - alpha / 2, df) * se * _scale_grid(df), margin)
    return float(scipy_stats.norm.sf((bar - delta) / se).mean())


def _solve(f, low: float, high: float, target: float, increasing: bool) -> float:
    for _ in range(60):
        mid = (low + high) / 2
        if (f(mid) < target) == increasing:
            low = mid
        else:
            high = mid
    return high if increasing else low


def smallest_margin(se: float, df: float, alpha: float, power: float, equivalence: bool) -> float:
    """The smallest margin a study of this ``se`` on ``df`` degrees of freedom shows non-inferiority
    (equivalence) at with probability ``power`` when the true delta is 0; nan without a finite se or df >= 1."""
    if not (math.isfinite(se) and math.isfinite(df)) or df < 1 or se <= 0:
        return math.nan
    high = se * (scipy_stats.t.ppf(1 - alpha, df) * 10 + 10)
    return _solve(lambda m: pass_probability(0.0, m, se, df, alpha, equivalence), 0.0, high, power, True)


def smallest_regression(margin: float, se: float, df: float, alpha: float, power: float) -> float:
    """The smallest true bad-side delta called a regression (test of zero at two-sided ``alpha`` and the
    point beyond ``margin``) with probability ``power``; nan without a finite se or df >= 1."""
    if not (math.isfinite(se) and math.isfinite(df)) or df < 1 or se <= 0:
        return math.nan
    high = margin + se * (scipy_stats.t.ppf(1 - alpha / 2, df) * 10 + 10)
    return _solve(lambda d: regression_probability(d, margin, se, df, alpha), 0.0, high, power, True)
