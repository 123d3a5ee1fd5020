"""What each arm's training cost in the study itself: step time and peak GPU memory, against the baseline's.

Read from the runs' done.json (`step_ms`, `peak_memory_bytes`, written by mxlab.experiment.train).
These are the study's own figures: with several runs sharing a device (`runs_per_device`) a run's
step time includes its neighbours' load, so they compare arms of one study; `mxlab bench step`
measures a step alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


def on_cpu(spec: Mapping[str, Any]) -> bool:
    """Whether study.json's environment says every run trained on the CPU (its `devices` are all 'cpu')."""
    devices = (spec.get("environment") or {}).get("devices") or []
    return bool(devices) and all(str(d).startswith("cpu") for d in devices)


def cost_header(spec: Mapping[str, Any], baseline: str) -> str:
    """The ship table's cost column header; on the CPU it says the step time measures the cost of emulating MX."""
    if on_cpu(spec):
        return f"step time on the CPU (x {baseline}; the cost of emulating MX, not MX hardware speed), peak memory"
    return f"step time, peak memory (x {baseline})"


def duration_text(ms: float) -> str:
    """A duration given in ms, in readable units: '850 us', '61.2 ms', '12.8 s', '3 min 20 s'."""
    if ms < 1:
        return f"{ms * 1000:.3g} us"
    if ms < 1000:
        return f"{ms:.3g} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def cost_cell(cost: ArmCost, baseline: ArmCost | None = None) -> str:
    """'2.41x (61.2 ms), 1.87x (3.10 GiB)': the arm against the baseline ('61.2 ms, 3.10 GiB' without one),
    step times in readable units (duration_text); '-' for a figure not recorded, 'no training step' for an arm
    without a timed step (a post-training arm)."""
    if cost.step_ms is None:
        return "no training step"
    baseline = baseline or ArmCost(None, None)

    def part(value: float | None, base: float | None, figure: str) -> str:
        if value is None:
            return "-"
        return f"{value / base:.2f}x ({figure})" if base else figure

    step = part(cost.step_ms, baseline.step_ms, duration_text(cost.step_ms))
    memory = cost.peak_memory_bytes
    return f"{step}, {part(memory, baseline.peak_memory_bytes, '' if memory is None else f'{memory / GIB:.3g} GiB')}"
