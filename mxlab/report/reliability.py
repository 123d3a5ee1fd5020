"""Reliability-diagram data of a study: equal-count bins per task and arm, pooled over its finished runs' eval.npz."""

from __future__ import annotations

import numpy as np

from mxlab import metrics
from mxlab.analysis import StudyAnalysis

RELIABILITY_BINS = 20
POSITIVES_PER_BIN = 15


def reliability_curves(analysis: StudyAnalysis) -> dict[str, dict[str, metrics.ReliabilityBins]]:
    """Equal-count reliability bins per task and arm, pooled over the arm's finished seeds (only the tasks the
    eval sets label)."""
    study = analysis.study
    curves: dict[str, dict[str, metrics.ReliabilityBins]] = {task: {} for task in study.tasks}
    for arm in study.arms:
        pooled: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {t: ([], []) for t in study.tasks}
        for seed in study.finished_seeds(arm):
            views = metrics.task_views(study.eval_arrays(arm, seed))
            for task, view in views.items():
                pooled[task][0].append(view.labels)
                pooled[task][1].append(np.asarray(view.probs, dtype=np.float64))
        for task, (labels, probs) in pooled.items():
            if labels:
                y, p = np.concatenate(labels), np.concatenate(probs)
                n_bins = reliability_bin_count(int(y.sum()) // len(labels), y.size)
                curves[task][arm] = metrics.reliability_bins(y, p, n_bins)
    return {task: by_arm for task, by_arm in curves.items() if by_arm}


def reliability_bin_count(positives_per_seed: int, n: int) -> int:
    """Bins for a reliability diagram: up to RELIABILITY_BINS, with about POSITIVES_PER_BIN positives of one
    seed's eval set in each (so few bins hold no positive at all), at least 3."""
    return int(min(n, max(3, min(RELIABILITY_BINS, positives_per_seed // POSITIVES_PER_BIN))))
