"""The stability endpoint of from-scratch studies: per arm the share of runs that diverged or got stuck,
against the baseline's by an exact test (docs/statistics.md, "Stability").

- **diverged**: the run's done.json says ``diverged`` (training stopped on a non-finite loss);
- **stuck**: a finished run whose final held-out CTR AUC (the eval set's) is at or below that of the
  no-history oracle on the same eval set (mxlab.data.oracles, recorded in study.json where the source knows
  the truth): the run never learned the user history. A study without that record uses a criterion
  relative to the baseline's runs: below their median minus STUCK_MADS times their median absolute
  deviation (floored at MAD_FLOOR, so that identical baseline runs do not call every slightly worse run
  stuck); it needs MIN_BASELINE_RUNS finished baseline runs, else only divergence counts.

Per arm, Fisher's exact test (one-sided: the arm fails more often than the baseline) of its failed and
healthy runs against the baseline's, Holm over the arms at 1 - confidence. Post-training arms (``post:``)
do not train and are left out; so are skipped and missing runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as scipy_stats

from mxlab.analysis.study import StudyData
from mxlab.analysis.verdicts import holm_levels

STUCK_MADS = 5.0
MAD_FLOOR = 1e-4
MIN_BASELINE_RUNS = 3


@dataclass(frozen=True)
class ArmStability:
    """One arm's runs that trained, those diverged and stuck (seeds), and the exact test against the baseline."""

    arm: str
    runs: int
    diverged: list[int] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)
    p_value: float = math.nan  # one-sided Fisher exact p (nan for the baseline)
    less_stable: bool = False  # Holm over the arms rejects

    @property
    def failed(self) -> int:
        return len(self.diverged) + len(self.stuck)

    @property
    def share(self) -> float:
        return self.failed / self.runs if self.runs else math.nan


def stuck_threshold(baseline_aucs: list[float]) -> float:
    """The CTR AUC below which a finished run is stuck (module docstring); nan with too few baseline runs."""
    values = np.array([v for v in baseline_aucs if math.isfinite(v)])
    if values.size < MIN_BASELINE_RUNS:
        return math.nan
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median)))
    return median - STUCK_MADS * max(mad, MAD_FLOOR)


def oracle_threshold(study: StudyData) -> float:
    """The no-history oracle's AUC of the study's first task on its eval set, from study.json; nan when not
    recorded (a source without known truth, or a study from before the record)."""
    value = ((study.spec.get("oracles") or {}).get("no_history") or {}).get(f"{study.tasks[0]}.auc")
    return float(value) if value is not None else math.nan


def stability(
    study: StudyData,
    run_metrics: Mapping[str, Mapping[int, Mapping[str, Mapping[str, float]]]],
    confidence: float = 0.95,
    correction: str = "holm",
) -> tuple[float, bool, list[ArmStability]]:
    """(the stuck threshold, whether it is the no-history oracle's AUC (else relative to the baseline's runs), per
    trained arm its ArmStability, the baseline first), on the AUC of the study's first task (CTR under ESMM).
    ``run_metrics``: arm -> seed -> task -> metrics (StudyInputs.run_metrics). Refuses an unknown correction."""

    task = study.tasks[0]  # CTR, or the first declared task

    def auc(arm: str, seed: int) -> float:
        return float(run_metrics.get(arm, {}).get(seed, {}).get(task, {}).get("auc", math.nan))

    base = study.baseline
    threshold = oracle_threshold(study)
    by_oracle = math.isfinite(threshold)
    if not by_oracle:
        finished = [auc(base, s) for s in study.seeds if study.runs[(base, s)].status == "finished"]
        threshold = stuck_threshold(finished)
    rows = []
    for arm in [base] + [a for a in study.arms if a != base and not a.startswith("post:")]:
        trained = [s for s in study.seeds if study.runs[(arm, s)].status in ("finished", "diverged")]
        diverged = [s for s in trained if study.runs[(arm, s)].status == "diverged"]
        stuck = [
            s
            for s in trained
            if s not in diverged and (auc(arm, s) <= threshold if by_oracle else auc(arm, s) < threshold)
        ]
        rows.append(ArmStability(arm, len(trained), diverged, stuck))
    baseline = rows[0]
    tested = []
    for row in rows[1:]:
        if row.runs and baseline.runs:
            table = [[row.failed, row.runs - row.failed], [baseline.failed, baseline.runs - baseline.failed]]
            tested.append((row, float(scipy_stats.fisher_exact(table, alternative="greater")[1])))
    rejected, _ = holm_levels([p for _, p in tested], 1 - confidence, correction)
    judged = {row.arm: (p, r) for (row, p), r in zip(tested, rejected)}
    out = [baseline]
    for row in rows[1:]:
        p, r = judged.get(row.arm, (math.nan, False))
        out.append(ArmStability(row.arm, row.runs, row.diverged, row.stuck, p, r))
    return threshold, by_oracle, out
