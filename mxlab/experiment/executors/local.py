"""Runs on this machine: each in its own worker process (one per device at a time), or inline.

`LocalExecutor` starts one process per run (spawned on GPUs, forked from a preloaded fork server
on CPUs), so every run starts with a fresh CUDA context and caching allocator, and its memory is
returned when it ends; with several devices,
one run per device at a time. A run that crashes (an exception, an out-of-memory error, a killed
process) is recorded in its done.json as failed and the other runs go on; one that fails before
training begins because its GPU is busy (CUDA's "busy or unavailable": often the worker of a killed
earlier command still holding it) is started once more after BUSY_RETRY_PAUSE_S. SIGTERM and SIGHUP
stop `LocalExecutor.run` as Ctrl-C does (KeyboardInterrupt), so its workers are terminated and joined
before the driver exits; a worker whose driver is killed outright exits by itself (mxlab.experiment.worker).
`InlineExecutor` runs every job in this process, one after another (the Python API's step hooks need it).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from mxlab.experiment.executors.progress import StudyProgress, describe
from mxlab.experiment.oserrors import is_disk_full, stopped
from mxlab.experiment.train import RunJob, RunResult, StepHook, train_run
from mxlab.experiment.worker import PROGRESS, cached_source, describe_error, process_main, read_result, record_failure
from mxlab.worker_server import preload_worker_modules

POLL_S = 0.25
BUSY = "busy or unavailable"  # CUDA's error when another process holds a GPU in exclusive-process mode
BUSY_RETRY_PAUSE_S = 20.0  # how long a device that was busy at a run's start rests before that run starts again
TERMINATE_GRACE_S = 10.0  # how long a terminated worker has to exit before it is killed
STOP_SIGNALS = ("SIGTERM", "SIGHUP")


class InlineExecutor:
    """Every job in this process on `device`, in order; an exception stops the study (a kill, in tests)."""

    def __init__(
        self, device: str = "cpu", *, source: Any = None, on_step: Callable[[RunJob, int], None] | None = None
    ) -> None:
        self.device, self.source, self.on_step = device, source, on_step

    def run(self, jobs: Sequence[RunJob], progress: StudyProgress) -> dict[str, RunResult]:
        """Train each job; return {label: record}."""
        results: dict[str, RunResult] = {}
        for job in jobs:
            source = self.source if self.source is not None else cached_source(job.spec)
            hook: StepHook | None = (lambda step, job=job: self.on_step(job, step)) if self.on_step else None
            results[job.label] = train_run(
                job, source, self.device, progress=progress.run_progress(job.label), on_step=hook
            )
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


class _Stop:
    """A signal handler that raises KeyboardInterrupt once; later signals, and any while `stopping`, are ignored
    (`timeout` sends SIGTERM to the driver and then to its process group: the second must not cut the clean-up
    short)."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[_Stop]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt (once) in the main thread; the previous
    handlers come back after. Off the main thread nothing is installed; an ignored signal (nohup) stays ignored."""
    stop = _Stop()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)
            if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
                previous[number] = signal.signal(number, stop)
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _started_training(run_dir: Path, pid: int | None) -> bool:
    """Whether the worker `pid` began training the run: its progress.json (written as training starts) names it."""
    try:
        return json.loads((Path(run_dir) / PROGRESS).read_text()).get("pid") == pid
    except (OSError, ValueError, AttributeError):
        return False


def _stop_workers(processes: Sequence[Any]) -> None:
    """Terminate the started `processes` and join them; one still alive after TERMINATE_GRACE_S is killed."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


