"""Every arm of a study against its baseline: the result types, the paired deltas from the run folders.

``analyze_study(DIR)`` reads the study folder (mxlab.analysis.study), forms for every arm, seed and
metric the paired delta and its per-user influence values (mxlab.analysis.stats), and applies the
decision (mxlab.analysis.conclude). A diverged or missing run drops its seed from that arm's pairs only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mxlab import metrics
from mxlab.analysis.decision import CandidateDecision
from mxlab.analysis.reduce import pairing_arrays, reduce_runs, user_indices
from mxlab.analysis.stats import SeedDeltas, eval_variances, paired_delta, truth_log_loss
from mxlab.analysis.study import StudyData, StudyInputs, disjoint_pairs
from mxlab.experiment.report_settings import TRUTH_METRIC_KINDS, ReportSettings
from mxlab.experiment.report_settings import worse_when as worse_when


@dataclass
class Comparison:
    """One arm (or the A/A control) against the baseline on one metric."""

    arm: str
    metric: str
    primary: bool  # a co-primary endpoint (a verdict word) or secondary
    delta: float
    per_seed: dict[int, float]
    low: float
    high: float
    level: float  # the interval's two-sided confidence
    se: float
    df: float
    verdict: str | None  # primary metrics only
    reason: str
    margin: float
    role: str = "exploratory"  # "candidate", "exploratory", "control" or "A/A"

    @property
    def median(self) -> float:
        """The median of the per-seed deltas (a robust location beside the mean)."""
        values = [v for v in self.per_seed.values() if math.isfinite(v)]
        return float(np.median(values)) if values else math.nan

    @property
    def sign_disagreements(self) -> int:
        """Seeds whose delta has the sign opposite to the mean's."""
        return sum(1 for v in self.per_seed.values() if v * self.delta < 0)


@dataclass
class ArmResult:
    """An arm's runs: the seeds paired with the baseline, and those diverged, missing or skipped."""

    arm: str
    paired_seeds: list[int]
    diverged: dict[int, int | None]
    missing: list[int]
    skipped: dict[int, str | None] = field(default_factory=dict)


@dataclass
class Detectable:
    """What the study can decide on one endpoint under the rule used (mxlab.analysis.sensitivity), with
    the settings' power: the smallest regression it calls one, the smallest margin it shows."""

    metric: str
    n_seeds: int
    effect: float  # smallest regression called a regression; nan when the seed variance is unknown
    margin: float
    seeds_needed: int | None  # seeds to show non-inferiority at the margin (None: more than 64, or unknown)
    effect_at_min_seeds: float = math.nan  # the smallest regression with MIN_PAIRED_SEEDS seeds
    smallest_margin: float = math.nan  # the smallest margin shown with the power when the true delta is 0
    rule: str = ""  # the levels it was computed at


@dataclass
class Preregistration:
    """The settings recorded when the study started against those used now."""

    status: str  # "pre-registered", "post hoc" or "not recorded"
    registered: dict[str, Any] | None
    registered_sha256: str | None
    used_sha256: str
    changed: list[str] = field(default_factory=list)  # settings that differ from the record


