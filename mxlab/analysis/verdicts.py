"""The per-endpoint rule: verdict words for a family of arm x endpoint hypotheses, Holm across it.

Used for the exploratory arms (one family) and for each control (its own family); the candidates'
decision (intersection-union, mxlab.analysis.decision) reuses its words.

Words (docs/statistics.md): ``regression`` (the interval lies beyond zero on the bad side and the
point delta is worse than the margin; for the calibration shift either side is bad), ``improvement``
(the mirror image), ``non-inferior`` (the whole interval lies on the good side of the margin: the
arm is shown not to lose more than it), ``equivalent`` (a calibration shift whose interval lies
within plus and minus the margin), ``inconclusive`` (anything else, and always with fewer than
MIN_PAIRED_SEEDS paired seeds).

Multiplicity: the family is every arm x primary metric with enough seeds. Holm's step-down test of
delta = 0 at the family-wise level 1 - confidence decides which deltas differ from zero; each
hypothesis's interval is taken at the level of the Holm step that judged it (the step where it
was rejected, or the step where the procedure stopped), so "the interval excludes zero" and "Holm
rejects" always agree. With no rejection every interval is at the Bonferroni level alpha / m.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mxlab.analysis.stats import Estimate
from mxlab.experiment.report_settings import CORRECTIONS, MIN_PAIRED_SEEDS

VERDICTS: tuple[str, ...] = ("regression", "improvement", "non-inferior", "equivalent", "inconclusive")
WORSE_WHEN: tuple[str, ...] = ("higher", "lower", "either")


@dataclass(frozen=True)
class Hypothesis:
    """One arm x primary metric to judge: its estimate, margin and which direction is worse."""

    arm: str
    metric: str
    estimate: Estimate
    margin: float
    worse_when: str  # "higher" | "lower" | "either" (the signed calibration shift: two-sided)


@dataclass(frozen=True)
class Verdict:
    """The decision on one hypothesis: word, interval, the two-sided level it was taken at, p-value of delta = 0."""

    arm: str
    metric: str
    verdict: str
    delta: float
    low: float
    high: float
    level: float  # the interval's confidence
    p_value: float
    margin: float
    n_seeds: int
    reason: str


def holm_levels(p_values: Sequence[float], alpha: float, correction: str = "holm") -> tuple[list[bool], list[float]]:
    """(rejected, alpha level of each hypothesis's interval) for Holm's step-down test at family-wise alpha.

    "bonferroni" gives every hypothesis alpha / m, "none" gives alpha. Refuses an unknown correction."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction {correction!r}; accepted: {', '.join(CORRECTIONS)}")
    m = len(p_values)
    if correction == "none":
        return [p <= alpha for p in p_values], [alpha] * m
    if correction == "bonferroni":
        return [p <= alpha / m for p in p_values], [alpha / m] * m
    order = sorted(range(m), key=lambda i: p_values[i])
    rejected, levels = [False] * m, [0.0] * m
    stopped = None
    for step, i in enumerate(order):
        level = alpha / (m - step)
        if stopped is None and p_values[i] <= level:
            rejected[i], levels[i] = True, level
        else:
            stopped = level if stopped is None else stopped
            levels[i] = stopped
    return rejected, levels


def shift_direction(delta: float) -> str:
    """'over-predicts' or 'under-predicts' for a calibration shift's sign."""
    return "over-predicts" if delta > 0 else "under-predicts"


def _word(h: Hypothesis, rejected: bool, low: float, high: float) -> tuple[str, str]:
    if h.worse_when == "either":
        if rejected and abs(h.estimate.delta) > h.margin:
            return "regression", f"{shift_direction(h.estimate.delta)}: differs from zero and beyond the margin"
        if -h.margin < low and high < h.margin:
            return "equivalent", "the whole interval lies within the margin on both sides"
        return "inconclusive", "the interval crosses the margin"
    sign = 1.0 if h.worse_when == "higher" else -1.0
    bad = sign * h.estimate.delta
    bad_high = max(sign * low, sign * high)
    if rejected and bad > 0 and bad > h.margin:
        return "regression", "worse than zero with confidence and beyond the margin"
    if rejected and bad < 0 and -bad > h.margin:
        return "improvement", "better than zero with confidence and beyond the margin"
    if bad_high < h.margin:
        return "non-inferior", "the whole interval is on the good side of the margin"
    if rejected:
        return "inconclusive", "differs from zero, but the point delta is within the margin and the interval crosses it"
    return "inconclusive", "the interval holds zero and crosses the margin"


def decide(hypotheses: Sequence[Hypothesis], confidence: float = 0.95, correction: str = "holm") -> list[Verdict]:
    """Verdicts for a family (module docstring). Hypotheses with fewer than MIN_PAIRED_SEEDS seeds are
    ``inconclusive`` and stay out of the family. Refuses a worse_when other than WORSE_WHEN."""
    for h in hypotheses:
        if h.worse_when not in WORSE_WHEN:
            raise ValueError(f"{h.arm} {h.metric}: worse_when {h.worse_when!r}; accepted: {', '.join(WORSE_WHEN)}")
    judged = [h for h in hypotheses if h.estimate.n_seeds >= MIN_PAIRED_SEEDS and math.isfinite(h.estimate.se)]
    rejected, levels = holm_levels([h.estimate.p_value() for h in judged], 1 - confidence, correction)
    by_id = {id(h): (r, a) for h, r, a in zip(judged, rejected, levels)}
    out = []
    for h in hypotheses:
        e = h.estimate
        if id(h) not in by_id:
            low, high = e.interval(confidence)
            out.append(
                Verdict(
                    h.arm,
                    h.metric,
                    "inconclusive",
                    e.delta,
                    low,
                    high,
                    confidence,
                    e.p_value(),
                    h.margin,
                    e.n_seeds,
                    f"{e.n_seeds} paired seed(s); a verdict needs {MIN_PAIRED_SEEDS}",
                )
            )
            continue
        is_rejected, alpha = by_id[id(h)]
        low, high = e.interval(1 - alpha)
        word, reason = _word(h, is_rejected, low, high)
        out.append(
            Verdict(h.arm, h.metric, word, e.delta, low, high, 1 - alpha, e.p_value(), h.margin, e.n_seeds, reason)
        )
    return out
