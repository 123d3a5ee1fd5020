"""The study design line and the convergence gate of a report, from the held-out records of metrics.jsonl.

With `[train] eval_every`, a run's metrics records every `eval_every` steps hold `heldout`: NE and
AUC of CTR and CTCVR (of each head of independent tasks) on a fixed slice of the eval set. The gate reads
the baseline arm's held-out NE: per seed the improvement between its last two evaluations (earlier minus
last; NE falls as a model learns). The baseline has **not plateaued** when the mean improvement over seeds exceeds
PLATEAU_FRACTION of the between-seed standard deviation of the last value (with one seed, or no
spread, RELATIVE_FALLBACK of the last value): training on would still move the baseline by more
than the seeds differ, so the deltas are measured on models still changing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mxlab.report.runs import read_training_log

PLATEAU_FRACTION = 0.5
RELATIVE_FALLBACK = 0.001
GATE_METRICS = ("ctr.ne", "ctcvr.ne")
WARMUP_ARM = "_fork"  # the fork design's warm-up runs (runs/_fork/seedK)

Series = dict[str, dict[int, list[tuple[int, dict[str, Any]]]]]  # arm -> seed -> [(step, heldout record)]


def heldout_series(study: Any) -> Series:
    """{arm: {seed: [(step, heldout)]}} of every run with held-out records, the fork warm-ups as arm "_fork"."""
    arms = ([WARMUP_ARM] if (study.runs_root / WARMUP_ARM).is_dir() else []) + list(study.arms)
    series: Series = {}
    for arm in arms:
        for seed in study.seeds:
            points = [
                (int(r["step"]), r["heldout"])
                for r in read_training_log(study.run_dir(arm, seed))
                if isinstance(r.get("heldout"), Mapping)
            ]
            if points:
                series.setdefault(arm, {})[seed] = points
    return series


def convergence_warning(series: Series, baseline: str) -> str | None:
    """The report's top-line warning when the baseline's held-out NE has not plateaued (module docstring), else None."""
    findings = []
    recorded = {m for points in series.get(baseline, {}).values() for p in points for m in p[1] if m.endswith(".ne")}
    for metric in [m for m in GATE_METRICS if m in recorded] + sorted(recorded - set(GATE_METRICS)):
        last, gain = [], []
        for points in series.get(baseline, {}).values():
            values = [p[1].get(metric) for p in points]
            if len(values) >= 2 and values[-1] is not None and values[-2] is not None:
                last.append(float(values[-1]))
                gain.append(float(values[-2]) - float(values[-1]))
        if not gain:
            continue
        spread = float(np.std(last, ddof=1)) if len(last) > 1 else 0.0
        bound, what = (
            (PLATEAU_FRACTION * spread, f"{PLATEAU_FRACTION:g} x the between-seed SD {spread:.4g}")
            if spread > 0
            else (RELATIVE_FALLBACK * abs(float(np.mean(last))), f"{RELATIVE_FALLBACK:.1%} of its value")
        )
        mean_gain = float(np.mean(gain))
        if math.isfinite(mean_gain) and mean_gain > bound:
            findings.append(
                f"held-out {metric} still fell by {mean_gain:.4g} over its last evaluation interval "
                f"(mean over {len(gain)} seed(s); the plateau bound is {what})"
            )
    if not findings:
        return None
    return (
        f"**The baseline {baseline} has not converged**: "
        + "; ".join(findings)
        + ". The deltas are measured on models still learning; train longer (or fork later) before shipping on them."
    )


def design_text(spec: Mapping[str, Any]) -> str:
    """One sentence naming the study design recorded in study.json (from scratch when none is recorded)."""
    design = spec.get("design") or {"kind": "from-scratch"}
    post = [arm for arm in spec.get("arms", []) if str(arm).startswith("post:")]
    text = (
        "Design: **from scratch** (every run of a seed starts from the same initial weights)."
        if design.get("kind") != "fork"
        else f"Design: **fork**: per seed a warm-up run of **{design.get('from')}** trained "
        f"{design.get('warmup_steps')} steps "
        f"(runs/{WARMUP_ARM}/seedK); every arm continued from its weights and optimizer state on the same data stream, "
        f"so the arms of a seed differ by the recipe alone."
    )
    if post:
        text += (
            f" Post-training arm(s) {', '.join(post)}: the baseline's trained model of each seed evaluated under the "
            f"recipe, no training, so their delta is the recipe's forward numerics alone."
        )
    return text
