"""One run (arm, seed) where an executor places it: its data source, its device, its record of a crash.

`run_job` trains one job in the calling process (a local worker process, a Ray task, or a rank of
a data-parallel group). `process_main` is the entry of a local worker process: it runs one job
and answers on a pipe; a crash is recorded in the run's done.json (status "failed") so the study
goes on and `--resume` tries that run again. Progress goes to the run folder's progress.json
(written atomically), which the driver shows as one live line per run.

A worker outlives no driver: `process_main` starts a daemon thread that waits on the parent sentinel
multiprocessing gives every child (a pipe whose other end the driver holds; it reads EOF once the
driver is gone, SIGKILL included) and then ends the worker with `os._exit(ORPHANED_EXIT)`, so a GPU it
holds is freed at once. Checkpoints are written atomically (mxlab.experiment.checkpoint), so such an
exit loses at most the steps since the run's last checkpoint; `--resume` goes on from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from mxlab import io
from mxlab.data import make_source
from mxlab.experiment.distributed import World
from mxlab.experiment.spec import ExperimentSpec
from mxlab.experiment.train import DONE, RunJob, RunResult, run_is_done, train_run
from mxlab.models import DEFAULT_MAX_HISTORY

PROGRESS = "progress.json"
ORPHANED_EXIT = 3  # a worker's exit code when its driver died before it
_SOURCES: dict[str, Any] = {}


def max_history_of(model_config: dict[str, Any]) -> int:
    """The model's max_history (mxlab.models.DEFAULT_MAX_HISTORY when the spec leaves it out)."""
    return int(model_config.get("max_history", DEFAULT_MAX_HISTORY))


def make_data_source(spec: ExperimentSpec) -> Any:
    """The spec's data source (mxlab.data.make_source with the model's max_history)."""
    return make_source(dict(spec.data), max_history_of(spec.model))


def cached_source(spec: ExperimentSpec) -> Any:
    """The spec's data source, built once per process for the same [data] and [model]."""
    key = json.dumps([spec.data, spec.model], sort_keys=True, default=str)
    if key not in _SOURCES:
        _SOURCES.clear()
        _SOURCES[key] = make_data_source(spec)
    return _SOURCES[key]


def read_result(run_dir: Path) -> RunResult:
    """The RunResult recorded in `run_dir/done.json`."""
    return result_from_done(io.read_json(Path(run_dir) / DONE))


def result_from_done(record: dict[str, Any]) -> RunResult:
    """The RunResult of a done.json's contents."""
    return RunResult(
        status=record["status"],
        steps=record["steps"],
        wall_s=record["wall_s"],
        diverged_at_step=record.get("diverged_at_step"),
        reason=record.get("reason"),
        skipped_steps=record.get("skipped_steps", 0),
        resumed_from_step=record.get("resumed_from_step"),
        step_ms=record.get("step_ms"),
        peak_memory_bytes=record.get("peak_memory_bytes"),
        trained_with=record.get("trained_with"),
        recovered=record.get("recovered"),
    )


def record_failure(run_dir: Path, reason: str) -> RunResult:
    """Write done.json with status "failed" and `reason`; returns that record (a later --resume runs it again).
    A done.json that cannot be written (a full disk) is left out: the record is returned all the same, and
    the run, without a done.json, is run again by --resume too."""
    result = RunResult(status="failed", steps=0, wall_s=0.0, reason=reason)
    try:
        io.write_json(Path(run_dir) / DONE, result.to_dict())
    except OSError as error:
        result.reason = f"{reason} (its done.json could not be written: {error.strerror or error})"
    return result


