"""A study folder on disk (docs/INTERFACES.md): study.json, run statuses, eval arrays, or an earlier summary.

``mxlab report DIR`` reads ``study.json`` and, per run, ``runs/ARM/seedK/{done.json, eval.npz}``.
Where the run folders are gone (the committed example reports keep only their report files), the
comparisons are read back from ``summary.json``: the one written by this version holds the inputs
of the decision rule verbatim; one of an earlier version holds per-seed deltas and per-seed user
bootstrap intervals, from which the eval variances are recovered (see :func:`inputs_from_summary`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from mxlab import io, metrics
from mxlab.analysis.stats import DeLongResult, SeedDeltas
from mxlab.data import SOURCE_REGISTRY, source_tasks
from mxlab.experiment.artefacts import eval_problem
from mxlab.tasks import task_set

RUN_STATUSES = ("finished", "diverged", "skipped", "missing")
LEGACY_METRIC_KINDS = {"ne_pct": "ne", "auc": "auc", "calibration_error": "calibration_error", "ece": "ece"}


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
    step_ms: float | None = None  # median ms per training step (done.json; None before it was recorded)
    peak_memory_bytes: int | None = None  # peak GPU memory of the run's process (None on a CPU)
    trained_with: dict[str, Any] | None = (
        None  # {"code": {commit, dirty, source}, "device": name}; None before it was recorded
    )


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
    has_runs: bool = True  # False: no runs/ folder, statuses come from summary.json
    tasks: tuple[str, ...] = metrics.TASKS  # the tasks its recorded data source labels (recorded_tasks)
    runs_root: Path = Path()  # where the run folders are read (DIR/runs, or records unpacked elsewhere)

    def __post_init__(self) -> None:
        if self.runs_root == Path():
            self.runs_root = self.directory / "runs"

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.runs_root / arm / f"seed{seed}"

    def eval_arrays(self, arm: str, seed: int) -> dict[str, np.ndarray]:
        """A run's eval.npz (mxlab.metrics.load_eval), labelled with the study's tasks where it has no tasks array."""
        return metrics.load_eval(self.run_dir(arm, seed) / "eval.npz", self.tasks)

    def finished_seeds(self, arm: str) -> list[int]:
        return [s for s in self.seeds if self.runs[(arm, s)].status == "finished"]

    @property
    def is_fork(self) -> bool:
        """Whether the study ran the fork design (`fork_design` of its spec)."""
        return fork_design(self.spec)


def fork_design(spec: dict[str, Any]) -> bool:
    """Whether a study's recorded spec is of the fork design (its `design` says so, or `[train] fork_from` is set)."""
    return (spec.get("design") or {}).get("kind") == "fork" or bool((spec.get("train") or {}).get("fork_from"))


def recorded_tasks(spec: dict[str, Any]) -> tuple[str, ...]:
    """The tasks of the study recorded in study.json: its declared independent heads ([tasks], mxlab.tasks), else
    those its data source labels (mxlab.data.source_tasks; every task when no source is recorded). Refuses an
    unknown source or tasks table, naming it and the accepted ones."""
    declared = task_set(spec.get("tasks"))
    if declared.relation != "esmm":
        return declared.heads
    source = (spec.get("data") or {}).get("source")
    if source is None:
        return metrics.TASKS
    if not SOURCE_REGISTRY.is_known(source):
        raise ValueError(
            f"study.json records data source {source!r}; accepted: {', '.join(SOURCE_REGISTRY)} or 'pkg.module:attr'"
        )
    return source_tasks(source)


