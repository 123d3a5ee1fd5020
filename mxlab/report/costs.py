"""What each arm's training cost in the study itself: step time and peak GPU memory, against the baseline's.

Read from the runs' done.json (`step_ms`, `peak_memory_bytes`, written by mxlab.experiment.train).
These are the study's own figures: with several runs sharing a device (`runs_per_device`) a run's
step time includes its neighbours' load, so they compare arms of one study; `mxlab bench step`
measures a step alone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mxlab.analysis.study import StudyData

GIB = 2**30


@dataclass(frozen=True)
class ArmCost:
    """Median over an arm's finished runs of their step time (ms) and peak memory (bytes); None where no run
    recorded it."""

    step_ms: float | None
    peak_memory_bytes: float | None


def arm_costs(study: StudyData) -> dict[str, ArmCost]:
    """{arm: ArmCost} over the finished runs of each arm; {} when no run recorded a step time."""
    costs = {}
    for arm in study.arms:
        runs = [study.runs[(arm, seed)] for seed in study.finished_seeds(arm)]
        step = [r.step_ms for r in runs if r.step_ms is not None]
        memory = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
        costs[arm] = ArmCost(statistics.median(step) if step else None, statistics.median(memory) if memory else None)
    return costs if any(c.step_ms is not None for c in costs.values()) else {}


def cost_cell(cost: ArmCost, baseline: ArmCost | None = None) -> str:
    """'2.41x (61.2 ms), 1.87x (3.10 GiB)': the arm against the baseline ('61.2 ms, 3.10 GiB' without one);
    '-' for a figure not recorded, 'no training step' for an arm without a timed step (a post-training arm)."""
    if cost.step_ms is None:
        return "no training step"
    baseline = baseline or ArmCost(None, None)

    def part(value: float | None, base: float | None, unit: str, scale: float) -> str:
        if value is None:
            return "-"
        figure = f"{value / scale:.3g} {unit}"
        return f"{value / base:.2f}x ({figure})" if base else figure

    step = part(cost.step_ms, baseline.step_ms, "ms", 1.0)
    return f"{step}, {part(cost.peak_memory_bytes, baseline.peak_memory_bytes, 'GiB', GIB)}"
