"""Each finished run's eval.npz reduced to what the analysis needs, one run per worker process.

`reduce_runs` returns, per (arm, seed): the run's metrics (mxlab.metrics.evaluate_run), its per-user
sums per task (`RunSums`) and the DeLong comparison of each task with the baseline run of its seed. A study's runs are independent,
so a large study (tens of runs of a million impressions) is reduced by a pool of processes; a small
one in this process. Both call `reduce_run`, so they give the same bits.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from mxlab import metrics
from mxlab.analysis.stats import DeLongResult, RunSums, delong_components, delong_from_components, delong_result

PAIRING_ARRAYS = ("click", "conversion", "user_id")  # what every run of a study must share, in the same order
PARALLEL_MIN_EXAMPLES = 4_000_000  # runs x eval examples from which a pool of processes pays for its start


@dataclass(frozen=True)
class RunReduction:
    """One run's reduced eval set (module docstring)."""

    metrics: dict[str, dict[str, float]]
    sums: dict[str, RunSums]
    delong: dict[str, DeLongResult]  # task -> this run against the baseline run of its seed; {} for none


def user_indices(user_id: np.ndarray) -> tuple[np.ndarray, int]:
    """(index of each example's user in 0..n_users-1, n_users), users numbered in sorted order."""
    _, index = np.unique(user_id, return_inverse=True)
    return index, int(index.max()) + 1 if index.size else 0


def reduce_run(eval_path: Path, baseline_path: Path | None = None) -> RunReduction:
    """Reduce the run whose eval.npz is `eval_path`; with `baseline_path`, also DeLong against that run.
    Refuses what metrics.evaluate_run refuses, and a baseline eval set with other labels or users."""
    arrays = metrics.load_eval(eval_path)
    base_views = None
    if baseline_path is not None:
        base = metrics.load_eval(baseline_path)
        for name in PAIRING_ARRAYS:
            if not np.array_equal(base[name], arrays[name]):
                raise ValueError(f"{eval_path} and {baseline_path} have different {name!r}: runs must share the eval set")
        base_views = metrics.task_views(base)
    run_metrics = metrics.evaluate_run(arrays)
    index, n_users = user_indices(arrays["user_id"])
    views = metrics.task_views(arrays)
    sums, delong = {}, {}
    for task, view in views.items():
        probs = np.asarray(view.probs, dtype=np.float64)
        order = np.argsort(probs, kind="stable")
        sums[task] = RunSums.build(view.labels, probs, index if view.mask is None else index[view.mask], n_users,
                                   order=order)
        if base_views is not None:
            components = delong_components(view.labels, probs, order)
            base_components = delong_components(view.labels, np.asarray(base_views[task].probs, dtype=np.float64))
            delong[task] = delong_result(*delong_from_components(view.labels, [components[0], base_components[0]],
                                                                 [components[1], base_components[1]]), 0.95)
    return RunReduction(run_metrics, sums, delong)


def _reduce_one(job: tuple[str, Path, Path | None]) -> RunReduction:
    label, eval_path, baseline_path = job
    try:
        return reduce_run(eval_path, baseline_path)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from error


def reduce_runs(jobs: Sequence[tuple[str, Path, Path | None]], n_examples: int, workers: int | None = None) -> list[RunReduction]:
    """`reduce_run` of every (run label, eval path, baseline eval path or None), in order; an error names
    the run. `workers`: processes to use
    (default: every core when len(jobs) x n_examples >= PARALLEL_MIN_EXAMPLES, else 1 = this process)."""
    if workers is None:
        workers = min(len(jobs), os.cpu_count() or 1) if len(jobs) * n_examples >= PARALLEL_MIN_EXAMPLES else 1
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(jobs) < 2:
        return [_reduce_one(job) for job in jobs]
    # fork: the workers need no import of the caller's main module (a script without a __main__ guard works)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        return list(pool.map(_reduce_one, jobs))
