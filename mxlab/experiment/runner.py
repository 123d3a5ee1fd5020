"""The study runner: every arm x seed of a spec, sequentially or one job per GPU, then the report.

Pairing: all arms of a seed share the data order (`source.train_batches(batch_size, seed, epoch)`)
and the initial weights (the model is built right after `torch.manual_seed(seed)`, before the
recipe is applied), so per-seed differences between arms come from the numerics only.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import selectors
import shlex
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mxlab import io
from mxlab.experiment.provenance import code_commit
from mxlab.experiment.spec import ExperimentSpec
from mxlab.experiment.worker import ANSWER_TAG
from mxlab.experiment.train import RunJob, RunResult, StepHook, run_is_done, train_run

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
    report_paths: dict[str, Path] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# devices and environment


def resolve_devices(device: str) -> list[str]:
    """The devices to run on: ['cpu'], ['cuda:0', ...] (every visible GPU) for 'cuda', or by availability for 'auto'.

    Refuses an unknown device name and 'cuda' on a machine without CUDA.
    """
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
    return [f"cuda:{index}" for index in range(torch.cuda.device_count())]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> dict[str, Any]:
    """The commit of the mxlab checkout and whether it has uncommitted changes.

    Where the source tree is not a git checkout (a copy shipped to another machine), the
    environment variable MXLAB_GIT_COMMIT names the commit instead (dirty is then unknown).
    """
    root = Path(__file__).resolve().parents[2]
    shipped_commit = os.environ.get("MXLAB_GIT_COMMIT") or None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return {"commit": shipped_commit, "dirty": None}
    if commit.returncode != 0:
        return {"commit": shipped_commit, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment_info(devices: Sequence[str]) -> dict[str, Any]:
    """Device names, library versions (torch, triton, numpy, mxlab, python) and the git commit of mxlab."""
    from importlib import metadata

    import mxlab

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    names = [torch.cuda.get_device_name(torch.device(d)) if d.startswith("cuda") else _cpu_name() for d in devices]
    return {
        "devices": list(devices),
        "device_names": names,
        "device": names[0] if names else None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "numpy": version("numpy"),
        "mxlab": mxlab.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": code_commit(),
    }


def reproduce_command(spec: ExperimentSpec, out_dir: Path, device: str, overrides: Sequence[str]) -> str:
    """The `mxlab run` command line that reproduces this study."""
    spec_path = spec.spec_path
    if spec_path is not None:
        try:
            spec_path = spec_path.relative_to(Path.cwd())
        except ValueError:
            pass
    parts = ["mxlab", "run", str(spec_path), "--device", device, "--out", str(out_dir)]
    for override in overrides:
        parts += ["--set", override]
    return " ".join(shlex.quote(part) for part in parts)


# ----------------------------------------------------------------------------------------------
# progress (rich)


class RichProgress:
    """Progress of a study on the terminal: runs done of all, and the current run's step, loss, examples/s, ETA."""

    def __init__(self, total_runs: int, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not enabled,
        )
        self.study_task = self.progress.add_task("runs", total=total_runs, loss="-", speed="")
        self.run_task: Any = None
        self.enabled = enabled

    def log(self, message: str) -> None:
        if self.enabled:
            self.progress.console.log(message)

    def __enter__(self) -> "RichProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def run_done(self, label: str, status: str) -> None:
        self.progress.advance(self.study_task)
        self.log(f"{label}: {status}")

    # RunProgress
    def start(self, label: str, total_steps: int, start_step: int) -> None:
        if self.run_task is not None:
            self.progress.remove_task(self.run_task)
        self.run_task = self.progress.add_task(label, total=total_steps, completed=start_step, loss="-", speed="")

    def advance(self, step: int, loss: float, examples_per_s: float) -> None:
        self.progress.update(self.run_task, completed=step, loss=f"{loss:.4f}", speed=f"{examples_per_s:,.0f} ex/s")

    def finish(self, status: str) -> None:
        if self.run_task is not None:
            self.progress.remove_task(self.run_task)
            self.run_task = None


# ----------------------------------------------------------------------------------------------
# jobs


def study_jobs(spec: ExperimentSpec, runs_root: Path) -> list[RunJob]:
    """One RunJob per seed x arm (seed-major, arms in spec order), recipes loaded from spec.recipe_paths."""
    from mxlab.recipe import load_recipe

    recipes = {arm: load_recipe(spec.recipe_paths[arm]) for arm in spec.arms}
    return [
        RunJob(arm=arm, seed=seed, recipe=recipes[arm], recipe_source=str(spec.recipe_paths[arm]),
               run_dir=Path(runs_root) / arm / f"seed{seed}", spec=spec)
        for seed in spec.seeds
        for arm in spec.arms
    ]


def make_data_source(spec: ExperimentSpec) -> Any:
    """The spec's data source (mxlab.data.make_source with the model's max_history)."""
    from mxlab.data import make_source

    return make_source(dict(spec.data), max_history_of(spec.model))


