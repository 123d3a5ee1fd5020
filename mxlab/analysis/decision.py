"""The pre-registered decision: does each candidate ship? (docs/statistics.md, "The decision").

A candidate ships when every co-primary endpoint passes (intersection-union, Berger 1982): its
one-sided non-inferiority test at level alpha for NE or AUC (H0: worse by the margin or more), its
two one-sided tests for the calibration shift (Schuirmann 1987; H0: |shift| >= margin). No
adjustment inside a candidate; several candidates are Holm-adjusted among themselves on their
intersection-union p-values (the largest of their endpoints'). Regressions are called on the
candidates' endpoints by Holm's test of zero (two-sided) over all of them, so that an A/A
candidate is called a regression on some endpoint with probability at most alpha; a regression also
needs its point beyond the margin.

A candidate that does not ship either has a regression ("does not ship", naming the endpoint) or
lacks the evidence ("not decided", naming the endpoint whose interval crosses its margin).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from mxlab.analysis.stats import Estimate
from mxlab.analysis.verdicts import Hypothesis, Verdict, holm_levels, shift_direction
from mxlab.experiment.report_settings import MIN_PAIRED_SEEDS

DECISIONS: tuple[str, ...] = ("ships", "does not ship", "not decided")


@dataclass(frozen=True)
class CandidateDecision:
    """One candidate's decision, its reason, the one-sided level it was judged at and its endpoints'
    verdicts (interval: two-sided at 1 - 2 level, whose ends are the one-sided bounds)."""

    arm: str
    decision: str
    reason: str
    level: float  # one-sided alpha of each endpoint's test (Holm among candidates)
    p_value: float  # the intersection-union p-value: the largest endpoint p-value
    endpoints: list[Verdict]


def pass_p_value(e: Estimate, margin: float, worse_when: str) -> float:
    """One-sided p-value of 'worse by the margin or more' (for 'either': the larger of the two one-sided
    tests of |delta| >= margin); 1.0 without a finite se."""
    if e.n_seeds < 2 or not math.isfinite(e.se):
        return 1.0
    if e.se == 0:
        bad = abs(e.delta) if worse_when == "either" else e.delta * (1 if worse_when == "higher" else -1)
        return 0.0 if bad < margin else 1.0

    def one_sided(bad: float) -> float:
        return float(scipy_stats.t.sf((margin - bad) / e.se, e.df))

    if worse_when == "either":
        return max(one_sided(e.delta), one_sided(-e.delta))
    return one_sided(e.delta if worse_when == "higher" else -e.delta)


def _bad(h: Hypothesis) -> float:
    d = h.estimate.delta
    return abs(d) if h.worse_when == "either" else d if h.worse_when == "higher" else -d


def _verdict(h: Hypothesis, word: str, level: float, reason: str) -> Verdict:
    e = h.estimate
    low, high = e.interval(1 - 2 * level) if e.n_seeds >= 2 else (math.nan, math.nan)
    return Verdict(h.arm, h.metric, word, e.delta, low, high, 1 - 2 * level, e.p_value(), h.margin, e.n_seeds, reason)


def decide_candidates(
    endpoints: Mapping[str, Sequence[Hypothesis]], confidence: float = 0.95, correction: str = "holm"
) -> list[CandidateDecision]:
    """The decision per candidate (module docstring) from its endpoint hypotheses. Refuses a candidate
    without endpoints."""
    alpha = 1 - confidence
    for arm, hs in endpoints.items():
        if not hs:
            raise ValueError(f"candidate {arm!r} has no endpoint to judge")
    ready = [a for a, hs in endpoints.items() if all(h.estimate.n_seeds >= MIN_PAIRED_SEEDS for h in hs)]
    iut = {a: max(pass_p_value(h.estimate, h.margin, h.worse_when) for h in endpoints[a]) for a in ready}
    shipped, levels = holm_levels([iut[a] for a in ready], alpha, correction)
    ship = {a: (r, lv) for a, r, lv in zip(ready, shipped, levels)}
    tested = [h for a in ready for h in endpoints[a]]
    rejected, _ = holm_levels([h.estimate.p_value() for h in tested], alpha, correction)
    regression = {id(h) for h, r in zip(tested, rejected) if r and _bad(h) > h.margin}
    out = []
    for arm, hs in endpoints.items():
        if arm not in ship:
            lacking = [f"{h.metric} ({h.estimate.n_seeds})" for h in hs if h.estimate.n_seeds < MIN_PAIRED_SEEDS]
            verdicts = [_verdict(h, "inconclusive", alpha, "too few paired seeds") for h in hs]
            reason = f"too few paired seeds on {', '.join(lacking)}; a decision needs {MIN_PAIRED_SEEDS}"
            out.append(CandidateDecision(arm, "not decided", reason, alpha, math.nan, verdicts))
            continue
        passed, level = ship[arm]
        verdicts = []
        for h in hs:
            p = pass_p_value(h.estimate, h.margin, h.worse_when)
            if id(h) in regression:
                what = shift_direction(h.estimate.delta) if h.worse_when == "either" else "worse"
                word, why = (
                    "regression",
                    f"{what}: differs from zero (Holm over the candidates' endpoints), beyond the margin",
                )
            elif p <= level:
                word = "equivalent" if h.worse_when == "either" else "non-inferior"
                why = f"within the margin, one-sided p {p:.2g} <= {level:.3g}"
            else:
                word, why = "inconclusive", f"the interval crosses the margin (one-sided p {p:.2g} > {level:.3g})"
            verdicts.append(_verdict(h, word, level, why))
        regressed = [v for v in verdicts if v.verdict == "regression"]
        if passed:
            decision, reason = "ships", "every co-primary endpoint is within its margin"
        elif regressed:
            decision = "does not ship"
            reason = "regression on " + ", ".join(v.metric for v in regressed)
        else:
            decision = "not decided"
            reason = "not shown within the margin on " + ", ".join(
                v.metric for v in verdicts if v.verdict == "inconclusive"
            )
        out.append(CandidateDecision(arm, decision, reason, level, iut[arm], verdicts))
    return out
