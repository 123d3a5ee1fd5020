"""Paired comparison of every arm of a study against its baseline arm, with uncertainty and verdicts.

Reads only the study folder (docs/INTERFACES.md): ``study.json`` and, per run,
``runs/ARM/seedK/{done.json, eval.npz}``. Nothing is retrained or re-evaluated.

For each task (ctr, cvr, ctcvr) and each compared metric, the delta of an arm against the
baseline is taken on the same seed (same init and data order) and the same eval examples:

- ``auc``: AUC_arm - AUC_base (worse when negative).
- ``ne_pct``: 100 * (NE_arm / NE_base - 1), in percent (worse when positive).
- ``calibration_error``: |cal_arm - 1| - |cal_base - 1| (worse when positive; the verdict metric).
- ``calibration``: cal_arm - cal_base, the raw shift (direction only, no verdict).
- ``ece``: ECE_arm - ECE_base (worse when positive).

Uncertainty, three ways:

(a) the mean over seeds with a Student-t interval (needs two or more paired seeds);
(b) a paired cluster bootstrap over eval examples: users are resampled with replacement and the
    same resample weights every run of the study, per seed and pooled (the mean delta over seeds
    under one resample); the interval is the delta +- z times the bootstrap standard deviation;
(c) a DeLong test of the AUC difference, per seed (fast DeLong, Sun and Xu 2014; it treats
    examples as independent, users are not clustered).

A verdict per arm, task and metric (regression / neutral / improvement): a regression needs the
interval to exclude zero on the bad side and the point delta to be worse than the threshold of
``study.json["report"]``; an improvement is the mirror image. With ``min_seeds_for_t`` or more
paired seeds the verdict rests on the t-interval over seeds (training noise and eval sampling);
with fewer it rests on the pooled bootstrap (eval sampling only), and the result says so.
Intervals are family-wise per arm by default (Bonferroni over the arm's 12 checks: 3 tasks x
AUC, NE, |calibration - 1|, ECE), so an arm equal to the baseline is flagged in about 5% of studies.
Diverged runs are listed and left out; an arm with a diverged run has the arm verdict "diverged".
The A/A comparison (the baseline's first seed against its other seeds) measures the noise floor.
"""
from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from os import PathLike
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import stats as scipy_stats

from mxlab import metrics

VERDICTS = ("regression", "neutral", "improvement")
RUN_STATUSES = ("finished", "diverged", "skipped", "missing")


@dataclass(frozen=True)
class ReportSettings:
    """Thresholds and uncertainty settings from ``study.json["report"]`` (all optional).

    ``ne_regression_pct``, ``auc_regression``, ``calibration_tolerance`` are the spec's keys;
    ``ece_regression``, ``confidence``, ``multiple_testing``, ``bootstrap_resamples``,
    ``bootstrap_seed`` and ``min_seeds_for_t`` are optional extensions with the defaults below.
    ``confidence`` is family-wise per arm by default: with ``multiple_testing = "bonferroni"``
    each of an arm's checks (3 tasks x 4 judged metrics) uses 1 - (1 - confidence) / 12, so an
    arm equal to the baseline is flagged in at most about 5% of studies.
    """

    ne_regression_pct: float = 0.02  # percent of the baseline's NE
    auc_regression: float = 0.001  # absolute AUC
    calibration_tolerance: float = 0.01  # absolute change of |calibration - 1|
    ece_regression: float = 0.001  # absolute ECE (probability units)
    confidence: float = 0.95
    multiple_testing: str = "bonferroni"  # "bonferroni" | "none"
    bootstrap_resamples: int = 200
    bootstrap_seed: int = 0
    min_seeds_for_t: int = 3

    @property
    def checks_per_arm(self) -> int:
        """Number of judged checks per arm: tasks x metrics with a worse direction."""
        return len(metrics.TASKS) * sum(1 for m in DELTA_METRICS if m.worse_when is not None)

    @property
    def interval_confidence(self) -> float:
        """Confidence of each interval: ``confidence`` itself, or with "bonferroni" the level that makes all
        checks of an arm hold together with probability ``confidence``."""
        if self.multiple_testing == "none":
            return self.confidence
        return 1 - (1 - self.confidence) / self.checks_per_arm

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> "ReportSettings":
        """Settings from a mapping; refuses unknown keys, wrong types and out-of-range values."""
        values = dict(values or {})
        accepted = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(accepted))
        if unknown:
            raise ValueError(f"unknown report setting(s) {unknown}; accepted: {sorted(accepted)}")
        clean: dict[str, Any] = {}
        for name, value in values.items():
            if name == "multiple_testing":
                if value not in ("bonferroni", "none"):
                    raise ValueError(f"report setting multiple_testing={value!r}; accepted: 'bonferroni', 'none'")
                clean[name] = value
                continue
            wanted = int if accepted[name].type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (wanted is int and not float(value).is_integer()):
                raise ValueError(f"report setting {name}={value!r} must be a{'n integer' if wanted is int else ' number'}")
            clean[name] = wanted(value)
        settings = cls(**clean)
        for name in ("ne_regression_pct", "auc_regression", "calibration_tolerance", "ece_regression"):
            if getattr(settings, name) < 0:
                raise ValueError(f"report setting {name}={getattr(settings, name)!r} must be >= 0")
        if not 0.5 <= settings.confidence < 1:
            raise ValueError(f"report setting confidence={settings.confidence!r} must be in [0.5, 1)")
        if settings.bootstrap_resamples < 10:
            raise ValueError(f"report setting bootstrap_resamples={settings.bootstrap_resamples!r} must be >= 10")
        if settings.min_seeds_for_t < 2:
            raise ValueError(f"report setting min_seeds_for_t={settings.min_seeds_for_t!r} must be >= 2")
        return settings


