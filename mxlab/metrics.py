"""CTR/CVR evaluation metrics on one run's eval set (``eval.npz``).

Tasks (the ESMM decomposition):

- ``ctr``: click given impression, on all impressions, predictions ``p_ctr``.
- ``cvr``: conversion given click, on the clicked impressions only, predictions ``p_cvr``.
- ``ctcvr``: click and conversion given impression, on all impressions, predictions ``p_ctcvr``.

Independent tasks (mxlab.tasks, relation "independent"): task ``T`` on all impressions, labels ``label_T``,
predictions ``p_T``; the ``tasks`` array names them.

Conventions (the report prints :data:`METRIC_CONVENTIONS`):

- AUC is exact: the Mann-Whitney statistic from average (mid) ranks, so tied
  predictions count one half. O(n log n).
- Log loss is the mean binary cross-entropy in nats, with predictions clipped to
  ``[PROBABILITY_CLIP, 1 - PROBABILITY_CLIP]`` (1e-7) before the logarithm.
- NE (normalized entropy) is the log loss divided by the entropy of the eval set's
  own base rate ``p = mean(label)`` of that task, ``-(p ln p + (1 - p) ln(1 - p))``:
  the log loss of always predicting the base rate. NE < 1 beats that constant; lower is better.
- Calibration is ``sum(prediction) / sum(label)``; 1 is perfect, > 1 over-predicts.
- ECE: predictions sorted and cut into ``ECE_BINS`` (10) bins of equal count (ties are split
  by eval order), ``sum_b (n_b / n) |mean prediction_b - mean label_b|``.
- gAUC: the AUC within each user, averaged with weights equal to the user's number of
  impressions in that task; users whose impressions are all one class are skipped.
- Against the truth (synthetic data, when ``eval.npz`` has ``true_ctr`` and ``true_cvr``):
  ``mae_truth`` = mean |prediction - true probability| and ``calibration_truth`` =
  ``sum(prediction) / sum(true probability)``. The true CTCVR probability is
  ``true_ctr * true_cvr``; the true CVR is ``P(convert | click)``, compared on clicked impressions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike

import numpy as np

TASKS: tuple[str, ...] = ("ctr", "cvr", "ctcvr")
TASK_DESCRIPTIONS: dict[str, str] = {
    "ctr": "click given impression, on all impressions (p_ctr against click)",
    "cvr": "conversion given click, on clicked impressions only (p_cvr against conversion)",
    "ctcvr": "click and conversion given impression, on all impressions (p_ctcvr = p_ctr * p_cvr against conversion)",
}
PROBABILITY_CLIP = 1e-7
ECE_BINS = 10
EVAL_REQUIRED_KEYS: tuple[str, ...] = ("click", "conversion", "p_ctr", "p_cvr", "p_ctcvr", "user_id")
EVAL_TRUTH_KEYS: tuple[str, ...] = ("true_ctr", "true_cvr")
# Optional: the tasks the source labels (a click-only source writes ["ctr"]); absent = every task.
EVAL_TASKS_KEY = "tasks"
LABEL_PREFIX = "label_"  # the labels of an independent task T: label_T (predictions p_T)


def independent_tasks(eval_arrays: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The independent tasks of eval arrays: those of their ``tasks`` array with a ``label_T`` array."""
    named = np.asarray(eval_arrays.get(EVAL_TASKS_KEY, np.array([], dtype=str))).reshape(-1)
    return tuple(str(task) for task in named if f"{LABEL_PREFIX}{task}" in eval_arrays)


def conventions(tasks: tuple[str, ...] = TASKS) -> dict[str, str]:
    """:data:`METRIC_CONVENTIONS` with its "tasks" entry naming only `tasks` (every task when empty)."""
    named = [task for task in TASKS if task in tasks] or list(TASKS)
    described = [f"{task} {TASK_DESCRIPTIONS[task]}" for task in named]
    if any(task not in TASKS for task in tasks):
        described = [f"{task} on all impressions (p_{task} against {LABEL_PREFIX}{task})" for task in tasks]
    return {**METRIC_CONVENTIONS, "tasks": "; ".join(described)}


