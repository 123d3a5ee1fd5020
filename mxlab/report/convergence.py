"""The study design line, the convergence gate and the plateau rule of a report, from the held-out records of
metrics.jsonl.

With `[train] eval_every`, a run's metrics records every `eval_every` steps hold `heldout`: NE and
AUC of CTR and CTCVR (of each head of independent tasks) on a fixed slice of the eval set. The gate reads
the baseline arm's held-out NE: per seed the improvement between its last two evaluations (earlier minus
last; NE falls as a model learns). The baseline has **not plateaued** when the mean improvement over seeds exceeds
PLATEAU_FRACTION of the between-seed standard deviation of the last value (with one seed, or no
spread, RELATIVE_FALLBACK of the last value): training on would still move the baseline by more
than the seeds differ, so the deltas are measured on models still changing.

The plateau rule (`[report] plateau_window`, `plateau_tolerance`, declared before the runs) is judged seed by
seed on the phase before the rate decay: the baseline's steps up to `max_steps - lr_decay_steps` from scratch,
the warm-up runs in the fork design. A seed passes when the best held-out NE (each of GATE_METRICS) of that
phase's last `plateau_window` steps is at most `plateau_tolerance` (relative) below the best value before them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mxlab.analysis.study import fork_design
from mxlab.report.alerts import NOTE, WEAKENS, Alert
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


def plateau_phase(spec: Mapping[str, Any], baseline: str) -> tuple[str, int | None, str]:
    """(the arm whose runs the plateau rule reads, the last step of their phase before the decay or None for the
    whole run, the phase in words) of a study's recorded spec."""
    train = spec.get("train") or {}
    if fork_design(spec):
        return WARMUP_ARM, None, "the fork warm-ups"
    decay, steps = int(train.get("lr_decay_steps") or 0), int(train.get("max_steps") or 0)
    if decay and steps > decay:
        return baseline, steps - decay, f"{baseline} before its rate decay (steps 1-{steps - decay})"
    return baseline, None, baseline


def plateau_gain(points: list[tuple[int, dict[str, Any]]], metric: str, end: int | None, window: int) -> Any:
    """(relative improvement, first step, last step) of held-out `metric` over the last `window` steps up to
    `end` (module docstring), or None when the series has no evaluation `window` steps before its last."""
    values = [
        (step, float(h[metric])) for step, h in points if h.get(metric) is not None and (end is None or step <= end)
    ]
    if not values:
        return None
    last = values[-1][0]
    before = [v for step, v in values if step <= last - window]
    recent = [v for step, v in values if step > last - window]
    if not before or not recent or min(before) <= 0:
        return None
    return (min(before) - min(recent)) / min(before), last - window, last


def plateau_alert(series: Series, spec: Mapping[str, Any], baseline: str, window: int, tolerance: float) -> Any:
    """The plateau rule's line (module docstring): a warning naming each seed that failed it or could not be
    judged, or a note that every seed passed; None without a rule (window 0) or without held-out records."""
    arm, end, phase = plateau_phase(spec, baseline)
    seeds = series.get(arm, {})
    if not window or not seeds:
        return None
    failed, unjudged = [], []
    for seed, points in sorted(seeds.items()):
        for metric in GATE_METRICS:
            found = plateau_gain(points, metric, end, window)
            if found is None:
                unjudged.append(f"seed {seed} ({metric}: no evaluation {window} steps before its last)")
            elif found[0] > tolerance:
                failed.append(f"seed {seed} {metric} improved {found[0]:.3%} over steps {found[1]}-{found[2]}")
    rule = f"no new best held-out NE by more than {tolerance:.3%} in the last {window} steps of {phase}"
    if not failed and not unjudged:
        return Alert(NOTE, f"**Every seed passed the plateau rule** ({rule}).")
    when = (
        "when the arms started from them"
        if arm == WARMUP_ARM
        else "when the rate began to decay"
        if end is not None
        else "at their last evaluation"
    )
    return Alert(
        WEAKENS,
        f"**Not every seed passed the plateau rule** ({rule}): {'; '.join(failed + unjudged)}. "
        f"The deltas of those seeds are measured on models that were still finding better held-out NE {when}.",
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
