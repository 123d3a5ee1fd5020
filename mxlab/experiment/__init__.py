"""Experiments: spec loading and validation, the runner (arms x seeds, resume), the executors (local
worker processes, Ray tasks, data-parallel runs), training, evaluation and checkpoints.

Public entry points: `load_spec`, `run_study`, `sweep_layers`.
"""

from __future__ import annotations

from mxlab.experiment.overrides import parse_override
from mxlab.experiment.spec import ExperimentSpec, TrainConfig, load_spec

__all__ = ["ExperimentSpec", "TrainConfig", "load_spec", "parse_override", "run_study", "sweep_layers"]


def __getattr__(name: str):
    if name == "run_study":
        from mxlab.experiment.runner import run_study

        return run_study
    if name == "sweep_layers":
        from mxlab.experiment.sweep import sweep_layers

        return sweep_layers
    raise AttributeError(f"module 'mxlab.experiment' has no attribute {name!r}")
