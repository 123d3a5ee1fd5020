"""Apply the pre-registered rule to a study's inputs: candidates, exploratory arms, controls, A/A.

Roles (docs/statistics.md): the ``candidate`` arms get the intersection-union decision
(mxlab.analysis.decision); the other arms are exploratory, one Holm family over their endpoints
(mxlab.analysis.verdicts); each declared control is judged in its own family, outside every other,
and reported as an assay check. Secondary metrics get unadjusted intervals and no verdict.
"""

from __future__ import annotations

import json
import math
from os import PathLike

import numpy as np

from mxlab.analysis.compare import ArmResult, Comparison, Detectable, Preregistration, StudyAnalysis, inputs_from_runs
from mxlab.analysis.decision import decide_candidates
from mxlab.analysis.sensitivity import smallest_margin, smallest_regression
from mxlab.analysis.stats import Estimate, SeedDeltas, estimate
from mxlab.analysis.study import StudyData, StudyInputs, inputs_from_summary, load_study
from mxlab.analysis.verdicts import Hypothesis, Verdict, decide
from mxlab.experiment.report_settings import (
    MIN_PAIRED_SEEDS,
    TRUTH_METRIC_KINDS,
    ReportSettings,
    metric_names,
    worse_when,
)

MAX_SEEDS_ADVISED = 64


def _comparison(v: Verdict, e: Estimate, d: SeedDeltas, role: str) -> Comparison:
    return Comparison(
        v.arm,
        v.metric,
        True,
        e.delta,
        d.per_seed,
        v.low,
        v.high,
        v.level,
        e.se,
        e.df,
        v.verdict,
        v.reason,
        v.margin,
        role,
    )


def rule_levels(settings: ReportSettings, n_candidates: int, n_exploratory: int) -> tuple[float, float, str]:
    """(one-sided non-inferiority alpha, two-sided regression alpha, a description) at the first Holm
    step of the rule that judges the endpoints: the candidates' when there are any, else the exploratory family's."""
    alpha, n_endpoints = 1 - settings.confidence, len(settings.endpoints)
    if n_candidates:
        return (
            alpha / n_candidates,
            alpha / (n_candidates * n_endpoints),
            f"candidate rule: non-inferiority one-sided at {alpha / n_candidates:.3g}, "
            f"regression at two-sided {alpha / (n_candidates * n_endpoints):.3g}",
        )
    m = max(n_exploratory * n_endpoints, 1)
    return alpha / (2 * m), alpha / m, f"exploratory family of {m}: two-sided intervals at {alpha / m:.3g}"


def detectable_effects(
    deltas: dict[tuple[str, str], SeedDeltas],
    settings: ReportSettings,
    pool: list[str],
    ni_alpha: float,
    reg_alpha: float,
) -> list[Detectable]:
    """Per endpoint: the smallest regression called one and the smallest margin shown (mxlab.analysis.sensitivity)
    with ``settings.power``, from the seed and shared eval variance averaged over the ``pool`` arms, and the
    seeds the endpoint's margin needs."""
    out = []
    for metric in settings.endpoints:
        paired = [d for (a, m), d in deltas.items() if m == metric and a in pool]
        found = [d for d in paired if len(d.per_seed) >= 2]
        margin, k = settings.margin(metric), max((len(d.per_seed) for d in paired), default=0)
        if not found:
            out.append(Detectable(metric, k, math.nan, margin, None))
            continue
        usable = [estimate(d) for d in found]
        seed_var = float(np.mean([e.seed_var for e in usable]))
        shared = float(np.mean([e.shared_eval_var for e in usable]))
        equivalence = worse_when(metric) == "either"

        def se(n: int, seed_var: float = seed_var, shared: float = shared) -> float:
            return math.sqrt(seed_var / n + shared)

        def shown(n: int, equivalence: bool = equivalence) -> float:
            return smallest_margin(se(n), n - 1, ni_alpha, settings.power, equivalence)

        low, high = MIN_PAIRED_SEEDS, MAX_SEEDS_ADVISED
        needed = None
        if shown(high) <= margin:
            while low < high:
                mid = (low + high) // 2
                low, high = (mid + 1, high) if shown(mid) > margin else (low, mid)
            needed = low
        at_k = k >= MIN_PAIRED_SEEDS
        out.append(
            Detectable(
                metric,
                k,
                smallest_regression(margin, se(k), k - 1, reg_alpha, settings.power) if at_k else math.nan,
                margin,
                needed,
                smallest_regression(margin, se(MIN_PAIRED_SEEDS), 2, reg_alpha, settings.power),
                shown(k) if at_k else math.nan,
            )
        )
    return out


def preregistration(study: StudyData, settings: ReportSettings) -> Preregistration:
    """The settings used against study.json's pre-registration record (``preregistered``)."""
    record = study.spec.get("preregistered")
    if not isinstance(record, dict) or "report" not in record:
        return Preregistration("not recorded", None, None, settings.digest())
    registered = ReportSettings.from_dict(record["report"], legacy=True, tasks=study.tasks)
    used, before = settings.to_dict(), registered.to_dict()
    changed = sorted(k for k in used if used[k] != before.get(k))
    status = "pre-registered" if not changed else "post hoc"
    return Preregistration(status, record["report"], record.get("sha256"), settings.digest(), changed)


def _assay(role: str, verdicts: list[Verdict]) -> str:
    flagged = [f"{v.metric} ({v.delta:+.3g})" for v in verdicts if v.verdict == "regression"]
    if role == "null":
        if flagged:
            return f"flags {', '.join(flagged)}: a null control must show nothing; the noise model or pipeline is wrong"
        return "shows nothing, as a null control must"
    if flagged:
        return f"its known cost is detected ({', '.join(flagged)}): the study can see a cost of that size"
    return "its known cost is not detected: the study is not sensitive enough to see even the positive control"


