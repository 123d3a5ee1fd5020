"""A pilot study read for sizing (`mxlab power --pilot`): the paired spread per co-primary endpoint and
the measured cost of a run.

The spread is the noise model of :func:`mxlab.analysis.power.fit_noise_model` (retraining variance,
per-seed eval variance and its shared part) fitted per endpoint on the pilot's candidates (else its
exploratory arms, else every compared arm), under the report settings the pilot was last judged by
(summary.json's, else study.json's). The cost of a run is its step count times its measured
median step time (done.json / summary.json ``steps`` and ``step_ms``); in a fork design an arm's
step numbers continue from the warm-up, so an arm trains ``steps - fork_steps`` steps and each seed
adds one warm-up of ``fork_steps`` steps at the ``fork_from`` arm's step time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import numpy as np

from mxlab.analysis.compare import inputs_from_runs
from mxlab.analysis.power import NoiseModel, fit_noise_model
from mxlab.analysis.study import StudyData, inputs_from_summary, load_study
from mxlab.experiment.report_settings import ReportSettings, metric_names


@dataclass(frozen=True)
class Pilot:
    """What sizing needs from a pilot: endpoint noise, settings, and GPU-hours per run of each arm."""

    name: str
    settings: ReportSettings
    models: dict[str, NoiseModel]  # co-primary endpoint -> noise of a per-seed delta
    pool: list[str]  # the arms the spread was fitted on
    n_seeds: int  # paired seeds of the pilot
    n_candidates: int  # the pre-registered candidates (at least 1 for the simulation)
    arms: list[str]  # the arms a study of the decision runs: baseline, candidates (else one arm), controls
    all_arms: list[str]
    run_hours: dict[str, float] = field(default_factory=dict)  # arm -> mean hours of one run (measured)
    warmup_hours: float = 0.0  # per seed, fork designs
    device: str = "unknown device"

    def hours(self, n_seeds: int, arms: list[str]) -> float:
        """Device-hours of ``n_seeds`` seeds of ``arms`` (nan when an arm's step time is not recorded)."""
        per_seed = sum(self.run_hours.get(a, math.nan) for a in arms) + self.warmup_hours
        return n_seeds * per_seed


def _study_and_inputs(path: Path):
    if path.is_file() and path.suffix == ".json":
        directory, summary = path.parent, path
    elif path.is_dir():
        directory, summary = path, None
    else:
        raise ValueError(f"pilot {str(path)!r} is neither a study folder nor a study's summary.json")
    study = load_study(directory)
    if summary is not None or not study.has_runs:
        summary = summary or directory / "summary.json"
        if not summary.is_file():
            raise ValueError(f"pilot {str(directory)!r} has no runs/ folder and no summary.json")
        inputs = inputs_from_summary(json.loads(summary.read_text()), study.baseline)
    else:
        inputs = inputs_from_runs(study, metric_names(study.tasks))
    return study, inputs


def _run_hours(study: StudyData) -> tuple[dict[str, float], float]:
    train = study.spec.get("train") or {}
    fork_steps = int(train.get("fork_steps") or 0) if train.get("fork_from") else 0
    hours: dict[str, list[float]] = {}
    for r in study.runs.values():
        if r.status in ("finished", "diverged") and r.steps and r.step_ms:
            trained = r.steps - fork_steps if r.steps > fork_steps else r.steps
            hours.setdefault(r.arm, []).append(trained * r.step_ms / 3.6e6)
    run_hours = {a: float(np.mean(h)) for a, h in hours.items()}
    warmup = 0.0
    if fork_steps:
        step_ms = [r.step_ms for r in study.runs.values() if r.arm == train["fork_from"] and r.step_ms]
        warmup = fork_steps * float(np.mean(step_ms)) / 3.6e6 if step_ms else math.nan
    return run_hours, warmup


def _settings(study: StudyData) -> ReportSettings:
    """The report settings the pilot was last judged by: summary.json's, else study.json's [report]."""
    summary = study.directory / "summary.json"
    if summary.is_file():
        try:
            return ReportSettings.from_dict(json.loads(summary.read_text())["settings"], legacy=True, tasks=study.tasks)
        except (KeyError, ValueError, TypeError):
            pass
    return ReportSettings.from_dict(study.spec.get("report"), legacy=True, tasks=study.tasks)


def read_pilot(path: str | PathLike) -> Pilot:
    """The pilot of a study folder or its summary.json. Refuses a path that is neither, a folder without
    study.json, and a pilot without an endpoint paired on two or more seeds (naming what it has)."""
    study, inputs = _study_and_inputs(Path(path))
    settings = _settings(study)
    compared = [a for a in study.arms if a != study.baseline]
    candidates = [a for a in settings.candidate if a in compared]
    exploratory = [a for a in compared if a not in candidates and a not in settings.controls]
    has = {a for a, _ in inputs.deltas}
    pool = (
        [a for a in candidates if a in has] or [a for a in exploratory if a in has] or [a for a in compared if a in has]
    )
    models, n_seeds = {}, 0
    for m in settings.endpoints:
        found = [inputs.deltas[(a, m)] for a in pool if (a, m) in inputs.deltas]
        if any(len(d.per_seed) >= 2 for d in found):
            models[m] = fit_noise_model(found)
            n_seeds = max(n_seeds, *(len(d.per_seed) for d in found))
    if not models:
        finished = sum(r.status == "finished" for r in study.runs.values())
        raise ValueError(
            f"pilot {str(path)!r} has no co-primary endpoint ({', '.join(settings.endpoints)}) paired on two or more "
            f"seeds ({finished} finished run(s)); accepted: a study whose arms and baseline finished on two or more "
            "of the same seeds"
        )
    run_hours, warmup = _run_hours(study)
    environment = study.spec.get("environment") or {}
    return Pilot(
        study.name,
        settings,
        models,
        pool,
        n_seeds,
        max(len(candidates), 1),
        [study.baseline] + (candidates or pool[:1]) + [a for a in settings.controls if a in compared],
        list(study.arms),
        run_hours,
        warmup,
        str(environment.get("device") or "unknown device"),
    )
