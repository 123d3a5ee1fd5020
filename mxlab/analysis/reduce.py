"""Each finished run's eval.npz reduced to what the analysis needs, one seed per worker process.

`reduce_seed` returns, per run of a seed: its metrics (mxlab.metrics.evaluate_run), its per-user sums
per task (`RunSums`) and the DeLong comparison of each task with the seed's baseline run (whose
DeLong components are computed once per seed). Seeds are independent, so a large study (tens of runs
of a million impressions) is reduced by a pool of processes, a small one in this process; both call
`reduce_seed`, so they give the same bits.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mxlab import metrics
from mxlab.analysis.stats import DeLongResult, RunSums, delong_components, delong_from_components, delong_result

PAIRING_ARRAYS = ("click", "conversion", "user_id")  # what every run of a study must share, in the same order


def pairing_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The arrays every run of a study must share: PAIRING_ARRAYS, or the users and labels of independent tasks."""
    independent = metrics.independent_tasks(arrays)
    if independent:
        return ("user_id",) + tuple(f"{metrics.LABEL_PREFIX}{task}" for task in independent)
    return PAIRING_ARRAYS


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


def _reduce_run(
    path: Path, tasks: Sequence[str] | None = None
) -> tuple[dict, dict[str, RunSums], dict[str, tuple[np.ndarray, float, np.ndarray]]]:
    """(metrics, per-task RunSums, per-task (labels, AUC, DeLong components)) of one run's eval.npz (`tasks`: see
    mxlab.metrics.load_eval)."""
    arrays = metrics.load_eval(path, tasks)
    views = metrics.task_views(arrays)
    # one sort per task serves the metrics, the gAUC, the sums, the ECE bins and DeLong
    orders = {task: np.argsort(np.asarray(view.probs, dtype=np.float64), kind="stable") for task, view in views.items()}
    run_metrics = metrics.evaluate_run(arrays, orders=orders)
    index, n_users = user_indices(arrays["user_id"])
    sums, components = {}, {}
    for task, view in views.items():
        probs = np.asarray(view.probs, dtype=np.float64)
        auc_and_components = delong_components(view.labels, probs, orders[task])
        sums[task] = RunSums.build(
            view.labels,
            probs,
            index if view.mask is None else index[view.mask],
            n_users,
            order=orders[task],
            delong=auc_and_components,
        )
        components[task] = (view.labels, *auc_and_components)
    return run_metrics, sums, components


def reduce_seed(
    runs: Sequence[tuple[str, Path]], baseline: str | None = None, tasks: Sequence[str] | None = None
) -> list[RunReduction]:
    """Reduce the runs (label, eval.npz path) of one seed, each once, in order; with `baseline` (the label
    of the seed's baseline run among them), every other run also gets DeLong against it; `tasks`: those of an
    eval.npz without a tasks array (mxlab.metrics.load_eval). The runs must share the eval set
    (mxlab.analysis.compare checks it first). An error names the run."""
    reduced = {}
    for label, path in runs:
        try:
            reduced[label] = _reduce_run(path, tasks)
        except ValueError as error:
            raise ValueError(f"{label}: {error}") from error
    if baseline is not None and baseline not in reduced:
        raise ValueError(f"baseline run {baseline!r} is not among the seed's runs {sorted(reduced)}")
    out = []
    for label, (run_metrics, sums, components) in reduced.items():
        delong = {}
        if baseline is not None and label != baseline:
            for task, (labels, auc, component) in components.items():
                _, base_auc, base_component = reduced[baseline][2][task]
                delong[task] = delong_result(
                    *delong_from_components(labels, [auc, base_auc], [component, base_component]), 0.95
                )
        out.append(RunReduction(run_metrics, sums, delong))
    return out


Runs = Sequence[tuple[str, Path]]
Job = tuple[Runs, str | None] | tuple[Runs, str | None, Sequence[str] | None]  # reduce_seed's arguments


def _reduce_one(job: Job) -> list[RunReduction]:
    return reduce_seed(*job)


def reduce_runs(jobs: Sequence[Job], n_examples: int, workers: int | None = None) -> list[list[RunReduction]]:
    """`reduce_seed` of every (runs of a seed, baseline label or None[, tasks]), in order. `workers`: processes to use
    (default: every core, up to one per job, when runs x n_examples >= PARALLEL_MIN_EXAMPLES, else 1 =
    this process)."""
    runs = sum(len(job[0]) for job in jobs)
    if workers is None:
        workers = min(len(jobs), os.cpu_count() or 1) if runs * n_examples >= PARALLEL_MIN_EXAMPLES else 1
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(jobs) < 2:
        return [_reduce_one(job) for job in jobs]
    # fork: the workers need no import of the caller's main module (a script without a __main__ guard works)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        return list(pool.map(_reduce_one, jobs))