def load_study(study_dir: str | PathLike, runs_root: str | PathLike | None = None) -> StudyData:
    """Read study.json and every run's done.json from `runs_root` (default DIR/runs; without that folder: the
    run statuses of summary.json). Refuses a missing study.json, a spec without
    name/baseline/arms/seeds, a baseline that is not an arm, an unknown data source and an unknown done.json
    status."""
    directory = Path(study_dir)
    runs = Path(runs_root) if runs_root is not None else directory / "runs"
    spec_path = directory / "study.json"
    if not spec_path.is_file():
        raise ValueError(f"{spec_path} does not exist; a study folder holds study.json and runs/ARM/seedK/")
    spec = io.read_json(spec_path)
    missing = [k for k in ("name", "baseline", "arms", "seeds") if k not in spec]
    if missing:
        raise ValueError(f"{spec_path} lacks {missing}")
    arms, seeds = [str(a) for a in spec["arms"]], [int(s) for s in spec["seeds"]]
    if spec["baseline"] not in arms:
        raise ValueError(f"baseline {spec['baseline']!r} is not one of the arms {arms}")
    tasks = recorded_tasks(spec)
    statuses: dict[tuple[str, int], RunStatus] = {}

    def study(has_runs: bool) -> StudyData:
        name, baseline = str(spec["name"]), str(spec["baseline"])
        return StudyData(directory, spec, name, baseline, arms, seeds, statuses, has_runs, tasks=tasks, runs_root=runs)

    summary_path = directory / "summary.json"
    if not runs.is_dir() and summary_path.is_file():
        for r in json.loads(summary_path.read_text()).get("runs", []):
            path = runs / r["arm"] / f"seed{r['seed']}"
            statuses[(r["arm"], int(r["seed"]))] = RunStatus(
                r["arm"],
                int(r["seed"]),
                r["status"],
                path,
                r.get("diverged_at_step"),
                r.get("steps"),
                r.get("wall_s"),
                r.get("reason"),
                r.get("skipped_steps"),
                r.get("step_ms"),
                r.get("peak_memory_bytes"),
            )
        for arm in arms:
            for seed in seeds:
                statuses.setdefault((arm, seed), RunStatus(arm, seed, "missing", runs / arm / f"seed{seed}"))
        return study(has_runs=False)
    for arm in arms:
        for seed in seeds:
            path = runs / arm / f"seed{seed}"
            done_path = path / "done.json"
            if not done_path.is_file():
                statuses[(arm, seed)] = RunStatus(arm, seed, "missing", path)
                continue
            done = io.read_json(done_path)
            status = done.get("status")
            if status == "failed":  # a crash recorded for --resume: no result to read, as if it never ran
                statuses[(arm, seed)] = RunStatus(arm, seed, "missing", path, reason=done.get("reason"))
                continue
            if status not in ("finished", "diverged", "skipped"):
                raise ValueError(f"{done_path}: status {status!r}; accepted: 'finished', 'diverged', 'skipped'")
            problem = eval_problem(path / "eval.npz") if status == "finished" else None
            if problem:
                raise ValueError(f"{problem}; `mxlab run SPEC --resume --out {directory}` evaluates that run again")
            statuses[(arm, seed)] = RunStatus(
                arm,
                seed,
                status,
                path,
                done.get("diverged_at_step"),
                done.get("steps"),
                done.get("wall_s"),
                done.get("reason") if status == "skipped" else None,
                done.get("skipped_steps"),
                done.get("step_ms"),
                done.get("peak_memory_bytes"),
                done.get("trained_with"),
            )
    return study(has_runs=True)


@dataclass
class StudyInputs:
    """Everything the decision rule and the report need, however it was obtained.

    ``deltas[(arm, metric)]``: the arm's paired deltas; ``aa[metric]``: the baseline against itself on
    disjoint pairs of seeds ``aa_pairs`` (pair index -> delta); ``source`` is "runs" or "summary"."""

    run_metrics: dict[str, dict[int, dict[str, dict[str, float]]]]
    truth: dict[str, dict[str, float]] | None
    deltas: dict[tuple[str, str], SeedDeltas]
    aa: dict[str, SeedDeltas]
    aa_pairs: list[tuple[int, int]]
    delong: dict[tuple[str, str, int], DeLongResult]
    n_examples: dict[str, int]
    n_users: int
    source: str = "runs"
    notes: list[str] = field(default_factory=list)