class LocalExecutor:
    """One spawned worker process per run, at most `runs_per_device` per device at a time.

    A run whose starting run (`RunJob.start_label`) is among the jobs waits until that one is done, and is
    recorded failed without starting if it did not finish (`follows_starts`). `nproc_per_node` > 1 trains each
    run data-parallel over that many processes (mxlab.experiment.ddp) on the devices, one run at a time.
    `when_all_started`, when set, is called once as soon as every run of a `run` call has started (the last runs
    still train: a core is free to prepare what follows them).
    """

    def __init__(self, devices: Sequence[str], *, nproc_per_node: int = 1, runs_per_device: int = 1) -> None:
        if not devices:
            raise ValueError("the local executor needs at least one device")
        if nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {nproc_per_node}")
        if runs_per_device < 1:
            raise ValueError(f"--runs-per-device must be >= 1, got {runs_per_device}")
        self.devices, self.nproc_per_node, self.runs_per_device = list(devices), nproc_per_node, runs_per_device
        self.when_all_started: Callable[[], None] | None = None

    @property
    def follows_starts(self) -> bool:
        """Whether `run` takes runs together with the runs they start from (not data-parallel, which runs in order)."""
        return self.nproc_per_node == 1

    def run(self, jobs: Sequence[RunJob], progress: StudyProgress) -> dict[str, RunResult]:
        """Train each job in its own process; return {label: record} (failed runs included).

        An interrupt (Ctrl-C, SIGTERM, SIGHUP) terminates and joins the workers, then raises KeyboardInterrupt.
        """
        if self.nproc_per_node > 1:
            return self._run_data_parallel(jobs, progress)
        context = worker_context(self.devices)
        queue = list(jobs)
        free = [device for _ in range(self.runs_per_device) for device in self.devices]  # a slot per run at once
        # runs at once share the cores: torch's default of one thread per core in each would oversubscribe them
        threads = max(1, (os.cpu_count() or 1) // len(free)) if len(free) > 1 else 0
        active: dict[str, tuple[Any, Any, RunJob, str]] = {}
        retries: list[
            tuple[float, RunJob, str]
        ] = []  # (when, job, its device): a run whose device was busy at its start
        retried: set[str] = set()
        results: dict[str, RunResult] = {}
        halted: Exception | None = None  # a full disk: no more runs start

        def start(job: RunJob, device: str) -> None:
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=process_main, args=(job, device, sender, threads), name=f"mxlab-{job.label}"
            )
            active[job.label] = (process, receiver, job, device)  # before start: an interrupt in it still stops it
            process.start()
            sender.close()
            progress.log(f"{job.label}: started on {device} (pid {process.pid})")

        with signals_as_interrupt() as stop:
            try:
                while queue or active or retries:
                    for retry in [retry for retry in retries if retry[0] <= time.monotonic()]:
                        retries.remove(retry)
                        start(retry[1], retry[2])
                    while free:
                        waiting = {job.label for job in queue} | set(active) | {retry[1].label for retry in retries}
                        job = next((job for job in queue if job.start_label not in waiting), None)
                        if job is None:
                            break
                        queue.remove(job)
                        before = results.get(job.start_label or "")
                        reason = job.blocked_reason(before) if before is not None else None
                        if reason is None:
                            start(job, free.pop(0))
                        else:
                            results[job.label] = record_failure(job.run_dir, reason)
                            progress.run_done(job.label, describe(results[job.label]))
                    if not queue and not retries and self.when_all_started is not None:
                        hook, self.when_all_started = self.when_all_started, None
                        hook()
                    # up to POLL_S (the progress lines), less once a worker answers or ends
                    ends = [end for process, receiver, _, _ in active.values() for end in (receiver, process.sentinel)]
                    if ends:
                        wait(ends, POLL_S)
                    else:
                        time.sleep(POLL_S)
                    for label, (process, receiver, job, device) in list(active.items()):
                        progress.poll(label, job.run_dir)
                        answer = self._answer(process, receiver)
                        if answer is None:
                            continue
                        process.join()
                        del active[label]
                        status, payload = answer
                        if (
                            status == "failed"
                            and BUSY in payload
                            and label not in retried
                            and not _started_training(job.run_dir, process.pid)
                        ):
                            retried.add(label)  # the device rests, then this run starts on it once more
                            retries.append((time.monotonic() + BUSY_RETRY_PAUSE_S, job, device))
                            progress.log(
                                f"{label}: its device {device} was busy at the start ({payload}); "
                                f"trying once more in {BUSY_RETRY_PAUSE_S:g} s"
                            )
                            continue
                        free.append(device)
                        if status == "ok":
                            results[label] = read_result(job.run_dir)
                        elif status == "failed":
                            results[label] = (
                                read_result(job.run_dir)
                                if (Path(job.run_dir) / "done.json").is_file()
                                else record_failure(job.run_dir, payload)
                            )
                        else:
                            results[label] = record_failure(job.run_dir, payload)
                        progress.run_done(label, describe(results[label]))
                        if results[label].status == "failed" and is_disk_full(results[label].reason) and not halted:
                            halted = stopped(label, results[label].reason or "", len(queue) + len(retries))
                            queue.clear()
                            retries.clear()
                            progress.log(str(halted))
            except BaseException:
                stop.stopping = True  # a signal now must not cut the clean-up short
                raise
            finally:
                _stop_workers(
                    [process for process, _, _, _ in active.values()]
                )  # interrupted: stop the runs still going
        if halted is not None:
            raise halted
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