def max_history_of(model_config: dict[str, Any]) -> int:
    """The model's max_history (its own default when the spec leaves it out)."""
    if "max_history" in model_config:
        return int(model_config["max_history"])
    import mxlab.models as models

    default = getattr(models, "DEFAULT_MAX_HISTORY", None)
    if default is None:
        raise ValueError("[model] needs max_history (the longest user history the model attends over)")
    return int(default)


def _read_result(run_dir: Path) -> RunResult:
    record = json.loads((Path(run_dir) / "done.json").read_text())
    return RunResult(
        status=record["status"], steps=record["steps"], wall_s=record["wall_s"],
        diverged_at_step=record.get("diverged_at_step"), reason=record.get("reason"),
        skipped_steps=record.get("skipped_steps", 0), resumed_from_step=record.get("resumed_from_step"),
    )


def run_jobs(
    jobs: Sequence[RunJob],
    devices: Sequence[str],
    *,
    source: Any = None,
    on_step: JobStepHook | None = None,
    show_progress: bool = True,
    log_dir: Path | None = None,
) -> dict[str, RunResult]:
    """Train every job that has no done.json; return {label: result} for all jobs (done ones read back).

    One device: sequentially in this process (`source` is built from the first job's spec when not
    given). Several: one worker subprocess per device, each taking the next job when it is free;
    `on_step` is not available there. Refuses (RuntimeError, after the other jobs ran) when a
    worker's job failed with an error.
    """
    results: dict[str, RunResult] = {}
    pending = [job for job in jobs if not run_is_done(job.run_dir)]
    for job in jobs:
        if run_is_done(job.run_dir):
            results[job.label] = _read_result(job.run_dir)
    if not pending:
        return results
    with RichProgress(len(pending), enabled=show_progress) as progress:
        if len(devices) <= 1:
            source = source if source is not None else make_data_source(pending[0].spec)
            for job in pending:
                hook: StepHook | None = (lambda step, job=job: on_step(job, step)) if on_step else None
                result = train_run(job, source, devices[0] if devices else "cpu", progress=progress, on_step=hook)
                results[job.label] = result
                progress.run_done(job.label, _describe(result))
        else:
            if on_step is not None:
                raise ValueError("on_step hooks run only in the sequential runner (one device)")
            results.update(_run_parallel(pending, devices, progress, log_dir or Path(pending[0].run_dir).parents[2] / "logs"))
    return results


def _describe(result: RunResult) -> str:
    if result.status == "skipped":
        return f"skipped: {result.reason}"
    if result.status == "diverged":
        return f"diverged at step {result.diverged_at_step} ({result.reason})"
    return f"{result.status}, {result.steps} steps in {result.wall_s:.1f} s"


def _run_parallel(jobs: Sequence[RunJob], devices: Sequence[str], progress: RichProgress, log_dir: Path) -> dict[str, RunResult]:
    """Dispatch jobs to one worker subprocess per device (mxlab.experiment.worker); collect results."""
    log_dir.mkdir(parents=True, exist_ok=True)
    queue = deque(jobs)
    for job in jobs:
        io.write_torch(Path(job.run_dir) / "job.pt", job)
    selector = selectors.DefaultSelector()
    workers: list[subprocess.Popen] = []
    busy: dict[int, RunJob] = {}
    results: dict[str, RunResult] = {}
    failures: list[str] = []
    for index, device in enumerate(devices):
        with open(log_dir / f"worker{index}-{device.replace(':', '')}.log", "a") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "mxlab.experiment.worker", "--device", device],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
            )
        workers.append(worker)
        selector.register(worker.stdout, selectors.EVENT_READ, index)

    def dispatch(index: int) -> None:
        if queue:
            job = queue.popleft()
            busy[index] = job
            workers[index].stdin.write(str(Path(job.run_dir) / "job.pt") + "\n")
            workers[index].stdin.flush()
            progress.log(f"{job.label}: started on {devices[index]}")

    try:
        for index in range(len(workers)):
            dispatch(index)
        while busy:
            for key, _ in selector.select():
                index = key.data
                line = key.fileobj.readline()
                if line and not line.startswith(ANSWER_TAG):
                    continue  # not an answer (the worker sends everything else to its log)
                job = busy.pop(index, None)
                if not line:  # the worker exited
                    selector.unregister(key.fileobj)
                    if job is not None:
                        failures.append(f"{job.label}: the worker on {devices[index]} exited (log in {log_dir})")
                    continue
                if job is None:
                    continue
                status, _, message = line[len(ANSWER_TAG):].strip().partition(" ")
                if status == "ok":
                    results[job.label] = _read_result(job.run_dir)
                    progress.run_done(job.label, _describe(results[job.label]))
                else:
                    failures.append(f"{job.label}: {message}")
                    progress.run_done(job.label, f"failed: {message}")
                dispatch(index)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.stdin.close()
        for worker in workers:
            worker.wait()
        for job in jobs:
            (Path(job.run_dir) / "job.pt").unlink(missing_ok=True)
    if queue:
        failures.append(f"{len(queue)} runs not started: every worker exited")
    if failures:
        raise RuntimeError("some runs failed:\n  " + "\n  ".join(failures))
    return results