@dataclass(frozen=True)
class DeltaMetric:
    """A compared metric: how its delta is formed, which direction is worse, which threshold judges it."""

    name: str
    label: str
    worse_when: str | None  # "lower" | "higher" | None (shown, not judged)
    threshold_setting: str | None
    unit: str

    def threshold(self, settings: ReportSettings) -> float | None:
        return None if self.threshold_setting is None else float(getattr(settings, self.threshold_setting))


DELTA_METRICS: tuple[DeltaMetric, ...] = (
    DeltaMetric("auc", "AUC", "lower", "auc_regression", "AUC points"),
    DeltaMetric("ne_pct", "NE %", "higher", "ne_regression_pct", "% of baseline NE"),
    DeltaMetric("calibration_error", "|cal-1|", "higher", "calibration_tolerance", "change of |calibration - 1|"),
    DeltaMetric("calibration", "calibration", None, None, "calibration ratio"),
    DeltaMetric("ece", "ECE", "higher", "ece_regression", "probability"),
)
DELTA_METRIC_BY_NAME = {m.name: m for m in DELTA_METRICS}


def metric_deltas(arm: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """Deltas of one arm against the baseline from their metric values (scalars or arrays of
    bootstrap resamples) with keys auc, ne, calibration, ece: {auc, ne_pct, calibration_error, calibration, ece}."""
    return {
        "auc": arm["auc"] - base["auc"],
        "ne_pct": 100.0 * (arm["ne"] / base["ne"] - 1.0),
        "calibration_error": np.abs(arm["calibration"] - 1.0) - np.abs(base["calibration"] - 1.0),
        "calibration": arm["calibration"] - base["calibration"],
        "ece": arm["ece"] - base["ece"],
    }


def judge(delta: float, low: float, high: float, metric: DeltaMetric, threshold: float) -> str:
    """regression / improvement / neutral: the interval [low, high] must exclude zero on one side
    and the delta must pass the threshold on that side. Refuses a metric without a direction."""
    if metric.worse_when not in ("lower", "higher"):
        raise ValueError(f"metric {metric.name!r} has no worse direction; judged metrics: "
                         f"{[m.name for m in DELTA_METRICS if m.worse_when]}")
    sign = 1.0 if metric.worse_when == "higher" else -1.0
    bad, bad_low, bad_high = sign * delta, min(sign * low, sign * high), max(sign * low, sign * high)
    if bad_low > 0 and bad > threshold:
        return "regression"
    if bad_high < 0 and -bad > threshold:
        return "improvement"
    return "neutral"


# ----------------------------------------------------------------------------- study folder


@dataclass(frozen=True)
class RunStatus:
    """One run's state from its done.json: finished, diverged (with the step), skipped (its backend could
    not run there; `reason` says why) or missing (no done.json)."""

    arm: str
    seed: int
    status: str
    path: Path
    diverged_at_step: int | None = None
    steps: int | None = None
    wall_s: float | None = None
    reason: str | None = None
    skipped_steps: int | None = None


@dataclass
class StudyData:
    """A study folder: its resolved spec and the status of every arm x seed run."""

    directory: Path
    spec: dict[str, Any]
    name: str
    baseline: str
    arms: list[str]
    seeds: list[int]
    runs: dict[tuple[str, int], RunStatus]

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.directory / "runs" / arm / f"seed{seed}"

    def finished_seeds(self, arm: str) -> list[int]:
        return [s for s in self.seeds if self.runs[(arm, s)].status == "finished"]


def load_study(study_dir: str | PathLike) -> StudyData:
    """Read study.json and every run's done.json. Refuses a missing study.json, a spec without
    name/baseline/arms/seeds, a baseline that is not an arm, and an unknown done.json status."""
    directory = Path(study_dir)
    spec_path = directory / "study.json"
    if not spec_path.is_file():
        raise ValueError(f"{spec_path} does not exist; a study folder holds study.json and runs/ARM/seedK/")
    spec = json.loads(spec_path.read_text())
    missing = [k for k in ("name", "baseline", "arms", "seeds") if k not in spec]
    if missing:
        raise ValueError(f"{spec_path} lacks {missing}")
    arms, seeds = [str(a) for a in spec["arms"]], [int(s) for s in spec["seeds"]]
    if spec["baseline"] not in arms:
        raise ValueError(f"baseline {spec['baseline']!r} is not one of the arms {arms}")
    runs: dict[tuple[str, int], RunStatus] = {}
    for arm in arms:
        for seed in seeds:
            path = directory / "runs" / arm / f"seed{seed}"
            done_path = path / "done.json"
            if not done_path.is_file():
                runs[(arm, seed)] = RunStatus(arm, seed, "missing", path)
                continue
            done = json.loads(done_path.read_text())
            status = done.get("status")
            if status not in ("finished", "diverged", "skipped"):
                raise ValueError(f"{done_path}: status {status!r}; accepted: 'finished', 'diverged', 'skipped'")
            if status == "finished" and not (path / "eval.npz").is_file():
                raise ValueError(f"{path} is finished but has no eval.npz")
            runs[(arm, seed)] = RunStatus(arm, seed, status, path, done.get("diverged_at_step"), done.get("steps"), done.get("wall_s"),
                                          done.get("reason") if status == "skipped" else None, done.get("skipped_steps"))
    return StudyData(directory, spec, str(spec["name"]), str(spec["baseline"]), arms, seeds, runs)


# ----------------------------------------------------------------------------- DeLong


@dataclass(frozen=True)
class DeLongResult:
    """DeLong test of AUC_a - AUC_b on the same examples: delta, its standard error, z, two-sided p, interval."""

    auc_a: float
    auc_b: float
    delta: float
    se: float
    z: float
    p_value: float
    low: float
    high: float


def delong_components(labels: np.ndarray, scores: np.ndarray) -> tuple[float, np.ndarray]:
    """(AUC, structural component of every example in eval order), from one sort (Sun and Xu 2014).

    A positive's component is the fraction of negatives it outranks (ties half); a negative's is the
    fraction of positives that outrank it. Refuses fewer than two examples of either class."""
    y = np.asarray(labels, dtype=np.float64)
    positive = y == 1
    m, n = int(positive.sum()), int(y.size - positive.sum())
    if m < 2 or n < 2:
        raise ValueError(f"DeLong needs at least two positives and two negatives, got {m} and {n}")
    s = np.asarray(scores, dtype=np.float64)
    order = np.argsort(s, kind="stable")
    s_sorted, pos_sorted = s[order], positive[order]
    rank_all = metrics.midranks_of_sorted(s_sorted)
    component = np.empty(y.size)
    # midrank among all minus midrank within the own class = how many of the other class rank below (ties half)
    component[order[pos_sorted]] = (rank_all[pos_sorted] - metrics.midranks_of_sorted(s_sorted[pos_sorted])) / n
    component[order[~pos_sorted]] = 1.0 - (rank_all[~pos_sorted] - metrics.midranks_of_sorted(s_sorted[~pos_sorted])) / m
    auc = float(component[positive].mean())
    return auc, component


def _delong_from_components(labels: np.ndarray, aucs: list[float], components: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    positive = np.asarray(labels) == 1
    stacked = np.array(components)
    cov = (np.atleast_2d(np.cov(stacked[:, positive])) / positive.sum()
           + np.atleast_2d(np.cov(stacked[:, ~positive])) / (~positive).sum())
    return np.array(aucs), cov


def delong_covariance(labels: np.ndarray, scores: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Fast DeLong (Sun and Xu 2014): (AUCs (k,), covariance matrix (k, k)) of k score vectors on the
    same labelled examples, O(k n log n). Refuses fewer than two examples of either class."""
    parts = [delong_components(labels, s) for s in scores]
    return _delong_from_components(labels, [a for a, _ in parts], [c for _, c in parts])


def _delong_result(aucs: np.ndarray, cov: np.ndarray, confidence: float) -> DeLongResult:
    delta = float(aucs[0] - aucs[1])
    var = float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    se = math.sqrt(max(var, 0.0))
    if se == 0.0:
        z, p = (0.0, 1.0) if delta == 0 else (math.copysign(math.inf, delta), 0.0)
    else:
        z = delta / se
        p = float(2 * scipy_stats.norm.sf(abs(z)))
    q = float(scipy_stats.norm.ppf(0.5 + confidence / 2))
    return DeLongResult(float(aucs[0]), float(aucs[1]), delta, se, z, p, delta - q * se, delta + q * se)


def delong_test(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, confidence: float = 0.95) -> DeLongResult:
    """DeLong test of AUC(scores_a) - AUC(scores_b) on the same examples (see :func:`delong_covariance`)."""
    return _delong_result(*delong_covariance(labels, [scores_a, scores_b]), confidence)


# ----------------------------------------------------------------------------- bootstrap


@dataclass
class _SortedRun:
    """One run's predictions of one task, prepared for weighted metrics under many user resamples.

    Sums that are linear in the example weights (count, positives, log loss, predictions, ECE bin
    gaps) are pre-aggregated per user, so a resample costs a (R, n_users) matrix product; only the
    AUC needs the per-example weights, in prediction order.
    """

    negative_users: np.ndarray  # user index of each negative, in prediction order
    positive_users: np.ndarray  # user index of each positive, in prediction order
    negatives_before: np.ndarray  # for each positive: number of negatives ranked strictly below its tie run
    negatives_through: np.ndarray | None  # ... below or tied with it (None: no ties involve a positive)
    per_user: np.ndarray  # (n_users, 4): count, positives, sum of log loss, sum of predictions
    bin_gap_per_user: np.ndarray  # (n_users, n_bins): sum of (prediction - label) per user and ECE bin

    @classmethod
    def build(cls, labels: np.ndarray, probs: np.ndarray, user_index: np.ndarray, n_users: int, n_bins: int) -> "_SortedRun":
        order = np.argsort(probs, kind="stable")
        p_sorted, y_sorted, users_sorted = probs[order], labels[order], user_index[order]
        n = probs.size
        new_value = np.ones(n, dtype=bool)
        new_value[1:] = p_sorted[1:] != p_sorted[:-1]
        run_id = np.cumsum(new_value) - 1
        run_start = np.flatnonzero(new_value)
        run_end = np.append(run_start[1:], n)  # one past the last position of each tie run
        positive_positions = np.flatnonzero(y_sorted == 1)
        negative_positions = np.flatnonzero(y_sorted == 0)
        before = np.searchsorted(negative_positions, run_start[run_id[positive_positions]])
        through = np.searchsorted(negative_positions, run_end[run_id[positive_positions]])
        log_loss = metrics.per_example_log_loss(labels, probs)
        per_user = np.stack([
            np.bincount(user_index, minlength=n_users).astype(np.float64),
            np.bincount(user_index, weights=labels, minlength=n_users),
            np.bincount(user_index, weights=log_loss, minlength=n_users),
            np.bincount(user_index, weights=probs, minlength=n_users),
        ], axis=1)
        bin_index = metrics.equal_mass_bin_index(probs, n_bins, order)
        bin_gap = np.bincount(user_index * n_bins + bin_index, weights=probs - labels, minlength=n_users * n_bins)
        return cls(users_sorted[negative_positions], users_sorted[positive_positions], before,
                   None if np.array_equal(before, through) else through, per_user, bin_gap.reshape(n_users, n_bins))

    def weighted_metrics(self, counts: np.ndarray, counts_auc: np.ndarray) -> dict[str, np.ndarray]:
        """{auc, ne, calibration, ece}, each (R,), when user u has weight counts[r, u] in resample r
        (``counts_auc``: the same counts in the dtype used for the AUC's cumulative sums)."""
        total, positives, log_loss, predicted = (counts @ self.per_user).T
        rate = positives / total
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -(rate * np.log(rate) + (1 - rate) * np.log1p(-rate))
            ece = np.abs(counts @ self.bin_gap_per_user).sum(axis=1) / total
            # AUC: each positive earns the weight of the negatives ranked below it and half of those tied with it
            negative_weight = counts_auc[:, self.negative_users]
            cumulative = np.zeros((counts.shape[0], negative_weight.shape[1] + 1), dtype=counts_auc.dtype)
            np.cumsum(negative_weight, axis=1, out=cumulative[:, 1:])
            earned = cumulative[:, self.negatives_before]
            if self.negatives_through is not None:
                earned = 0.5 * (earned + cumulative[:, self.negatives_through])
            pair_weight = (counts_auc[:, self.positive_users] * earned).sum(axis=1, dtype=np.float64)
            auc = pair_weight / (positives * (total - positives))
            return {"auc": auc, "ne": (log_loss / total) / entropy, "calibration": predicted / positives, "ece": ece}


def _thread_map(function: Any, items: list[Any]) -> list[Any]:
    """function over items on a thread pool (numpy releases the GIL in sorts, gathers and cumulative sums)."""
    workers = min(len(items), os.cpu_count() or 1)
    if workers <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, items))


def user_resample_counts(n_users: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, n_users) counts: how often each user is drawn when n_users users are drawn with replacement."""
    draws = rng.integers(0, n_users, size=(n_resamples, n_users))
    draws += np.arange(n_resamples)[:, None] * n_users
    return np.bincount(draws.ravel(), minlength=n_resamples * n_users).reshape(n_resamples, n_users)


def bootstrap_run_metrics(
    labels: Mapping[str, np.ndarray],
    user_index: Mapping[str, np.ndarray],
    n_users: int,
    predictions: Mapping[Any, Mapping[str, np.ndarray]],
    *,
    n_resamples: int,
    seed: int,
    n_bins: int = metrics.ECE_BINS,
    chunk_elements: int = 4_000_000,
) -> dict[Any, dict[str, dict[str, np.ndarray]]]:
    """Cluster bootstrap of every run's metrics under the same user resamples.

    ``labels[task]`` and ``user_index[task]`` (0..n_users-1) describe each task's eval examples,
    ``predictions[run][task]`` each run's predictions on them. Returns
    ``{run: {task: {auc|ne|calibration|ece: (n_resamples,)}}}``: resample r weights every example
    by how often its user was drawn in resample r, identically for all runs and tasks, so deltas
    between runs are paired. ECE bins stay those of the original sample. Vectorized over chunks of
    resamples; refuses n_resamples < 1.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    rng = np.random.default_rng(seed)
    keys = [(run, task) for run, tasks in predictions.items() for task in tasks]
    built = _thread_map(lambda key: _SortedRun.build(np.asarray(labels[key[1]], dtype=np.float64),
                                                     np.asarray(predictions[key[0]][key[1]], dtype=np.float64),
                                                     user_index[key[1]], n_users, n_bins), keys)
    prepared: dict[Any, dict[str, _SortedRun]] = {run: {} for run in predictions}
    for (run, task), item in zip(keys, built):
        prepared[run][task] = item
    n_max = max(v.size for v in labels.values())
    chunk = max(1, min(n_resamples, chunk_elements // max(n_max, 1)))
    out: dict[Any, dict[str, dict[str, list[np.ndarray]]]] = {
        run: {task: {} for task in tasks} for run, tasks in predictions.items()
    }
    done = 0
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        counts = user_resample_counts(n_users, size, rng)
        # float32 cumulative weights stay exact integers below 2^24; larger eval sets use float64
        counts64, counts_auc = counts.astype(np.float64), counts.astype(np.float32 if n_max < 2**23 else np.float64)
        results = _thread_map(lambda key: prepared[key[0]][key[1]].weighted_metrics(counts64, counts_auc), keys)
        for (run, task), result in zip(keys, results):
            for name, values in result.items():
                out[run][task].setdefault(name, []).append(values)
        done += size
    return {run: {task: {k: np.concatenate(v) for k, v in t.items()} for task, t in tasks.items()} for run, tasks in out.items()}


# ----------------------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Interval:
    """A confidence interval and what it rests on."""

    low: float
    high: float
    method: str  # "t over seeds" | "bootstrap"
    n_seeds: int
    n_examples: int
    n_users: int
    n_resamples: int | None = None


@dataclass
class MetricComparison:
    """One arm against the baseline on one task and metric, over its paired seeds."""

    arm: str
    task: str
    metric: str
    delta: float  # mean over paired seeds
    per_seed: dict[int, float]
    t_interval: Interval | None
    bootstrap: Interval  # pooled over seeds
    bootstrap_per_seed: dict[int, Interval]
    verdict: str | None  # None for a metric without a direction
    basis: str  # "t over seeds" | "bootstrap"
    threshold: float | None

    @property
    def interval(self) -> Interval:
        """The interval the verdict rests on."""
        return self.t_interval if self.basis == "t over seeds" and self.t_interval is not None else self.bootstrap


@dataclass
class ArmResult:
    """An arm's overall verdict, its runs' states and a one-line conclusion."""

    arm: str
    verdict: str  # regression | neutral | improvement | diverged | skipped | not compared
    paired_seeds: list[int]
    diverged: dict[int, int | None]  # seed -> step
    missing: list[int]
    conclusion: str
    skipped: dict[int, str | None] = field(default_factory=dict)  # seed -> reason the backend could not run it


@dataclass
class StudyAnalysis:
    """Everything the report shows: per-run metrics, paired comparisons, DeLong tests, verdicts, noise floor."""

    study: StudyData
    settings: ReportSettings
    run_metrics: dict[str, dict[int, dict[str, dict[str, float]]]]
    comparisons: list[MetricComparison]
    delong: dict[tuple[str, str, int], DeLongResult]  # (arm, task, seed)
    arms: dict[str, ArmResult]
    noise_floor: list[MetricComparison]  # A/A: baseline's first finished seed vs its other seeds
    noise_floor_note: str
    truth: dict[str, dict[str, float]] | None
    n_examples: dict[str, int]
    n_users: int

    def comparison(self, arm: str, task: str, metric: str) -> MetricComparison | None:
        for c in self.comparisons:
            if (c.arm, c.task, c.metric) == (arm, task, metric):
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the report's summary.json)."""
        def comparison_dict(c: MetricComparison) -> dict[str, Any]:
            d = asdict(c)
            d["interval"] = asdict(c.interval)
            d["per_seed"] = {str(k): v for k, v in c.per_seed.items()}
            d["bootstrap_per_seed"] = {str(k): v for k, v in d["bootstrap_per_seed"].items()}
            return d

        return _json_ready({
            "name": self.study.name,
            "baseline": self.study.baseline,
            "arms": self.study.arms,
            "seeds": self.study.seeds,
            "settings": asdict(self.settings),
            "conventions": metrics.METRIC_CONVENTIONS,
            "n_eval_examples": self.n_examples,
            "n_eval_users": self.n_users,
            "runs": [
                {"arm": r.arm, "seed": r.seed, "status": r.status, "diverged_at_step": r.diverged_at_step,
                 "steps": r.steps, "wall_s": r.wall_s, "reason": r.reason, "skipped_steps": r.skipped_steps}
                for r in self.study.runs.values()
            ],
            "verdicts": {arm: asdict(result) for arm, result in self.arms.items()},
            "comparisons": [comparison_dict(c) for c in self.comparisons],
            "delong": [dict(arm=a, task=t, seed=s, **asdict(r)) for (a, t, s), r in self.delong.items()],
            "noise_floor": [comparison_dict(c) for c in self.noise_floor],
            "noise_floor_note": self.noise_floor_note,
            "run_metrics": {arm: {str(s): m for s, m in seeds.items()} for arm, seeds in self.run_metrics.items()},
            "truth": self.truth,
        })


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _bootstrap_interval(point: float, samples: np.ndarray, confidence: float) -> tuple[float, float]:
    """point +- z * (standard deviation of the bootstrap samples): stable at high confidence levels
    (Bonferroni) even with a few hundred resamples, where extreme percentiles are not."""
    finite = samples[np.isfinite(samples)]
    if finite.size < 2:
        return math.nan, math.nan
    half = float(scipy_stats.norm.ppf(0.5 + confidence / 2)) * float(np.std(finite, ddof=1))
    return point - half, point + half


def _t_interval(values: list[float], confidence: float) -> tuple[float, float]:
    k = len(values)
    mean = float(np.mean(values))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, k - 1)) * float(np.std(values, ddof=1)) / math.sqrt(k)
    return mean - half, mean + half


def _compare_pairs(
    name: str,
    pairs: dict[int, tuple[Any, Any]],  # seed label -> (arm run key, base run key)
    point: Mapping[Any, Mapping[str, Mapping[str, float]]],
    boot: Mapping[Any, Mapping[str, Mapping[str, np.ndarray]]],
    settings: ReportSettings,
    n_examples: Mapping[str, int],
    n_users: int,
) -> list[MetricComparison]:
    """Comparisons of one arm (or A/A) for every task and metric from point and bootstrap metrics."""
    out = []
    seeds = sorted(pairs)
    k = len(seeds)
    for task in metrics.TASKS:
        point_deltas = {s: metric_deltas(point[pairs[s][0]][task], point[pairs[s][1]][task]) for s in seeds}
        boot_deltas = {s: metric_deltas(boot[pairs[s][0]][task], boot[pairs[s][1]][task]) for s in seeds}
        for metric in DELTA_METRICS:
            per_seed = {s: float(point_deltas[s][metric.name]) for s in seeds}
            common = dict(n_examples=n_examples[task], n_users=n_users)
            per_seed_boot = {
                s: Interval(*_bootstrap_interval(per_seed[s], boot_deltas[s][metric.name], settings.interval_confidence),
                            "bootstrap", 1,
                            n_resamples=settings.bootstrap_resamples, **common)
                for s in seeds
            }
            pooled = np.mean([boot_deltas[s][metric.name] for s in seeds], axis=0)
            delta = float(np.mean(list(per_seed.values())))
            bootstrap = Interval(*_bootstrap_interval(delta, pooled, settings.interval_confidence), "bootstrap", k,
                                 n_resamples=settings.bootstrap_resamples, **common)
            t_interval = Interval(*_t_interval(list(per_seed.values()), settings.interval_confidence), "t over seeds", k, **common) if k >= 2 else None
            basis = "t over seeds" if k >= settings.min_seeds_for_t else "bootstrap"
            threshold = metric.threshold(settings)
            comparison = MetricComparison(name, task, metric.name, delta, per_seed, t_interval, bootstrap,
                                          per_seed_boot, None, basis, threshold)
            if metric.worse_when is not None:
                chosen = comparison.interval
                comparison.verdict = judge(delta, chosen.low, chosen.high, metric, threshold)
            out.append(comparison)
    return out


def _format_delta(c: MetricComparison) -> str:
    metric = DELTA_METRIC_BY_NAME[c.metric]
    unit = "%" if c.metric == "ne_pct" else ""
    i = c.interval
    return f"{c.task.upper()} {metric.label} {c.delta:+.4g}{unit} [{i.low:+.3g}, {i.high:+.3g}]"


def _arm_conclusion(arm: str, comps: list[MetricComparison], diverged: dict[int, int | None], paired: list[int],
                    missing: list[int], skipped: dict[int, str | None], unpaired_baseline: list[int],
                    noise: list[MetricComparison]) -> tuple[str, str]:
    judged = [c for c in comps if c.verdict is not None]
    regressions = [c for c in judged if c.verdict == "regression"]
    improvements = [c for c in judged if c.verdict == "improvement"]
    basis = judged[0].basis if judged else "bootstrap"
    basis_text = (f"{len(paired)} paired seed(s), t-interval over seeds" if basis == "t over seeds"
                  else f"{len(paired)} paired seed(s); verdicts rest on the user bootstrap over eval examples only "
                       "(too few seeds for a t-interval): " + ("compare with the noise floor" if noise else
                                                                "no A/A noise floor was measured either, so treat them as provisional"))
    parts = []
    if diverged:
        steps = ", ".join(f"seed {s} at step {step}" for s, step in diverged.items())
        parts.append(f"DIVERGED ({steps})")
    if skipped:
        reasons = sorted({reason or "no reason recorded" for reason in skipped.values()})
        parts.append(f"SKIPPED on seeds {sorted(skipped)} ({'; '.join(reasons)})")
    if unpaired_baseline:
        parts.append(f"baseline not finished on seeds {unpaired_baseline}, so those seeds are not compared")
    if not paired:
        verdict = "diverged" if diverged else "skipped" if skipped else "not compared"
        parts.append("no finished run paired with a finished baseline run; no deltas")
        return verdict, f"{arm}: " + "; ".join(parts) + "."
    noise_by_key = {(c.task, c.metric): c for c in noise}

    def within_noise(c: MetricComparison) -> bool:
        aa = noise_by_key.get((c.task, c.metric))
        return aa is not None and abs(c.delta) <= max(abs(v) for v in aa.per_seed.values())

    def listed(items: list[MetricComparison], limit: int = 3) -> str:
        ranked = sorted(items, key=lambda c: -abs(c.delta) / (c.threshold or 1.0))
        text = ", ".join(_format_delta(c) + (" (within the A/A noise floor)" if within_noise(c) else "") for c in ranked[:limit])
        return text + (f" and {len(ranked) - limit} more" if len(ranked) > limit else "")

    if regressions:
        parts.append(f"REGRESSION in {len(regressions)} of {len(judged)} checks: {listed(regressions)}")
    if improvements:
        parts.append(f"improves {len(improvements)} of {len(judged)} checks: {listed(improvements)}")
    if not regressions and not improvements:
        parts.append(f"neutral, no metric moved beyond its threshold with confidence (largest NE change: "
                     + _format_delta(max((c for c in judged if c.metric == "ne_pct"), key=lambda c: abs(c.delta))) + ")")
    verdict = "diverged" if diverged else "regression" if regressions else "improvement" if improvements else "neutral"
    if missing:
        parts.append(f"seeds {missing} not run yet")
    return verdict, f"{arm}: " + "; ".join(parts) + f" ({basis_text})."


def analyze_study(study_dir: str | PathLike | StudyData, *, n_resamples: int | None = None,
                  bootstrap_seed: int | None = None) -> StudyAnalysis:
    """Compare every arm with the baseline (see the module docstring); reads files only.

    ``n_resamples`` and ``bootstrap_seed`` override ``study.json["report"]``. Refuses a study folder
    that :func:`load_study` refuses, eval sets whose labels or users differ between runs (the
    pairing is broken) and the errors of :func:`mxlab.metrics.evaluate_run`.
    """
    study = study_dir if isinstance(study_dir, StudyData) else load_study(study_dir)
    settings = ReportSettings.from_dict(study.spec.get("report"))
    overrides = {k: v for k, v in (("bootstrap_resamples", n_resamples), ("bootstrap_seed", bootstrap_seed)) if v is not None}
    if overrides:
        settings = ReportSettings.from_dict({**asdict(settings), **overrides})

    finished = [(arm, s) for arm in study.arms for s in study.seeds if study.runs[(arm, s)].status == "finished"]
    arrays: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    reference: dict[str, np.ndarray] | None = None
    reference_key = None
    for key in finished:
        loaded = metrics.load_eval(study.run_dir(*key) / "eval.npz")
        if reference is None:
            reference, reference_key = loaded, key
        else:
            for name in ("click", "conversion", "user_id"):
                if not np.array_equal(loaded[name], reference[name]):
                    raise ValueError(f"eval.npz of {key[0]}/seed{key[1]} has different {name!r} from "
                                     f"{reference_key[0]}/seed{reference_key[1]}: runs must share the eval set, in the same order")
        arrays[key] = loaded

    def evaluate(key: tuple[str, int]) -> dict[str, dict[str, float]]:
        try:
            return metrics.evaluate_run(arrays[key])
        except ValueError as error:
            raise ValueError(f"{key[0]}/seed{key[1]}: {error}") from error

    run_metrics: dict[str, dict[int, dict[str, dict[str, float]]]] = {arm: {} for arm in study.arms}
    for (arm, seed), result in zip(arrays, _thread_map(evaluate, list(arrays))):
        run_metrics[arm][seed] = result

    base = study.baseline
    base_seeds = [s for s in study.seeds if (base, s) in arrays]
    truth_spec = study.spec.get("truth")
    truth = truth_spec if isinstance(truth_spec, dict) and truth_spec else (
        metrics.truth_metrics(reference) if reference is not None and "true_ctr" in reference else None)

    comparisons: list[MetricComparison] = []
    delong: dict[tuple[str, str, int], DeLongResult] = {}
    noise: list[MetricComparison] = []
    n_examples: dict[str, int] = {}
    n_users = 0
    if reference is not None:
        views = metrics.task_views(reference)
        _, user_index = np.unique(reference["user_id"], return_inverse=True)
        n_users = int(user_index.max()) + 1
        labels = {t: v.labels for t, v in views.items()}
        task_users = {t: (user_index if v.mask is None else user_index[v.mask]) for t, v in views.items()}
        n_examples = {t: int(v.labels.size) for t, v in views.items()}
        predictions = {key: {t: v.probs for t, v in metrics.task_views(a).items()} for key, a in arrays.items()}
        compared_keys = [k for k in arrays if k[0] == base or k[1] in base_seeds]
        boot = bootstrap_run_metrics(labels, task_users, n_users, {k: predictions[k] for k in compared_keys},
                                     n_resamples=settings.bootstrap_resamples, seed=settings.bootstrap_seed)
        point = {(arm, s): run_metrics[arm][s] for arm, s in compared_keys}
        component_keys = [(key, task) for key in compared_keys for task in metrics.TASKS]
        components = dict(zip(component_keys, _thread_map(
            lambda item: delong_components(labels[item[1]], predictions[item[0]][item[1]]), component_keys)))
        for arm in study.arms:
            if arm == base:
                continue
            paired = [s for s in base_seeds if (arm, s) in arrays]
            if paired:
                pairs = {s: ((arm, s), (base, s)) for s in paired}
                comparisons += _compare_pairs(arm, pairs, point, boot, settings, n_examples, n_users)
                for s in paired:
                    for task, y in labels.items():
                        (auc_arm, comp_arm), (auc_base, comp_base) = components[((arm, s), task)], components[((base, s), task)]
                        delong[(arm, task, s)] = _delong_result(
                            *_delong_from_components(y, [auc_arm, auc_base], [comp_arm, comp_base]), settings.interval_confidence)
        if len(base_seeds) >= 2:
            first = base_seeds[0]
            pairs = {s: ((base, s), (base, first)) for s in base_seeds[1:]}
            noise = _compare_pairs(f"A/A {base}", pairs, point, boot, settings, n_examples, n_users)
            noise_note = (f"A/A: {base} seed {first} against {base} seeds {base_seeds[1:]} (different init and data "
                          f"order, same eval set). Deltas here are training noise alone; a delta of an arm within "
                          f"this range is not distinguishable from reseeding.")
        else:
            noise_note = (f"No noise floor: the baseline {base!r} has {len(base_seeds)} finished seed(s); "
                          f"an A/A comparison needs at least two.")
    else:
        noise_note = "No finished runs: nothing to compare."

    arms: dict[str, ArmResult] = {}
    for arm in study.arms:
        if arm == base:
            continue
        diverged = {s: study.runs[(arm, s)].diverged_at_step for s in study.seeds if study.runs[(arm, s)].status == "diverged"}
        missing = [s for s in study.seeds if study.runs[(arm, s)].status == "missing"]
        skipped = {s: study.runs[(arm, s)].reason for s in study.seeds if study.runs[(arm, s)].status == "skipped"}
        paired = [s for s in base_seeds if (arm, s) in arrays]
        unpaired_baseline = [s for s in study.seeds if (arm, s) in arrays and s not in base_seeds]
        verdict, conclusion = _arm_conclusion(arm, [c for c in comparisons if c.arm == arm], diverged, paired, missing,
                                              skipped, unpaired_baseline, noise)
        arms[arm] = ArmResult(arm, verdict, paired, diverged, missing, conclusion, skipped)
    return StudyAnalysis(study, settings, run_metrics, comparisons, delong, arms, noise, noise_note, truth,
                         n_examples, n_users)