@dataclass
class StudyAnalysis:
    """The decision and everything behind it (the report's content)."""

    study: StudyData
    settings: ReportSettings
    inputs: StudyInputs
    comparisons: list[Comparison]
    aa: list[Comparison]
    arms: dict[str, ArmResult]
    detectable: list[Detectable]
    family_size: int
    decisions: list[CandidateDecision] = field(default_factory=list)
    controls: dict[str, str] = field(default_factory=dict)  # arm -> role
    assays: dict[str, str] = field(default_factory=dict)  # arm -> what the control shows
    preregistration: Preregistration | None = None

    def comparison(self, arm: str, metric: str) -> Comparison | None:
        """The comparison of an arm on a metric, or None."""
        return next((c for c in self.comparisons if c.arm == arm and c.metric == metric), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (summary.json): settings, verdicts, comparisons and the inputs that re-render it."""
        inputs = self.inputs

        def deltas(d: SeedDeltas, **key: Any) -> dict[str, Any]:
            return {
                **key,
                "per_seed": {str(s): v for s, v in d.per_seed.items()},
                "eval_var": d.eval_var,
                "eval_var_of_mean": d.eval_var_of_mean,
            }

        return _json_ready(
            {
                "name": self.study.name,
                "baseline": self.study.baseline,
                "arms": self.study.arms,
                "seeds": self.study.seeds,
                "settings": self.settings.to_dict(),
                "settings_sha256": self.settings.digest(),
                "preregistration": asdict(self.preregistration) if self.preregistration else None,
                "decisions": [asdict(d) for d in self.decisions],
                "controls": self.controls,
                "assays": self.assays,
                "family_size": self.family_size,
                "conventions": metrics.conventions(tuple(inputs.n_examples)),
                "n_eval_examples": inputs.n_examples,
                "n_eval_users": inputs.n_users,
                "runs": [
                    {
                        "arm": r.arm,
                        "seed": r.seed,
                        "status": r.status,
                        "diverged_at_step": r.diverged_at_step,
                        "steps": r.steps,
                        "wall_s": r.wall_s,
                        "reason": r.reason,
                        "skipped_steps": r.skipped_steps,
                        "step_ms": r.step_ms,
                        "peak_memory_bytes": r.peak_memory_bytes,
                    }
                    for r in self.study.runs.values()
                ],
                "verdicts": {
                    a: {c.metric: c.verdict for c in self.comparisons if c.arm == a and c.primary} for a in self.arms
                },
                "robust": [
                    dict(arm=c.arm, metric=c.metric, median=c.median, sign_disagreements=c.sign_disagreements)
                    for c in self.comparisons
                    if c.primary
                ],
                "comparisons": [asdict(c) for c in self.comparisons],
                "aa": [asdict(c) for c in self.aa],
                "detectable": [asdict(d) for d in self.detectable],
                "arm_runs": {a: asdict(r) for a, r in self.arms.items()},
                "run_metrics": {a: {str(s): m for s, m in seeds.items()} for a, seeds in inputs.run_metrics.items()},
                "truth": inputs.truth,
                "delong": [dict(arm=a, task=t, seed=s, **asdict(r)) for (a, t, s), r in inputs.delong.items()],
                "inputs": {
                    "deltas": [deltas(d, arm=a, metric=m) for (a, m), d in inputs.deltas.items()],
                    "aa": [deltas(d, metric=m) for m, d in inputs.aa.items()],
                    "aa_pairs": inputs.aa_pairs,
                    "notes": inputs.notes,
                },
            }
        )


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


# ----------------------------------------------------------------------------- inputs from the run folders


def inputs_from_runs(study: StudyData, metric_names: tuple[str, ...], workers: int | None = None) -> StudyInputs:
    """Per-seed deltas and their eval variances from every finished run's eval.npz (reduced by
    mxlab.analysis.reduce, `workers` processes; default by the study's size). Refuses eval sets whose
    labels or users differ between runs (the pairing is broken) and what metrics.evaluate_run refuses."""
    keys = [(arm, seed) for arm in study.arms for seed in study.finished_seeds(arm)]
    run_metrics: dict[str, dict[int, dict[str, dict[str, float]]]] = {arm: {} for arm in study.arms}
    if not keys:
        return StudyInputs(run_metrics, None, {}, {}, [], {}, {}, 0)
    base = study.baseline
    base_seeds = study.finished_seeds(base)
    reference_key = keys[0]
    reference = study.eval_arrays(*reference_key)
    for key in keys[1:]:
        with np.load(study.run_dir(*key) / "eval.npz", allow_pickle=False) as loaded:
            for name in pairing_arrays(reference):
                if not np.array_equal(loaded[name], reference[name]):
                    raise ValueError(
                        f"eval.npz of {key[0]}/seed{key[1]} has different {name!r} from {reference_key[0]}/"
                        f"seed{reference_key[1]}: runs must share the eval set, in the same order"
                    )
    seeds = sorted({seed for _, seed in keys})
    per_seed = [[key for key in keys if key[1] == seed] for seed in seeds]
    jobs = [
        (
            [(f"{arm}/seed{seed}", study.run_dir(arm, seed) / "eval.npz") for arm, seed in group],
            f"{base}/seed{group[0][1]}" if group[0][1] in base_seeds else None,
            study.tasks,
        )
        for group in per_seed
    ]
    reductions = reduce_runs(jobs, int(reference["user_id"].size), workers)
    reduced = {key: run for group, runs in zip(per_seed, reductions) for key, run in zip(group, runs)}
    for (arm, seed), run in reduced.items():
        run_metrics[arm][seed] = run.metrics
    truth = metrics.truth_metrics(reference) if "true_ctr" in reference else None
    user_index, n_users = user_indices(reference["user_id"])
    views = metrics.task_views(reference)
    task_users = {t: user_index if v.mask is None else user_index[v.mask] for t, v in views.items()}
    truth_loss = {
        t: truth_log_loss(v.labels, v.true_probs, task_users[t], n_users) if v.true_probs is not None else None
        for t, v in views.items()
    }
    sums = {key: run.sums for key, run in reduced.items()}
    usable = [
        m
        for m in metric_names
        if m.split(".", 1)[0] in views and (truth is not None or m.split(".", 1)[1] not in TRUTH_METRIC_KINDS)
    ]

    def seed_deltas(pairs: dict[int, tuple[tuple[str, int], tuple[str, int]]], metric: str) -> SeedDeltas:
        task, kind = metric.split(".", 1)
        per_seed, influence = {}, []
        for label, (arm_key, base_key) in pairs.items():
            delta, psi = paired_delta(kind, sums[arm_key][task], sums[base_key][task], truth_loss[task])
            per_seed[label] = delta
            influence.append(psi)
        eval_var, eval_var_of_mean = eval_variances(np.array(influence))
        return SeedDeltas(per_seed, eval_var, eval_var_of_mean)

    deltas: dict[tuple[str, str], SeedDeltas] = {}
    delong = {}
    for arm in study.arms:
        paired = [s for s in base_seeds if (arm, s) in reduced]
        if arm == base or not paired:
            continue
        for metric in usable:
            deltas[(arm, metric)] = seed_deltas({s: ((arm, s), (base, s)) for s in paired}, metric)
        for s in paired:
            for task, result in reduced[(arm, s)].delong.items():
                delong[(arm, task, s)] = result
    pairs = disjoint_pairs(base_seeds)
    aa = (
        {m: seed_deltas({i: ((base, b), (base, a)) for i, (a, b) in enumerate(pairs)}, m) for m in usable}
        if pairs
        else {}
    )
    n_examples = {t: int(v.labels.size) for t, v in views.items()}
    return StudyInputs(run_metrics, truth, deltas, aa, pairs, delong, n_examples, n_users)