# ----------------------------------------------------------------------------------------------
# study


def preflight(jobs: Sequence[RunJob], source: Any, device: str) -> None:
    """Apply each arm's recipe to a freshly built model (CPU) before any training.

    Refuses (ValueError naming the arm) a recipe that does not fit the model, e.g. a rule that
    matches no module. Arms whose backend cannot run on `device` are left to the runner, which
    records them as skipped.
    """
    from mxlab.models import build_model
    from mxlab.recipe import apply_recipe
    from mxlab.te_backend import recipe_unavailable_reason

    checked: set[str] = set()
    for job in jobs:
        if job.arm in checked:
            continue
        checked.add(job.arm)
        if recipe_unavailable_reason(job.recipe, torch.device(device)) is not None:
            continue
        model = build_model(job.spec.model, source.info)
        try:
            apply_recipe(model, job.recipe, seed=job.seed)
        except ValueError as error:
            raise ValueError(f"arm {job.arm!r} ({job.recipe_source}) does not fit the model: {error}") from error


def _existing_runs(runs_root: Path) -> list[Path]:
    if not runs_root.is_dir():
        return []
    return sorted(path for path in runs_root.glob("*/seed*") if path.is_dir() and any(path.iterdir()))


def check_out_dir(
    spec: ExperimentSpec, out_dir: Path, resume: bool, runs_root: Path | None = None, recorded: str = "study.json"
) -> None:
    """Refuse to start over existing runs without `resume`, or to resume a study whose data/model/train
    differ from those recorded in `out_dir/recorded`."""
    runs_root = runs_root or Path(out_dir) / "runs"
    existing = _existing_runs(runs_root)
    if existing and not resume:
        raise ValueError(
            f"{out_dir} already holds runs ({len(existing)}, e.g. {existing[0].relative_to(out_dir)}); "
            f"pass --resume to continue that study, or choose a fresh --out"
        )
    study_path = Path(out_dir) / recorded
    if resume and study_path.exists():
        recorded = json.loads(study_path.read_text())
        current = spec.to_dict()
        changed = [key for key in ("data", "model", "train") if recorded.get(key) != json.loads(io.to_json(current[key]))]
        if changed:
            raise ValueError(
                f"cannot resume {out_dir}: [{changed[0]}] differs from the study recorded there "
                f"({recorded.get(changed[0])} vs {current[changed[0]]}); use a fresh --out"
            )


def write_study_json(spec: ExperimentSpec, out_dir: Path, devices: Sequence[str], command: str) -> dict[str, Any]:
    """Write DIR/study.json (resolved spec, command, environment); return what was written."""
    study = {
        **spec.to_dict(),
        "command": command,
        "environment": environment_info(devices),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    io.write_json(Path(out_dir) / "study.json", study)
    return study


def run_study(
    spec: ExperimentSpec,
    out_dir: str | Path | None = None,
    *,
    device: str = "auto",
    resume: bool = False,
    overrides: Sequence[str] = (),
    report: bool = True,
    show_progress: bool = True,
    on_step: JobStepHook | None = None,
    devices: Sequence[str] | None = None,
) -> StudyResult:
    """Run every arm x seed of `spec` into `out_dir` (default reports/NAME), then write the report.

    Returns a StudyResult. `devices` overrides the device list resolved from `device` (several
    entries run one worker per entry). Refuses an existing study folder with runs unless `resume`;
    with `resume`, finished runs are skipped and interrupted ones continue from their checkpoint.
    """
    out_dir = Path(out_dir) if out_dir is not None else Path("reports") / spec.name
    devices = list(devices) if devices else resolve_devices(device)
    check_out_dir(spec, out_dir, resume)
    if spec.train.cpu_threads and all(d == "cpu" for d in devices):
        torch.set_num_threads(spec.train.cpu_threads)  # also what the environment records
    jobs = study_jobs(spec, out_dir / "runs")
    done_before = {job.label for job in jobs if run_is_done(job.run_dir)}
    source = None
    if len(done_before) < len(jobs):  # the data and every recipe are checked before anything is written
        source = make_data_source(spec)
        preflight([job for job in jobs if job.label not in done_before], source, devices[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_study_json(spec, out_dir, devices, reproduce_command(spec, out_dir, device, overrides))
    results = run_jobs(jobs, devices, source=source if len(devices) <= 1 else None, on_step=on_step,
                       show_progress=show_progress, log_dir=out_dir / "logs")
    outcome = StudyResult(
        out_dir=out_dir,
        trained=[job.label for job in jobs if job.label not in done_before],
        already_done=sorted(done_before),
        diverged=[label for label, result in results.items() if result.status == "diverged"],
        backend_skipped=[label for label, result in results.items() if result.status == "skipped"],
    )
    if report:
        from mxlab.report import write_report

        try:
            outcome.report_paths = dict(write_report(out_dir))
        except Exception as error:
            raise RuntimeError(
                f"every run is finished and saved under {out_dir / 'runs'}, but writing the report failed: "
                f"{type(error).__name__}: {error}. Re-render it with `mxlab report {out_dir}`."
            ) from error
    return outcome
