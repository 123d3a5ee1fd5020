"""The study runner: every arm x seed of a spec, what is left to run, resume, and the study record.

Where the runs run is the executor's job (mxlab.experiment.executors: local worker processes or
Ray tasks); the report is built afterwards by the command line (mxlab.cli), not here.

Pairing: all arms of a seed share the data order (`source.train_batches(batch_size, seed, epoch)`)
and the initial weights (the model is built right after `torch.manual_seed(seed)`, before the
recipe is applied), so per-seed differences between arms come from the numerics only.

The fork design ([train] fork_from, fork_steps; docs/statistics.md, "Study designs"): per seed one
warm-up run (runs/_fork/seedK, the recipe `fork_from`, `fork_steps` steps) runs first; every arm of
that seed then starts from the warm-up's final weights and optimizer state at its data position,
and continues on its data stream. A post-training arm ("post:RECIPE", either design) evaluates the
baseline arm's final weights of its seed under RECIPE without training, so its paired delta is the
recipe's forward numerics alone: warm-ups run first, then the training arms, then the post-training arms.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mxlab import io
from mxlab.data.oracles import oracle_metrics
from mxlab.experiment.execution import INLINE, ExecutionOptions
from mxlab.experiment.executors import StudyProgress, make_executor
from mxlab.experiment.executors.mps import check_mps_devices, mps_daemon
from mxlab.experiment.gate import gated_spec, read_gate, run_gate
from mxlab.experiment.integrity import (
    RERUNS,
    check_foreign_folder,
    check_recipes_unchanged,
    spec_recipe_files,
    study_paths,
    unfinished_reruns,
)
from mxlab.experiment.provenance import environment_info
from mxlab.experiment.records import recorded_results, records_on_exit, study_records, write_missing_records
from mxlab.experiment.spec import ExperimentSpec, TrainConfig
from mxlab.experiment.study_jobs import arms_now, check_only_arms, fork_jobs, study_jobs
from mxlab.experiment.train import RunJob, RunResult, run_is_done
from mxlab.experiment.worker import make_data_source, read_result, record_failure

DEVICE_CHOICES = ("auto", "cuda", "cpu")
JobStepHook = Callable[[RunJob, int], None]


@dataclass
class StudyResult:
    """What a study run did: the runs it trained now, the ones it found done, and the report files."""

    out_dir: Path
    trained: list[str] = field(default_factory=list)
    already_done: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    backend_skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # label -> reason (a crash, an out-of-memory error)


# ----------------------------------------------------------------------------------------------
# devices and environment


def resolve_devices(device: str, gpus: int = 0) -> list[str]:
    """The devices to run on: ['cpu'], ['cuda:0', ...] (every visible GPU, or the first `gpus`) for 'cuda',
    or by availability for 'auto'.

    Refuses an unknown device name, 'cuda' on a machine without CUDA, and more GPUs than are visible.
    """
    if gpus < 0:
        raise ValueError(f"--gpus must be >= 0 (0 = every visible GPU), got {gpus}")
    if device not in DEVICE_CHOICES and not device.startswith("cuda:"):
        raise ValueError(f"unknown device {device!r}; accepted: {', '.join(DEVICE_CHOICES)} or cuda:N")
    if device == "cpu":
        return ["cpu"]
    if device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available; use --device cpu")
        return [device]
    if not torch.cuda.is_available():
        if device == "cuda":
            raise ValueError("device 'cuda' asked for, but CUDA is not available; use --device cpu or auto")
        return ["cpu"]
    count = torch.cuda.device_count()
    if gpus > count:
        raise ValueError(f"--gpus {gpus} asked for, but {count} GPUs are visible")
    return [f"cuda:{index}" for index in range(gpus or count)]


def reproduce_command(
    spec: ExperimentSpec, out_dir: Path, device: str, overrides: Sequence[str], options: Sequence[str] = ()
) -> str:
    """The `mxlab run` command line that reproduces this study (`options`: further flags, e.g. --executor ray)."""
    spec_path = spec.spec_path
    if spec_path is not None:
        try:
            spec_path = spec_path.relative_to(Path.cwd())
        except ValueError:
            pass
    parts = ["mxlab", "run", str(spec_path), "--device", device, "--out", str(out_dir), *options]
    for override in overrides:
        parts += ["--set", override]
    return " ".join(shlex.quote(part) for part in parts)


def blocked_runs(jobs: Sequence[RunJob], results: dict[str, RunResult]) -> dict[str, RunResult]:
    """Failed records (written to their done.json) for the jobs whose starting run (a warm-up, or the
    baseline of a post-training arm) did not finish; the others are left to train."""
    blocked = {}
    for job in jobs:
        if job.fork_dir is None or run_is_done(job.run_dir):
            continue
        before = results.get(job.start_label or "")
        reason = job.blocked_reason(before) if before is not None else None
        if reason is not None:
            blocked[job.label] = record_failure(job.run_dir, reason)
    return blocked


def run_jobs(jobs: Sequence[RunJob], executor: Any, *, show_progress: bool = True) -> dict[str, RunResult]:
    """Train every job without a finished record on `executor`; return {label: record} for all jobs.

    Finished and diverged runs are read back, never trained again; a skipped or failed run is tried again.
    """
    results = {job.label: read_result(job.run_dir) for job in jobs if run_is_done(job.run_dir)}
    pending = [job for job in jobs if job.label not in results]
    if pending:
        with StudyProgress(len(pending), enabled=show_progress) as progress:
            results.update(executor.run(pending, progress))
    return results


def run_phase(
    jobs: Sequence[RunJob], results: dict[str, RunResult], executor: Any, *, show_progress: bool = True
) -> None:
    """Add the records of `jobs` to `results` ({label: record} of the runs so far): a job whose starting run
    did not finish is recorded failed (`blocked_runs`), every other job not in `results` runs (`run_jobs`)."""
    results.update(blocked_runs(jobs, results))
    pending = [job for job in jobs if job.label not in results]
    results.update(run_jobs(pending, executor, show_progress=show_progress))


# ----------------------------------------------------------------------------------------------
# study


def preflight(jobs: Sequence[RunJob], source: Any, device: str) -> None:
    """Apply each arm's recipe to a freshly built model (CPU) before any training.

    Refuses (ValueError naming the arm) a recipe that does not fit the model, e.g. a rule that
    matches no module, and (once, for a plug-in model or declared tasks) outputs that are not one logit per
    declared head or a source without a declared head's labels (mxlab.models.check_outputs, first eval
    examples). Arms whose backend cannot run on `device` are left to the runner, which records them as skipped.
    """
    from mxlab.models import DEFAULT_BUILDER, build, builder_name, check_outputs
    from mxlab.recipe import apply_recipe, unavailable_reason

    checked: set[str] = set()
    for job in jobs:
        if job.arm in checked:
            continue
        checked.add(job.arm)
        if unavailable_reason(job.recipe, torch.device(device)) is not None:
            continue
        model = build(job.spec.model, source.info, job.spec.tasks)
        if len(checked) == 1 and (builder_name(job.spec.model) != DEFAULT_BUILDER or not job.spec.tasks.is_default):
            check_outputs(model, next(iter(source.eval_batches(2))), job.spec.tasks)
        try:
            apply_recipe(model, job.recipe, seed=job.seed)
        except ValueError as error:
            raise ValueError(f"arm {job.arm!r} ({job.recipe_source}) does not fit the model: {error}") from error


def _existing_runs(runs_root: Path) -> list[Path]:
    if not runs_root.is_dir():
        return []
    return sorted(path for path in runs_root.glob("*/seed*") if path.is_dir() and any(path.iterdir()))


def check_out_dir(
    spec: ExperimentSpec,
    out_dir: Path,
    resume: bool,
    runs_root: Path | None = None,
    recorded: str = "study.json",
    rerun: bool = False,
) -> None:
    """Refuse a non-empty folder that is not a study, to start over existing runs without `resume`, or to
    resume a study whose data/model/train (data/model for a `rerun` of diverged runs) or recipe files differ
    from those recorded in `out_dir/recorded` (and its runs' config.json), or, without `rerun`, one whose
    recorded rerun of diverged runs is unfinished."""
    if runs_root is None:
        check_foreign_folder(out_dir)
    runs_root = runs_root or Path(out_dir) / "runs"
    existing = _existing_runs(runs_root) + ([] if runs_root != Path(out_dir) / "runs" else study_records(out_dir))
    if existing and not resume:
        raise ValueError(
            f"{out_dir} already holds runs ({len(existing)}, e.g. {existing[0].relative_to(out_dir)}); "
            f"pass --resume to continue that study, or choose a fresh --out"
        )
    study_path = Path(out_dir) / recorded
    if resume and runs_root == Path(out_dir) / "runs":
        check_recipes_unchanged(spec, out_dir, io.read_json(study_path) if study_path.exists() else None)
    if resume and study_path.exists():
        recorded_study = io.read_json(study_path)
        unfinished = unfinished_reruns(out_dir, recorded_study) if not rerun else {}
        if unfinished:
            entry = next(iter(unfinished.values()))
            raise ValueError(
                f"cannot resume {out_dir}: runs {', '.join(unfinished)} were being rerun with changed settings "
                f"({', '.join(entry.get('changed', {}))}); continue with --rerun-diverged and the same --set"
            )
        changed = [
            f"{key} {short_value(old)} (recorded) vs {short_value(new)} (now)"
            for key, old, new in settings_changes(recorded_study, spec)
            if not (rerun and key.startswith("train."))  # a rerun's train changes: mxlab.experiment.rerun
        ]
        if changed:
            raise ValueError(
                f"cannot resume {out_dir}: the settings differ from the study recorded there: "
                f"{'; '.join(changed)}; use those settings or a fresh --out"
            )


def settings_changes(recorded_study: dict[str, Any], spec: ExperimentSpec) -> list[tuple[str, Any, Any]]:
    """[(dotted key, recorded value, value now)] for every data/model/train setting of `spec` that differs from
    the study record (a train key added since the study was recorded, at its default, does not count)."""
    current = json.loads(io.to_json(spec.to_dict()))
    defaults = {
        f"train.{key}": value for key, value in json.loads(io.to_json(dataclasses.asdict(TrainConfig()))).items()
    }
    return [
        (key, old, new)
        for table in ("data", "model", "train")
        for key, old, new in changed_keys(recorded_study.get(table), current[table], table)
        if not (old is None and key in defaults and new == defaults[key])  # a key added since, at its default
    ]


def short_value(value: Any) -> str:
    """JSON of `value`, cut to 60 characters."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def changed_keys(old: Any, new: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """[(dotted key, old value, new value)] for every leaf where two nested tables differ (a missing key is None)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            change
            for key in sorted(set(old) | set(new), key=str)
            for change in changed_keys(old.get(key), new.get(key), f"{prefix}.{key}")
        ]
    return [] if old == new else [(prefix, old, new)]