def disjoint_pairs(seeds: list[int]) -> list[tuple[int, int]]:
    """Consecutive disjoint pairs (s0, s1), (s2, s3), ... of a seed list: each seed in at most one pair."""
    return [(seeds[i], seeds[i + 1]) for i in range(0, len(seeds) - 1, 2)]


def _seed_deltas(d: dict[str, Any]) -> SeedDeltas:
    return SeedDeltas(
        {int(k): float(v) for k, v in d["per_seed"].items()}, float(d["eval_var"]), float(d["eval_var_of_mean"])
    )


def _point(values: dict[str, float], base: dict[str, float], kind: str, truth: dict[str, float] | None) -> float:
    if kind == "ne":
        return 100.0 * (values["ne"] / base["ne"] - 1.0)
    if kind == "excess_ne":
        return 100.0 * (values["ne"] - base["ne"]) / (base["ne"] - truth["ne"])
    if kind == "calibration_error":
        return abs(values["calibration"] - 1) - abs(base["calibration"] - 1)
    if kind == "calibration":
        return 100.0 * math.log(values["calibration"] / base["calibration"])
    return values[kind] - base[kind]


CALIBRATION_NOTE = (
    "The calibration shifts are read back from a summary.json written before they were recorded: per-seed "
    "shifts from each run's calibration (sum p / sum y, exact), their eval-sampling variance approximated from "
    "the calibration error's (divided by the baseline's calibration squared; an overestimate where a run's "
    "calibration lies on the other side of 1 from the baseline's)."
)


def _add_calibration_shifts(
    deltas: dict[tuple[str, str], SeedDeltas], run_metrics: dict[str, dict[int, Any]], baseline: str
) -> bool:
    """Add TASK.calibration (100 ln(cal_arm / cal_base) per seed) where a summary lacks it; True if any was added."""
    added = False
    for (arm, metric), d in list(deltas.items()):
        task, kind = metric.split(".", 1)
        if kind != "calibration_error" or (arm, f"{task}.calibration") in deltas:
            continue
        base, runs = run_metrics.get(baseline, {}), run_metrics.get(arm, {})
        seeds = [s for s in d.per_seed if s in base and s in runs and task in runs[s]]
        if not seeds:
            continue
        shift = {s: 100.0 * math.log(runs[s][task]["calibration"] / base[s][task]["calibration"]) for s in seeds}
        scale = 1e4 / float(np.mean([base[s][task]["calibration"] for s in seeds])) ** 2
        deltas[(arm, f"{task}.calibration")] = SeedDeltas(shift, d.eval_var * scale, d.eval_var_of_mean * scale)
        added = True
    return added