def tasks_of(has_conversion: bool) -> tuple[str, ...]:
    """The tasks a source labels: every task with conversion labels, CTR alone without them."""
    return TASKS if has_conversion else ("ctr",)


def eval_tasks(eval_arrays: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The tasks of loaded eval arrays: their ``tasks`` array, else every task. Refuses a ``tasks`` array that
    names an unknown task or lacks ctr, naming it and the accepted tasks."""
    if EVAL_TASKS_KEY not in eval_arrays:
        return TASKS
    named = tuple(str(task) for task in np.asarray(eval_arrays[EVAL_TASKS_KEY]).reshape(-1))
    independent = independent_tasks(eval_arrays)
    if independent and independent == named:
        return named
    if "ctr" not in named or any(task not in TASKS for task in named):
        raise ValueError(
            f"eval array 'tasks' is {list(named)}; accepted: ctr and any of {list(TASKS[1:])}, "
            f"or independent tasks T each with a {LABEL_PREFIX}T array"
        )
    return tuple(task for task in TASKS if task in named)


METRIC_CONVENTIONS: dict[str, str] = {
    "tasks": "ctr on all impressions (p_ctr vs click); cvr on clicked impressions only (p_cvr vs conversion); "
    "ctcvr on all impressions (p_ctcvr = p_ctr * p_cvr vs conversion)",
    "auc": "exact Mann-Whitney AUC with mid-ranks (a tie counts one half)",
    "log_loss": "mean binary cross-entropy in nats, predictions clipped to "
    f"[{PROBABILITY_CLIP:g}, 1 - {PROBABILITY_CLIP:g}]",
    "ne": "normalized entropy = log loss / entropy of the eval set's base rate for that task "
    "(the log loss of always predicting the base rate); lower is better, 1 = no better than the base rate",
    "calibration": "sum(prediction) / sum(label); 1 is perfect, above 1 over-predicts",
    "ece": f"expected calibration error over {ECE_BINS} equal-count bins of sorted predictions, weighted by bin size",
    "gauc": "per-user AUC weighted by the user's impressions; single-class users skipped "
    "(n/a when no user has both classes)",
    "mae_truth": "mean |prediction - true probability| (synthetic data only)",
    "calibration_truth": "sum(prediction) / sum(true probability) (synthetic data only)",
}


def _as_labels(labels: np.ndarray, name: str = "labels") -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {labels.shape}")
    as_float = labels.astype(np.float64)
    bad = (as_float != 0) & (as_float != 1)
    if bad.any():
        raise ValueError(f"{name} must be 0 or 1; found {int(bad.sum())} other values, e.g. {as_float[bad][0]!r}")
    return as_float


def _as_probabilities(probs: np.ndarray, n: int, name: str = "predictions") -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) like the labels, got {probs.shape}")
    bad = ~np.isfinite(probs) | (probs < 0) | (probs > 1)
    if bad.any():
        raise ValueError(
            f"{name} must be finite probabilities in [0, 1]; found {int(bad.sum())} others, e.g. {probs[bad][0]!r}"
        )
    return probs


def _require_both_classes(labels: np.ndarray, what: str) -> None:
    n_pos = int(labels.sum())
    if n_pos == 0 or n_pos == labels.size:
        raise ValueError(f"{what} is undefined with a single label class (n={labels.size}, positives={n_pos})")


def midranks_of_sorted(sorted_values: np.ndarray) -> np.ndarray:
    """1-based average ranks of an already sorted array (tied values share the mean of their ranks), O(n)."""
    n = sorted_values.size
    new_value = np.ones(n, dtype=bool)
    new_value[1:] = sorted_values[1:] != sorted_values[:-1]
    starts = np.flatnonzero(new_value)
    ends = np.append(starts[1:], n)
    return ((starts + ends + 1) / 2.0)[np.cumsum(new_value) - 1]


def _auc_of_sorted(labels_sorted: np.ndarray, scores_sorted: np.ndarray) -> float:
    ranks = midranks_of_sorted(scores_sorted)
    n_pos = labels_sorted.sum()
    n_neg = labels_sorted.size - n_pos
    return float((ranks[labels_sorted == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC with ties counted one half (mid-ranks), O(n log n).

    Refuses labels other than 0/1, non-finite scores and a single label class (ValueError).
    """
    y = _as_labels(labels)
    s = np.asarray(scores, dtype=np.float64)
    if s.shape != y.shape or not np.isfinite(s).all():
        raise ValueError(f"scores must be finite with shape {y.shape}, got shape {s.shape}")
    _require_both_classes(y, "AUC")
    order = np.argsort(s, kind="stable")
    return _auc_of_sorted(y[order], s[order])


def per_example_log_loss(labels: np.ndarray, probs: np.ndarray, clip: float = PROBABILITY_CLIP) -> np.ndarray:
    """Binary cross-entropy of each example in nats, predictions clipped to [clip, 1 - clip]."""
    if not 0 < clip < 0.5:
        raise ValueError(f"clip must be in (0, 0.5), got {clip!r}")
    y = _as_labels(labels)
    p = np.clip(_as_probabilities(probs, y.size), clip, 1 - clip)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def log_loss(labels: np.ndarray, probs: np.ndarray, clip: float = PROBABILITY_CLIP) -> float:
    """Mean binary cross-entropy in nats with clipped predictions (see :func:`per_example_log_loss`)."""
    return float(per_example_log_loss(labels, probs, clip).mean())


def base_rate_entropy(base_rate: float) -> float:
    """Entropy in nats of a Bernoulli(base_rate); refuses a base rate outside (0, 1)."""
    if not 0 < base_rate < 1:
        raise ValueError(f"base rate must be in (0, 1) for NE, got {base_rate!r}")
    return float(-(base_rate * np.log(base_rate) + (1 - base_rate) * np.log1p(-base_rate)))


def normalized_entropy(labels: np.ndarray, probs: np.ndarray, clip: float = PROBABILITY_CLIP) -> float:
    """NE: log loss / entropy of the labels' own base rate (lower is better; refuses a single class)."""
    y = _as_labels(labels)
    _require_both_classes(y, "NE")
    return log_loss(y, probs, clip) / base_rate_entropy(float(y.mean()))


def calibration(labels: np.ndarray, probs: np.ndarray) -> float:
    """sum(prediction) / sum(label); refuses a set without positives."""
    y = _as_labels(labels)
    p = _as_probabilities(probs, y.size)
    if y.sum() == 0:
        raise ValueError("calibration is undefined without positive labels")
    return float(p.sum() / y.sum())


@dataclass(frozen=True)
class ReliabilityBins:
    """Equal-count bins of sorted predictions: mean prediction, mean label and size of each bin."""

    mean_prediction: np.ndarray
    mean_label: np.ndarray
    count: np.ndarray


def equal_mass_bin_index(probs: np.ndarray, n_bins: int = ECE_BINS, order: np.ndarray | None = None) -> np.ndarray:
    """Bin index (0..n_bins-1) of each prediction for equal-count bins of the sorted predictions.

    Ties across a bin border are split by eval order (a stable sort; pass ``order``, the stable
    argsort of ``probs``, when it is already known). Refuses n_bins < 1 or more bins than predictions.
    """
    probs = np.asarray(probs)
    if not 1 <= n_bins <= probs.size:
        raise ValueError(f"n_bins must be in [1, {probs.size}] (the number of predictions), got {n_bins!r}")
    if order is None:
        order = np.argsort(probs, kind="stable")
    index = np.empty(probs.size, dtype=np.int64)
    # position k of the sorted order goes to bin floor(k * n_bins / n): sizes differ by at most one
    index[order] = (np.arange(probs.size, dtype=np.int64) * n_bins) // probs.size
    return index


def _reliability_of_sorted(labels_sorted: np.ndarray, probs_sorted: np.ndarray, n_bins: int) -> ReliabilityBins:
    n = probs_sorted.size
    if not 1 <= n_bins <= n:
        raise ValueError(f"n_bins must be in [1, {n}] (the number of predictions), got {n_bins!r}")
    index = (np.arange(n, dtype=np.int64) * n_bins) // n
    count = np.bincount(index, minlength=n_bins).astype(np.float64)
    return ReliabilityBins(
        mean_prediction=np.bincount(index, weights=probs_sorted, minlength=n_bins) / count,
        mean_label=np.bincount(index, weights=labels_sorted, minlength=n_bins) / count,
        count=count,
    )


def _ece_of_bins(bins: ReliabilityBins) -> float:
    return float(np.sum(bins.count / bins.count.sum() * np.abs(bins.mean_prediction - bins.mean_label)))


def reliability_bins(labels: np.ndarray, probs: np.ndarray, n_bins: int = ECE_BINS) -> ReliabilityBins:
    """Equal-count reliability bins (see :func:`equal_mass_bin_index`)."""
    y = _as_labels(labels)
    p = _as_probabilities(probs, y.size)
    order = np.argsort(p, kind="stable")
    return _reliability_of_sorted(y[order], p[order], n_bins)


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """ECE over equal-count bins: sum_b (n_b / n) |mean prediction_b - mean label_b|."""
    return _ece_of_bins(reliability_bins(labels, probs, n_bins))


def group_auc(
    labels: np.ndarray, scores: np.ndarray, user_id: np.ndarray, by_score: np.ndarray | None = None
) -> tuple[float, int]:
    """gAUC: per-user exact AUC weighted by the user's impressions, skipping single-class users.

    Returns (gAUC, number of users that entered it). Vectorized: two stable sorts (by score, then
    by user; `by_score`: the first, when known), no Python loop over users. Refuses data where no
    user has both classes.
    """
    y = _as_labels(labels)
    s = np.asarray(scores, dtype=np.float64)
    users = np.asarray(user_id)
    if s.shape != y.shape or users.shape != y.shape:
        raise ValueError(
            f"labels, scores and user_id must have the same shape; got {y.shape}, {s.shape}, {users.shape}"
        )
    if by_score is None:
        by_score = np.argsort(s, kind="stable")
    order = by_score[np.argsort(users[by_score], kind="stable")]  # by user, then by score
    s_sorted, y_sorted, u_sorted = s[order], y[order], users[order]
    n = y.size
    new_user = np.ones(n, dtype=bool)
    new_user[1:] = u_sorted[1:] != u_sorted[:-1]
    new_tie = new_user.copy()
    new_tie[1:] |= s_sorted[1:] != s_sorted[:-1]
    # mid-rank of each tie run within the whole array, then shifted to a within-user rank (1-based)
    tie_id = np.cumsum(new_tie) - 1
    tie_start = np.flatnonzero(new_tie)
    tie_end = np.append(tie_start[1:], n)
    mid_rank = ((tie_start + tie_end - 1) / 2.0)[tie_id]
    user_idx = np.cumsum(new_user) - 1
    user_start = np.flatnonzero(new_user)
    within_rank = mid_rank - user_start[user_idx] + 1
    n_users = user_start.size
    n_pos = np.bincount(user_idx, weights=y_sorted, minlength=n_users)
    n_all = np.bincount(user_idx, minlength=n_users).astype(np.float64)
    n_neg = n_all - n_pos
    rank_sum_pos = np.bincount(user_idx, weights=within_rank * y_sorted, minlength=n_users)
    usable = (n_pos > 0) & (n_neg > 0)
    if not usable.any():
        raise ValueError(f"gAUC is undefined: none of the {n_users} users has both classes")
    user_auc = (rank_sum_pos[usable] - n_pos[usable] * (n_pos[usable] + 1) / 2) / (n_pos[usable] * n_neg[usable])
    weights = n_all[usable]
    return float(np.sum(user_auc * weights) / weights.sum()), int(usable.sum())


def task_metrics(
    labels: np.ndarray,
    probs: np.ndarray,
    user_id: np.ndarray | None = None,
    true_probs: np.ndarray | None = None,
    *,
    n_bins: int = ECE_BINS,
    clip: float = PROBABILITY_CLIP,
    order: np.ndarray | None = None,
) -> dict[str, float]:
    """All metrics of one task: {n, positives, base_rate, auc, log_loss, ne, calibration, ece
    [, gauc, gauc_users] [, mae_truth, calibration_truth]}. gauc is NaN (gauc_users 0) when no
    user has both classes.

    Refuses non-binary labels, predictions outside [0, 1] or non-finite, mismatched shapes
    and a single label class (ValueError).
    """
    y = _as_labels(labels)
    p = _as_probabilities(probs, y.size)
    _require_both_classes(y, "task metrics (AUC, NE)")
    if order is None:  # else: the stable argsort of the predictions, already known
        order = np.argsort(p, kind="stable")
    y_sorted, p_sorted = y[order], p[order]
    mean_log_loss = log_loss(y, p, clip)
    out: dict[str, float] = {
        "n": float(y.size),
        "positives": float(y.sum()),
        "base_rate": float(y.mean()),
        "auc": _auc_of_sorted(y_sorted, p_sorted),
        "log_loss": mean_log_loss,
        "ne": mean_log_loss / base_rate_entropy(float(y.mean())),
        "calibration": calibration(y, p),
        "ece": _ece_of_bins(_reliability_of_sorted(y_sorted, p_sorted, n_bins)),
    }
    if user_id is not None:
        users = np.asarray(user_id)
        if users.shape != y.shape:
            raise ValueError(f"user_id must have shape {y.shape} like the labels, got {users.shape}")
        try:
            out["gauc"], used = group_auc(y, p, users, order)
        except ValueError:  # no user has both classes (few impressions per user): gAUC is undefined
            out["gauc"], used = math.nan, 0
        out["gauc_users"] = float(used)
    if true_probs is not None:
        truth = _as_probabilities(true_probs, y.size, "true probabilities")
        out["mae_truth"] = float(np.abs(p - truth).mean())
        out["calibration_truth"] = float(p.sum() / truth.sum())
    return out


@dataclass(frozen=True)
class TaskView:
    """The examples, labels, predictions and truth of one task of an eval set."""

    task: str
    mask: np.ndarray | None  # None = all impressions
    labels: np.ndarray
    probs: np.ndarray
    user_id: np.ndarray
    true_probs: np.ndarray | None


def load_eval(
    eval_npz: str | PathLike | Mapping[str, np.ndarray], tasks: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """The arrays of an eval.npz (a path or an already-loaded mapping), checked for the required keys
    (click, conversion, p_ctr, p_cvr, p_ctcvr, user_id; optional true_ctr, true_cvr) and equal lengths.
    ``tasks``: the tasks the arrays label when they hold no ``tasks`` array (an eval.npz written before the
    array was; a study's recorded source says them), added as that array unless it is every task; an array
    present wins. Refuses ``tasks`` as :func:`eval_tasks` refuses the array."""
    if isinstance(eval_npz, Mapping):
        arrays = {k: np.asarray(v) for k, v in eval_npz.items()}
    else:
        with np.load(eval_npz) as npz:
            arrays = {k: npz[k] for k in npz.files}
    if tasks is not None and EVAL_TASKS_KEY not in arrays and tuple(tasks) != TASKS:
        arrays[EVAL_TASKS_KEY] = np.array(list(tasks))
        eval_tasks(arrays)
    independent = independent_tasks(arrays)
    if independent:
        required = ("user_id",) + tuple(f"{prefix}{t}" for t in independent for prefix in (LABEL_PREFIX, "p_"))
        missing = [k for k in required if k not in arrays]
        if missing:
            raise ValueError(
                f"eval arrays lack {missing}; required for the tasks {list(independent)}: {list(required)}"
            )
        return _same_lengths(arrays, required, "user_id")
    missing = [k for k in EVAL_REQUIRED_KEYS if k not in arrays]
    if missing:
        raise ValueError(
            f"eval arrays lack {missing}; required: {list(EVAL_REQUIRED_KEYS)}, optional: {list(EVAL_TRUTH_KEYS)}"
        )
    has_truth = [k in arrays for k in EVAL_TRUTH_KEYS]
    if any(has_truth) and not all(has_truth):
        raise ValueError(f"eval arrays must have both or none of {list(EVAL_TRUTH_KEYS)}, got {sorted(arrays)}")
    return _same_lengths(arrays, EVAL_REQUIRED_KEYS + EVAL_TRUTH_KEYS, "click")


def _same_lengths(arrays: dict[str, np.ndarray], keys: Sequence[str], first: str) -> dict[str, np.ndarray]:
    """`arrays`, refused (ValueError) when one of `keys` has another shape than `first`, naming both."""
    n = arrays[first].shape
    for key in keys:
        if key in arrays and arrays[key].shape != n:
            raise ValueError(f"eval array {key!r} has shape {arrays[key].shape}, expected {n} like {first!r}")
    return arrays


def task_views(eval_arrays: Mapping[str, np.ndarray]) -> dict[str, TaskView]:
    """One :class:`TaskView` per task of loaded eval arrays (ctr, cvr on clicked impressions, ctcvr; only
    those of :func:`eval_tasks`; an independent task T: label_T against p_T on all impressions)."""
    independent = independent_tasks(eval_arrays)
    if independent:
        return {
            task: TaskView(
                task, None, eval_arrays[f"{LABEL_PREFIX}{task}"], eval_arrays[f"p_{task}"], eval_arrays["user_id"], None
            )
            for task in independent
        }
    click = eval_arrays["click"].astype(np.float64)
    conversion = eval_arrays["conversion"].astype(np.float64)
    if np.any(conversion > click):
        raise ValueError(
            f"{int(np.sum(conversion > click))} eval examples convert without a click; conversion must imply click"
        )
    users = eval_arrays["user_id"]
    has_truth = "true_ctr" in eval_arrays
    true_ctr = eval_arrays["true_ctr"].astype(np.float64) if has_truth else None
    true_cvr = eval_arrays["true_cvr"].astype(np.float64) if has_truth else None
    clicked = click == 1
    views = {
        "ctr": TaskView("ctr", None, click, eval_arrays["p_ctr"], users, true_ctr),
        "cvr": TaskView(
            "cvr",
            clicked,
            conversion[clicked],
            eval_arrays["p_cvr"][clicked],
            users[clicked],
            true_cvr[clicked] if has_truth else None,
        ),
        "ctcvr": TaskView(
            "ctcvr", None, conversion, eval_arrays["p_ctcvr"], users, true_ctr * true_cvr if has_truth else None
        ),
    }
    return {task: views[task] for task in eval_tasks(eval_arrays)}


def evaluate_run(
    eval_npz: str | PathLike | Mapping[str, np.ndarray],
    *,
    n_bins: int = ECE_BINS,
    orders: Mapping[str, np.ndarray] | None = None,
) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for each task (:func:`eval_tasks`) of one run's eval.npz (see :func:`task_metrics`;
    `orders`: per task the stable argsort of its predictions, when known).

    Refuses missing arrays, mismatched lengths, conversions without clicks and the errors of
    :func:`task_metrics`, naming the task.
    """
    arrays = load_eval(eval_npz)
    results: dict[str, dict[str, float]] = {}
    for task, view in task_views(arrays).items():
        try:
            results[task] = task_metrics(
                view.labels,
                view.probs,
                view.user_id,
                view.true_probs,
                n_bins=n_bins,
                order=orders.get(task) if orders else None,
            )
        except ValueError as error:
            raise ValueError(f"task {task!r}: {error}") from error
    return results


def truth_metrics(
    eval_npz: str | PathLike | Mapping[str, np.ndarray], *, n_bins: int = ECE_BINS
) -> dict[str, dict[str, float]]:
    """The ceiling: {task: metrics} of the true probabilities used as predictions. Refuses an eval set without truth."""
    arrays = load_eval(eval_npz)
    if "true_ctr" not in arrays:
        raise ValueError("eval arrays have no true_ctr/true_cvr; the truth ceiling needs synthetic data")
    true_ctr = arrays["true_ctr"].astype(np.float64)
    true_cvr = arrays["true_cvr"].astype(np.float64)
    as_predictions = dict(arrays, p_ctr=true_ctr, p_cvr=true_cvr, p_ctcvr=true_ctr * true_cvr)
    return evaluate_run(as_predictions, n_bins=n_bins)