def write_study_json(
    spec: ExperimentSpec,
    out_dir: Path,
    devices: Sequence[str],
    command: str,
    execution: dict[str, Any] | None = None,
    oracles: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Write DIR/study.json (resolved spec, command, environment, `execution` as run, the eval set's `oracles` where
    the source knows the truth, and the pre-registration record: the report settings at the study's start with
    their SHA-256, kept from an earlier study.json of the same folder); return what was written."""
    path = Path(out_dir) / "study.json"
    earlier = io.read_json(path) if path.is_file() else {}
    record = earlier.get("preregistered") or {
        "report": spec.report.to_dict(),
        "sha256": spec.report.digest(),
        "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    study = {
        **spec.to_dict(),
        "recipe_files": spec_recipe_files(spec),
        **({"execution": execution} if execution is not None else {}),
        **({"oracles": oracles} if oracles is not None else {}),
        "command": command,
        "environment": environment_info(devices),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "preregistered": record,
        **({RERUNS: earlier[RERUNS]} if earlier.get(RERUNS) else {}),
    }
    study = study_paths(study, Path(out_dir))  # no absolute path of this machine in the record
    io.write_json(Path(out_dir) / "study.json", study)
    return study


def run_study(
    spec: ExperimentSpec,
    out_dir: str | Path | None = None,
    *,
    device: str = "auto",
    resume: bool = False,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
    on_step: Callable[[RunJob, int], None] | None = None,
    devices: Sequence[str] | None = None,
    options: ExecutionOptions = ExecutionOptions(),
    rerun: bool = False,
    when_all_started: Callable[[], None] | None = None,
    only_arms: Sequence[str] | None = None,
) -> StudyResult:
    """Run every arm x seed of `spec` into `out_dir` (default reports/NAME); returns a StudyResult.

    Every finished or diverged run also gets its record (DIR/records, mxlab.experiment.records); with
    `options.keep_runs` False the run folders that have one are removed at the end. `resume` counts a run
    present only as a record as done (unless a run still to train starts from it).

    `options` (mxlab.experiment.execution.ExecutionOptions, what the command line asked; each None takes the
    spec's [execution] value): the executor ('local', 'ray', or 'inline': every run in this process, the
    default with `on_step` hooks, which need it), the Ray address, the GPUs, runs per device, data-parallel
    processes per run, the CUDA MPS daemon (mxlab.experiment.executors.mps; refused with the Ray executor or
    without a CUDA device). `devices` overrides the device list resolved from `device` and the GPUs.
    Refuses an `out_dir` that is a file, an existing study folder with runs unless `resume`, and on
    `resume` a study whose data/model/train settings changed (naming the keys). `rerun` (set by
    mxlab.experiment.rerun, which checks the train settings and moves the diverged runs aside) lets the train
    settings differ and keeps study.json as recorded. `when_all_started` is called once every run has started
    on an executor that tells (the local one), while the last runs train.
    A run that crashes is recorded as failed (StudyResult.failed) and the others go on. `only_arms` trains
    only those arms' runs in this call (a study split over calls or machines; the fork design's warm-ups still
    run); study.json keeps every arm, and the others are left for a later `resume`. Refuses an arm the spec
    does not name, listing those it does.
    """
    out_dir = Path(out_dir) if out_dir is not None else Path("reports") / spec.name
    check_only_arms(spec, only_arms)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file, not a folder; choose a folder (it is created if missing)")
    if on_step is not None and options.executor is None:
        options = dataclasses.replace(options, executor=INLINE)
    chosen = options.resolved(spec.execution)
    if on_step is not None and chosen.executor != INLINE:
        raise ValueError(f"on_step hooks need executor 'inline' (runs in this process), not {chosen.executor!r}")
    if devices:
        devices = list(devices)
    elif chosen.executor == "ray" and device == "cuda" and not torch.cuda.is_available():
        devices = ["cuda"]  # a driver without GPUs, for workers with them
    else:
        devices = resolve_devices(device, chosen.gpus)
    if chosen.mps:
        check_mps_devices(devices, chosen.executor)
    check_out_dir(spec, out_dir, resume, rerun=rerun)
    if spec.train.cpu_threads and all(d == "cpu" for d in devices):
        torch.set_num_threads(spec.train.cpu_threads)  # also what the environment records
    decision = read_gate(out_dir) if spec.gate.enabled else None  # an earlier visit's gate decision stands
    warmups = fork_jobs(spec, out_dir / "runs")
    if decision is not None:
        spares = tuple(int(seed) for seed in decision["judged"] if int(seed) not in spec.seeds)
        warmups += fork_jobs(dataclasses.replace(spec, seeds=spares), out_dir / "runs") if spares else []
    jobs = warmups + arms_now(study_jobs(gated_spec(spec, decision) if decision else spec, out_dir / "runs"), only_arms)
    recorded = recorded_results(jobs, out_dir) if resume else {}
    done_before = {job.label for job in jobs if run_is_done(job.run_dir) or job.label in recorded}
    # MPS before this process touches CUDA (preflight), so it and every worker are clients of the daemon
    with mps_daemon(chosen.mps and len(done_before) < len(jobs)), records_on_exit(out_dir, chosen.keep_runs):
        source = None
        if len(done_before) < len(jobs):  # the data and every recipe are checked before anything is written
            source = make_data_source(spec)
            check_rows = getattr(source, "check_rows", None)
            if callable(check_rows):  # every row once, before any run: the first bad line, with file and line
                check_rows()
            preflight([job for job in jobs if job.label not in done_before], source, devices[0])
        runner = make_executor(chosen, devices, spec.execution, source=source, on_step=on_step)
        if when_all_started is not None and hasattr(runner, "when_all_started"):
            runner.when_all_started = when_all_started
        out_dir.mkdir(parents=True, exist_ok=True)
        if not rerun and (len(done_before) < len(jobs) or not (out_dir / "study.json").exists()):  # else: the
            # study.json of the machine that trained the runs stays (a rerun adds its entry to it)
            write_study_json(
                spec,
                out_dir,
                devices,
                reproduce_command(spec, out_dir, device, overrides, options.flags()),
                options.record(spec.execution, devices),
                oracle_metrics(source)
                if source is not None and source.info.has_truth and not spec.train.fork_from
                else None,
            )
        to_warm = [job for job in warmups if job.label not in recorded]
        # an executor that starts each run once the run it starts from is done takes the training arms along with
        # the warm-ups (no core idles while the last warm-ups finish); the gate decides on every warm-up first
        along = not spec.gate.enabled and getattr(runner, "follows_starts", False)
        early = (
            [job for job in jobs[len(warmups) :] if not job.post_training and job.label not in recorded]
            if along
            else []
        )
        results: dict[str, RunResult] = dict(recorded)
        run_phase(to_warm + early, results, runner, show_progress=show_progress)
        write_missing_records(out_dir)
        if spec.gate.enabled:  # arm-blind: decided on the warm-ups alone, before any arm (mxlab.experiment.gate)

            def run_spares(seeds: Sequence[int]) -> dict[str, RunResult]:
                spares = fork_jobs(dataclasses.replace(spec, seeds=tuple(seeds)), out_dir / "runs")
                return run_jobs(spares, runner, show_progress=show_progress)

            gated = run_gate(spec, out_dir, results, run_spares, lambda: source or make_data_source(spec))
            jobs = warmups + arms_now(study_jobs(gated, out_dir / "runs"), only_arms)
        arms = jobs[len(warmups) :]
        for phase in ([job for job in arms if not job.post_training], [job for job in arms if job.post_training]):
            # a recorded run is done; a run waits for the run it starts from
            run_phase([job for job in phase if job.label not in recorded], results, runner, show_progress=show_progress)
            write_missing_records(out_dir)
    return StudyResult(
        out_dir=out_dir,
        trained=[job.label for job in jobs if job.label not in done_before],
        already_done=sorted(done_before),
        diverged=[label for label, result in results.items() if result.status == "diverged"],
        backend_skipped=[label for label, result in results.items() if result.status == "skipped"],
        failed={label: result.reason or "" for label, result in results.items() if result.status == "failed"},
    )