def inputs_from_summary(summary: dict[str, Any], baseline: str) -> StudyInputs:
    """StudyInputs from a summary.json. This version's summary carries them under "inputs"; an earlier
    version's gives, per arm, task and metric, per-seed deltas and user-bootstrap intervals at the
    level ``z`` of its settings: eval variance of seed s = ((high - low) / 2z)^2, of the mean = that of
    the pooled bootstrap. There, excess NE takes the NE eval variance scaled by NE_base / (NE_base - NE_truth)
    (the truth's own sampling term is left out) and the A/A eval variance is the old noise floor's.
    Refuses a summary with neither form."""
    run_metrics = {arm: {int(s): m for s, m in seeds.items()} for arm, seeds in summary.get("run_metrics", {}).items()}
    truth = summary.get("truth") or None
    delong = {
        (d["arm"], d["task"], int(d["seed"])): DeLongResult(*(d[k] for k in DeLongResult.__dataclass_fields__))
        for d in summary.get("delong", [])
    }
    n_examples = {k: int(v) for k, v in (summary.get("n_eval_examples") or {}).items()}
    n_users = int(summary.get("n_eval_users") or 0)
    if "inputs" in summary:
        raw = summary["inputs"]
        deltas = {(d["arm"], d["metric"]): _seed_deltas(d) for d in raw["deltas"]}
        aa = {d["metric"]: _seed_deltas(d) for d in raw["aa"]}
        notes = [n for n in raw.get("notes", []) if not n.startswith(CALIBRATION_NOTE[:40])]
        approximated = len(notes) < len(raw.get("notes", []))  # shifts approximated when an earlier render read them
        if _add_calibration_shifts(deltas, run_metrics, baseline) or approximated:
            notes.append(CALIBRATION_NOTE)  # the note of this version, once, for as long as the shifts are those
        pairs = [tuple(p) for p in raw["aa_pairs"]]
        return StudyInputs(run_metrics, truth, deltas, aa, pairs, delong, n_examples, n_users, "summary", notes)
    if "comparisons" not in summary:
        raise ValueError("summary.json has neither 'inputs' (this version) nor 'comparisons' (earlier versions)")
    settings = summary.get("settings", {})
    confidence = float(settings.get("confidence", 0.95))
    if settings.get("multiple_testing", "bonferroni") == "bonferroni":
        confidence = 1 - (1 - confidence) / 12
    z = float(scipy_stats.norm.ppf(0.5 + confidence / 2))

    def var(interval: dict[str, Any]) -> float:
        return ((interval["high"] - interval["low"]) / (2 * z)) ** 2

    deltas: dict[tuple[str, str], SeedDeltas] = {}
    for c in summary["comparisons"]:
        if c["metric"] not in LEGACY_METRIC_KINDS:
            continue
        per_seed = {int(s): float(v) for s, v in c["per_seed"].items()}
        eval_var = sum(var(i) for i in c["bootstrap_per_seed"].values()) / len(per_seed)
        metric = f"{c['task']}.{LEGACY_METRIC_KINDS[c['metric']]}"
        deltas[(c["arm"], metric)] = SeedDeltas(per_seed, eval_var, var(c["bootstrap"]))
        if truth and c["metric"] == "ne_pct" and c["task"] in truth:
            base = run_metrics[baseline]
            scale = [base[s][c["task"]]["ne"] / (base[s][c["task"]]["ne"] - truth[c["task"]]["ne"]) for s in per_seed]
            f2 = (sum(scale) / len(scale)) ** 2
            excess = {
                s: _point(run_metrics[c["arm"]][s][c["task"]], base[s][c["task"]], "excess_ne", truth[c["task"]])
                for s in per_seed
            }
            deltas[(c["arm"], f"{c['task']}.excess_ne")] = SeedDeltas(excess, eval_var * f2, var(c["bootstrap"]) * f2)
    pairs = disjoint_pairs(sorted(run_metrics.get(baseline, {})))
    aa: dict[str, SeedDeltas] = {}
    old_floor = {(c["task"], c["metric"]): c for c in summary.get("noise_floor", [])}
    for (task, legacy), c in old_floor.items():
        if legacy not in LEGACY_METRIC_KINDS or not pairs:
            continue
        kind = LEGACY_METRIC_KINDS[legacy]
        base = run_metrics[baseline]
        eval_var = sum(var(i) for i in c["bootstrap_per_seed"].values()) / len(c["bootstrap_per_seed"])
        per_pair = {i: _point(base[b][task], base[a][task], kind, None) for i, (a, b) in enumerate(pairs)}
        aa[f"{task}.{kind}"] = SeedDeltas(per_pair, eval_var, eval_var / len(pairs))
    notes = [
        "Run folders are not present: the comparisons are read back from an earlier version's summary.json "
        "(per-seed deltas; eval variances recovered from its per-seed user-bootstrap intervals)."
    ]
    if _add_calibration_shifts(deltas, run_metrics, baseline):
        notes.append(CALIBRATION_NOTE)
    return StudyInputs(run_metrics, truth, deltas, aa, pairs, delong, n_examples, n_users, "summary", notes)