def conclude(study: StudyData, inputs: StudyInputs, settings: ReportSettings) -> StudyAnalysis:
    """The analysis of a study (module docstring). Refuses a primary truth metric (excess_ne) on a study
    without truth, and a candidate or control that is not an arm."""
    names = metric_names(study.tasks)
    if inputs.truth is None and inputs.deltas:
        lacking = [m for m in settings.primary if m.split(".", 1)[1] in TRUTH_METRIC_KINDS]
        if lacking:
            raise ValueError(
                f"primary metric(s) {lacking} need a source with truth; this study has none "
                f"(accepted here: {[m for m in names if m.split('.')[1] not in TRUTH_METRIC_KINDS]})"
            )
    settings.check_arms(study.arms, study.baseline)
    endpoints = [m for m in settings.endpoints if any(k[1] == m for k in inputs.deltas)]
    compared = [a for a in study.arms if a != study.baseline]
    candidates = [a for a in settings.candidate if any(k[0] == a for k in inputs.deltas)]
    controls = {a: r for a, r in settings.controls.items()}
    exploratory = [a for a in compared if a not in candidates and a not in controls]

    def hypotheses(arm: str) -> list[Hypothesis]:
        return [
            Hypothesis(arm, m, estimate(inputs.deltas[(arm, m)]), settings.margin(m), worse_when(m))
            for m in endpoints
            if (arm, m) in inputs.deltas
        ]

    comparisons: list[Comparison] = []

    def add(verdicts: list[Verdict], hs: list[Hypothesis], role: str) -> None:
        for h, v in zip(hs, verdicts):
            comparisons.append(_comparison(v, h.estimate, inputs.deltas[(h.arm, h.metric)], role))

    decisions = decide_candidates({a: hypotheses(a) for a in candidates}, settings.confidence, settings.correction)
    for decision in decisions:
        add(decision.endpoints, hypotheses(decision.arm), "candidate")
    family = [h for a in exploratory for h in hypotheses(a)]
    add(decide(family, settings.confidence, settings.correction), family, "exploratory")
    assays = {}
    for arm, role in controls.items():
        hs = hypotheses(arm)
        verdicts = decide(hs, settings.confidence, settings.correction)
        add(verdicts, hs, "control")
        assays[arm] = _assay(role, verdicts) if hs else "not run"
    for (arm, metric), d in inputs.deltas.items():
        if metric in endpoints:
            continue
        e = estimate(d)
        low, high = e.interval(settings.confidence)
        role = "candidate" if arm in candidates else "control" if arm in controls else "exploratory"
        comparisons.append(
            Comparison(
                arm, metric, False, e.delta, d.per_seed, low, high, settings.confidence, e.se, e.df, None,
                "secondary metric: unadjusted interval, no verdict", settings.margin(metric), role,
            )
        )  # fmt: skip
    order = {m: i for i, m in enumerate(endpoints + [m for m in names if m not in endpoints])}
    comparisons.sort(key=lambda c: (study.arms.index(c.arm), order[c.metric]))
    aa = []
    if not study.is_fork:  # a fork's disjoint pairs start from different warm-ups: no A/A; the placebo is its null
        aa_h = [
            Hypothesis("A/A", m, estimate(d), settings.margin(m), worse_when(m))
            for m, d in inputs.aa.items()
            if m in endpoints
        ]
        for h, v in zip(aa_h, decide(aa_h, settings.confidence, "none")):
            aa.append(_comparison(v, h.estimate, inputs.aa[h.metric], "A/A"))
    arms = {}
    for arm in compared:
        runs = {s: study.runs[(arm, s)] for s in study.seeds}
        paired = sorted(next((d.per_seed for (a, _), d in inputs.deltas.items() if a == arm), {}))
        arms[arm] = ArmResult(
            arm,
            paired,
            {s: r.diverged_at_step for s, r in runs.items() if r.status == "diverged"},
            [s for s, r in runs.items() if r.status == "missing"],
            {s: r.reason for s, r in runs.items() if r.status == "skipped"},
        )
    ni_alpha, reg_alpha, rule = rule_levels(settings, len(candidates), len(exploratory))
    pool = candidates or exploratory or compared
    detectable = [
        Detectable(**{**d.__dict__, "rule": rule})
        for d in detectable_effects(inputs.deltas, settings, pool, ni_alpha, reg_alpha)
        if d.metric in endpoints
    ]
    family_size = sum(1 for h in family if h.estimate.n_seeds >= MIN_PAIRED_SEEDS)
    return StudyAnalysis(
        study, settings, inputs, comparisons, aa, arms, detectable, family_size,
        decisions, controls, assays, preregistration(study, settings),
    )  # fmt: skip


def analyze_study(study_dir: str | PathLike | StudyData, settings: ReportSettings | None = None) -> StudyAnalysis:
    """Compare every arm with the baseline and decide (module docstring); reads files only. ``settings``
    replaces study.json's [report] settings (the report then says the verdicts are post hoc when they
    differ from the pre-registered ones). Without run folders, reads the comparisons back from
    summary.json. Refuses what load_study, inputs_from_runs, inputs_from_summary and conclude refuse."""
    study = study_dir if isinstance(study_dir, StudyData) else load_study(study_dir)
    if settings is None:
        settings = ReportSettings.from_dict(study.spec.get("report"), legacy=True, tasks=study.tasks)
    if study.has_runs:
        inputs = inputs_from_runs(study, metric_names(study.tasks))
    else:
        inputs = inputs_from_summary(json.loads((study.directory / "summary.json").read_text()), study.baseline)
    return conclude(study, inputs, settings)
