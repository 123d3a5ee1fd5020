"""Runs on this machine: each in its own worker process (one per device at a time), or inline.

`LocalExecutor` starts one process per run (spawned on GPUs, forked from a preloaded fork server
on CPUs), so every run starts with a fresh CUDA context and caching allocator, and its memory is
returned when it ends; with several devices,
one run per device at a time. A run that crashes (an exception, an out-of-memory error, a killed
process) is recorded in its done.json as failed and the other runs go on. `InlineExecutor` runs
every job in this process, one after another (the Python API's step hooks need it).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from mxlab.experiment.executors.progress import StudyProgress, describe
from mxlab.experiment.train import RunJob, RunResult, StepHook, train_run
from mxlab.experiment.worker import cached_source, describe_error, preload_worker_modules, process_main, read_result, record_failure

POLL_S = 0.25


class InlineExecutor:
    """Every job in this process on `device`, in order; an exception stops the study (a kill, in tests)."""

    def __init__(self, device: str = "cpu", *, source: Any = None, on_step: Callable[[RunJob, int], None] | None = None) -> None:
        self.device, self.source, self.on_step = device, source, on_step

    def run(self, jobs: Sequence[RunJob], progress: StudyProgress) -> dict[str, RunResult]:
        """Train each job; return {label: record}."""
        results: dict[str, RunResult] = {}
        for job in jobs:
            source = self.source if self.source is not None else cached_source(job.spec)
            hook: StepHook | None = (lambda step, job=job: self.on_step(job, step)) if self.on_step else None
            results[job.label] = train_run(job, source, self.device, progress=progress.run_progress(job.label), on_step=hook)
            progress.run_done(job.label, describe(results[job.label]))
        return results


def worker_context(devices: Sequence[str]) -> Any:
    """The multiprocessing context of worker processes: on CPUs a fork server that has imported torch and
    mxlab once, so each run starts in a fresh process without paying the imports again; with GPUs spawn
    (a fresh interpreter, whatever an import might have done to CUDA; seconds against a run's minutes)."""
    if any(device.startswith("cuda") for device in devices):
        return multiprocessing.get_context("spawn")
    preload_worker_modules()
    return multiprocessing.get_context("forkserver")


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        hint = " (the system's out-of-memory killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"the worker process was killed by {name}{hint}"
    return f"the worker process exited with code {code} before answering"


class LocalExecutor:
    """One spawned worker process per run, at most `runs_per_device` per device at a time.

    `nproc_per_node` > 1 trains each run data-parallel over that many processes (mxlab.experiment.ddp)
    on the devices, one run at a time.
    """

    def __init__(self, devices: Sequence[str], *, nproc_per_node: int = 1, runs_per_device: int = 1) -> None:
        if not devices:
            raise ValueError("the local executor needs at least one device")
        if nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {nproc_per_node}")
        if runs_per_device < 1:
            raise ValueError(f"--runs-per-device must be >= 1, got {runs_per_device}")
        self.devices, self.nproc_per_node, self.runs_per_device = list(devices), nproc_per_node, runs_per_device

    def run(self, jobs: Sequence[RunJob], progress: StudyProgress) -> dict[str, RunResult]:
        """Train each job in its own process; return {label: record} (failed runs included)."""
        if self.nproc_per_node > 1:
            return self._run_data_parallel(jobs, progress)
        context = worker_context(self.devices)
        queue = list(jobs)
        free = [device for _ in range(self.runs_per_device) for device in self.devices]  # a slot per run at once
        # runs at once share the cores: torch's default of one thread per core in each would oversubscribe them
        threads = max(1, (os.cpu_count() or 1) // len(free)) if len(free) > 1 else 0
        active: dict[str, tuple[Any, Any, RunJob, str]] = {}
        results: dict[str, RunResult] = {}
        try:
            while queue or active:
                while queue and free:
                    job, device = queue.pop(0), free.pop(0)
                    receiver, sender = context.Pipe(duplex=False)
                    process = context.Process(target=process_main, args=(job, device, sender, threads),
                                              name=f"mxlab-{job.label}")
                    process.start()
                    sender.close()
                    active[job.label] = (process, receiver, job, device)
                    progress.log(f"{job.label}: started on {device} (pid {process.pid})")
                time.sleep(POLL_S)
                for label, (process, receiver, job, device) in list(active.items()):
                    progress.poll(label, job.run_dir)
                    answer = self._answer(process, receiver)
                    if answer is None:
                        continue
                    process.join()
                    del active[label]
                    free.append(device)
                    status, payload = answer
                    if status == "ok":
                        results[label] = read_result(job.run_dir)
                    elif status == "failed":
                        results[label] = read_result(job.run_dir) if (Path(job.run_dir) / "done.json").is_file() else record_failure(job.run_dir, payload)
                    else:
                        results[label] = record_failure(job.run_dir, payload)
                    progress.run_done(label, describe(results[label]))
        finally:
            for process, receiver, _, _ in active.values():  # interrupted: stop the runs still going
                process.terminate()
                process.join()
        return results

    @staticmethod
    def _answer(process: Any, receiver: Any) -> tuple[str, str] | None:
        """('ok' | 'failed', text) once the process answered, ('crashed', reason) if it died silently, else None."""
        if receiver.poll():
            try:
                status, payload = receiver.recv()
                return status, payload if isinstance(payload, str) else ""
            except EOFError:  # closed without an answer
                pass
        if process.is_alive():
            return None
        process.join()
        return "crashed", _exit_reason(process.exitcode)

    def _run_data_parallel(self, jobs: Sequence[RunJob], progress: StudyProgress) -> dict[str, RunResult]:
        from mxlab.experiment.executors.data_parallel import train_data_parallel

        results: dict[str, RunResult] = {}
        for job in jobs:
            try:
                results[job.label] = train_data_parallel(job, self.nproc_per_node, self.devices, progress=progress)
            except RuntimeError as error:
                results[job.label] = record_failure(job.run_dir, describe_error(error))
            progress.run_done(job.label, describe(results[job.label]))
        return results
