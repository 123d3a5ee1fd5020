"""A larger study priced from a pilot (`mxlab power --plan SPEC --step-times BENCH.json`): the pilot's paired
spread carried to the plan under a stated assumption (its retraining sd times `spread_scale`; the eval sd
follows the eval set's size, `--eval-scale`), the plan's arms, candidates and report settings, and each run's
device-hours from the plan's step count times the step time `mxlab bench step --json` measured at the plan's
model and batch. The placebo arm trains the baseline's recipe, so it takes the baseline's step time; an arm
the bench did not time has no hours (named in the notes).
"""

from __future__ import annotations

import dataclasses
import json
import math
from os import PathLike
from pathlib import Path
from typing import Any

from mxlab.analysis.pilot import Pilot
from mxlab.analysis.power import NoiseModel
from mxlab.experiment.data_order import PLACEBO_ARM
from mxlab.experiment.spec import ExperimentSpec

MATCHED_MODEL_KEYS = ("dim", "layers", "heads", "max_history")


@dataclasses.dataclass(frozen=True)
class BenchedSteps:
    """`mxlab bench step --json`: ms per step per arm, the card, and the shape and data the times hold for."""

    ms_per_step: dict[str, float]
    device: str
    model: dict[str, Any]
    batch_size: int
    spec: str
    history_mean: float | None


def read_bench_steps(path: str | PathLike) -> BenchedSteps:
    """The step times of a `mxlab bench step --json` file. Refuses (ValueError) a file that is not one."""
    try:
        data = json.loads(Path(path).read_text())
        times = {str(a["arm"]): float(a["ms_per_step"]) for a in data["arms"] if a.get("ms_per_step")}
        model, batch = dict(data["model"]), int(data["batch_size"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"--step-times {str(path)!r} is not a `mxlab bench step --json` file ({error})") from None
    history = data.get("history") or {}
    return BenchedSteps(
        times, str(data.get("device", "unknown device")), model, batch, str(data.get("spec", "")), history.get("mean")
    )


def check_shape(plan: ExperimentSpec, bench: BenchedSteps) -> None:
    """Refuses (ValueError, naming each differing value) step times benched at another model or batch than
    the plan's."""
    differ = [
        f"model.{key} {bench.model.get(key)!r} (benched) vs {plan.model.get(key)!r} (plan)"
        for key in MATCHED_MODEL_KEYS
        if bench.model.get(key) != plan.model.get(key)
    ]
    if bench.batch_size != plan.train.batch_size:
        differ.append(f"train.batch_size {bench.batch_size} (benched) vs {plan.train.batch_size} (plan)")
    if differ:
        raise ValueError(
            "--step-times were measured at another shape than the plan's: "
            + "; ".join(differ)
            + "; bench the plan's shape with `mxlab bench step --spec PLAN --json FILE`"
        )


def plan_pilot(
    pilot: Pilot, plan: ExperimentSpec, bench: BenchedSteps, spread_scale: float = 1.0
) -> tuple[Pilot, list[str]]:
    """The pilot as the plan would see it, and notes on what the pricing assumed. Refuses (ValueError) a
    spread_scale <= 0, a plan without `train.max_steps`, a plan co-primary endpoint the pilot has no spread
    for (naming those it has), and what `check_shape` refuses."""
    if not spread_scale > 0:
        raise ValueError(f"--spread-scale must be > 0, got {spread_scale}")
    if not plan.train.max_steps:
        raise ValueError(f"the plan {plan.name!r} sets no train.max_steps: its runs' length, which prices them")
    missing = [m for m in plan.report.endpoints if m not in pilot.models]
    if missing:
        raise ValueError(
            f"the plan's co-primary endpoints {', '.join(missing)} have no spread in pilot {pilot.name!r}; "
            f"it has {', '.join(pilot.models)}"
        )
    check_shape(plan, bench)
    times = dict(bench.ms_per_step)
    if PLACEBO_ARM in plan.arms and PLACEBO_ARM not in times and plan.baseline in times:
        times[PLACEBO_ARM] = times[plan.baseline]
    fork_steps = plan.train.fork_steps if plan.train.fork_from else 0
    trained = plan.train.max_steps - fork_steps
    run_hours = {arm: trained * times[arm] / 3.6e6 for arm in plan.arms if arm in times}
    warmup = fork_steps * times.get(plan.train.fork_from, math.nan) / 3.6e6 if fork_steps else 0.0
    models = {
        m: NoiseModel(model.seed_sd * spread_scale, model.eval_sd, model.eval_shared)
        for m, model in pilot.models.items()
        if m in plan.report.endpoints
    }
    candidates = [a for a in plan.report.candidate if a in plan.arms]
    controls = [a for a in plan.report.controls if a in plan.arms]
    notes = [
        f"runs priced at {plan.train.max_steps} steps x the step times benched on {bench.device} "
        f"({bench.spec or 'a spec'}: model dim {bench.model.get('dim')}, batch {bench.batch_size}, histories up to "
        f"{bench.model.get('max_history')}, mean {bench.history_mean or math.nan:.0f}; "
        "one run alone on the card)",
        f"retraining sd = the pilot's x {spread_scale:g} (the stated assumption for the plan's model)",
    ]
    others = [
        f"{key} {bench.model[key]!r} (benched) vs {plan.model[key]!r} (plan)"
        for key in sorted(set(plan.model) & set(bench.model) - set(MATCHED_MODEL_KEYS) - {"size"})
        if bench.model[key] != plan.model[key]
    ]
    if others:
        notes.append("benched model differs from the plan's in " + "; ".join(others) + ": the hours are approximate")
    unbenched = [a for a in plan.arms if a not in times]
    if unbenched:
        notes.append(f"no step time benched for {', '.join(unbenched)}: their hours are not counted (n/a)")
    if PLACEBO_ARM in plan.arms and PLACEBO_ARM not in bench.ms_per_step and PLACEBO_ARM in times:
        notes.append(f"{PLACEBO_ARM} priced at {plan.baseline}'s step time (it trains the baseline's recipe)")
    priced = dataclasses.replace(
        pilot,
        name=plan.name,
        settings=plan.report,
        models=models,
        n_candidates=max(len(candidates), 1),
        arms=[plan.baseline] + (candidates or [a for a in plan.arms if a != plan.baseline][:1]) + controls,
        all_arms=list(plan.arms),
        run_hours=run_hours,
        warmup_hours=warmup,
        device=bench.device,
    )
    return priced, notes