class FileProgress:
    """A RunProgress that writes the run's state (step, loss, speed, phase: training or evaluating, process id
    and host) to RUN/progress.json (atomically, at most every `min_interval_s`) for the driver to show."""

    def __init__(self, run_dir: Path, min_interval_s: float = 0.5) -> None:
        self.path = Path(run_dir) / PROGRESS
        self.min_interval_s = min_interval_s
        self.state: dict[str, Any] = {}
        self.written = 0.0

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.written >= self.min_interval_s:
            io.write_json(self.path, self.state)
            self.written = now

    def start(self, label: str, total_steps: int, start_step: int) -> None:
        self.state = {
            "label": label,
            "total": total_steps,
            "step": start_step,
            "loss": None,
            "examples_per_s": None,
            "status": "running",
            "phase": "training",
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        self._write(force=True)

    def advance(self, step: int, loss: float, examples_per_s: float) -> None:
        self.state.update(step=step, loss=loss, examples_per_s=examples_per_s, phase="training")
        self._write()

    def evaluating(self) -> None:
        self.state["phase"] = "evaluating"
        self._write(force=True)

    def finish(self, status: str) -> None:
        self.state["status"] = status
        self._write(force=True)


def describe_error(error: BaseException) -> str:
    """One line naming the error: 'OutOfMemoryError: CUDA out of memory ...'."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def run_job(job: RunJob, device: str, *, world: World | None = None, progress: Any = None) -> RunResult:
    """Train `job` on `device` in this process (its data source built here) unless it is done; return its record.

    A finished or diverged run is read back, never trained again (a retried Ray task lands here).
    """
    if run_is_done(job.run_dir):
        return read_result(job.run_dir)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    elif device == "cpu":
        keep_freed_memory()
    return train_run(
        job,
        cached_source(job.spec),
        device,
        world=world,
        progress=progress if progress is not None else FileProgress(job.run_dir),
    )


# glibc malloc: allocations up to this size come from the heap, and freed memory stays there up to the trim size.
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit hosts
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse in this process instead of returning it to the system;
    whether it took the settings (False off glibc).

    A CPU run allocates and frees tensors of megabytes at every operation. By default glibc gives each one
    fresh pages from the kernel (mmap above a threshold, and trimming the heap top on free), so every
    allocation pays a page fault per 4 KiB on first touch: a third of an MX arm's time on a small CPU model.
    With the heap keeping its freed memory, the next tensor reuses warm pages. Only the allocator changes:
    no value computed differs. The process's resident memory may stay up to TRIM_THRESHOLD above its need.
    """
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def exit_with_parent() -> threading.Thread | None:
    """Start a daemon thread that ends this process (os._exit(ORPHANED_EXIT)) as soon as the process that
    started it through multiprocessing is gone; return that thread (None outside a multiprocessing child)."""
    import multiprocessing
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    if sentinel is None:
        return None

    def watch() -> None:
        wait(
            [sentinel]
        )  # readable (EOF) once every copy of the driver's end is closed: the driver exited or was killed
        with contextlib.suppress(OSError):
            os.write(2, f"mxlab worker {os.getpid()}: the driver process is gone; exiting\n".encode())
        os._exit(ORPHANED_EXIT)

    thread = threading.Thread(target=watch, name="mxlab-exit-with-parent", daemon=True)
    thread.start()
    return thread


def process_main(job: RunJob, device: str, connection: Any, threads: int = 0) -> None:
    """Entry of a local worker process: run `job`, send ("ok", record) or ("failed", reason) on `connection`.

    `threads` > 0: torch's CPU threads in this process (runs that share a machine share its cores; a CPU
    run's [train] cpu_threads still wins). An exception (an out-of-memory error included) is recorded in
    the run's done.json as failed. The process ends by itself when its driver dies (`exit_with_parent`).
    """
    exit_with_parent()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        result = run_job(job, device)
        connection.send(("ok", result.to_dict()))
    except Exception as error:  # recorded; the study goes on with the other runs (an interrupt is not recorded)
        if isinstance(error, OSError):  # the path and what to do say it all; a traceback would bury it
            from mxlab.experiment.oserrors import os_error_line

            print(f"mxlab: {job.label}: {os_error_line(error)}", file=sys.stderr)
        else:
            traceback.print_exc()
        reason = describe_error(error)
        try:
            record_failure(job.run_dir, reason)
        finally:
            connection.send(("failed", reason))
    finally:
        connection.close()
