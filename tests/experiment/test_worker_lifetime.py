"""No local worker outlives its driver, and a run whose GPU was busy at its start is tried once more.

A driver stopped by SIGTERM (as `timeout` sends it) terminates and joins its workers; a worker whose
driver is SIGKILLed exits by itself; a run that fails before training with CUDA's "busy or
unavailable" starts once more, other failures do not. The drivers of the signal tests are fresh
interpreters that spawn their workers (as on GPUs).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxlab.experiment import load_spec, worker
from mxlab.experiment.executors import local
from mxlab.experiment.executors.local import LocalExecutor
from mxlab.experiment.executors.progress import StudyProgress
from mxlab.experiment.study_jobs import study_jobs
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

ROOT = Path(__file__).resolve().parents[2]
BUSY_ERROR = "CUDA error: CUDA-capable device(s) is/are busy or unavailable"


def _jobs(runs_root: Path) -> list:
    return study_jobs(load_spec(QUICKSTART, MICRO + ['arms=["bf16"]', "train.max_steps=2"]), Path(runs_root))


def _pid_file(job) -> Path:
    return Path(job.run_dir).with_name(Path(job.run_dir).name + ".pid")


def _attempt(job) -> int:
    """Record this worker's start (its time) next to the run folder; return how many starts there were."""
    path = Path(job.run_dir).with_name(Path(job.run_dir).name + ".attempts")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as file:
        file.write(f"{time.time()}\n")
    return len(path.read_text().splitlines())


def _block(job, device: str, *args, **kwargs) -> None:
    """A run whose training never ends: it writes the worker's pid and sleeps."""
    Path(job.run_dir).parent.mkdir(parents=True, exist_ok=True)
    _pid_file(job).with_suffix(".tmp").write_text(str(os.getpid()))
    _pid_file(job).with_suffix(".tmp").replace(_pid_file(job))
    time.sleep(600)


def blocking_worker_without_watch(job, device: str, connection, threads: int = 0) -> None:
    """A worker that blocks and does not watch its driver: only the driver's clean-up ends it."""
    _block(job, device, connection)


def blocking_worker(job, device: str, connection, threads: int = 0) -> None:
    """The real worker entry (mxlab.experiment.worker.process_main) on a run whose training blocks."""
    worker.run_job = _block
    worker.process_main(job, device, connection, threads)


def busy_once_worker(job, device: str, connection, threads: int = 0) -> None:
    """The real worker entry; its first start fails as a GPU held by another process does, later ones train."""
    train = worker.run_job

    def run_job(job, device, **kwargs):
        if _attempt(job) == 1:
            raise RuntimeError(f"{BUSY_ERROR}\nCUDA kernel errors might be asynchronously reported")
        return train(job, device, **kwargs)

    worker.run_job = run_job
    worker.process_main(job, device, connection, threads)


def other_error_worker(job, device: str, connection, threads: int = 0) -> None:
    """The real worker entry; every start fails with an error other than a busy device."""

    def run_job(job, device, **kwargs):
        _attempt(job)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    worker.run_job = run_job
    worker.process_main(job, device, connection, threads)


def busy_after_training_began_worker(job, device: str, connection, threads: int = 0) -> None:
    """The real worker entry; every start fails with the busy error after training began (progress.json written)."""

    def run_job(job, device, **kwargs):
        _attempt(job)
        worker.FileProgress(job.run_dir).start(job.label, 2, 0)
        raise RuntimeError(BUSY_ERROR)

    worker.run_job = run_job
    worker.process_main(job, device, connection, threads)


def drive(target: str, runs_root: str) -> None:
    """A driver process: LocalExecutor.run on one job, its worker spawned at `target`; exit 130 on an interrupt."""
    local.worker_context = lambda devices: multiprocessing.get_context("spawn")
    local.process_main = globals()[target]
    jobs = _jobs(Path(runs_root))
    try:
        LocalExecutor(["cpu"]).run(jobs, StudyProgress(len(jobs), enabled=False))
    except KeyboardInterrupt:
        sys.exit(130)


def _alive(pid: int) -> bool:
    """Whether process `pid` is running (a zombie that no one reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _start_driver(target: str, runs_root: Path) -> tuple[subprocess.Popen, int]:
    """Start `drive(target)` in a fresh interpreter; return it and its worker's pid once that is training."""
    code = f"from tests.experiment.test_worker_lifetime import drive; drive({target!r}, {str(runs_root)!r})"
    runs_root.mkdir(parents=True)
    with (runs_root / "driver.log").open("wb") as log:  # a file, not a pipe: a worker left running would hold that open
        driver = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    pid_file = _pid_file(_jobs(runs_root)[0])
    deadline = time.monotonic() + 30
    while not pid_file.is_file():
        assert driver.poll() is None, (runs_root / "driver.log").read_text()
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.02)
    return driver, int(pid_file.read_text())


def _end(driver: subprocess.Popen, worker_pid: int) -> None:
    """Kill what a failed test left running: the driver and the worker this test started."""
    if driver.poll() is None:
        driver.kill()
        driver.wait()
    if _alive(worker_pid):
        os.kill(worker_pid, signal.SIGKILL)


def test_sigterm_to_the_driver_terminates_and_joins_its_worker(tmp_path):
    driver, worker_pid = _start_driver("blocking_worker_without_watch", tmp_path / "runs")
    try:
        assert _alive(worker_pid)
        driver.send_signal(signal.SIGTERM)  # to the driver alone: its worker (no handler of its own) sees nothing
        driver.wait(timeout=10)
        assert driver.returncode == 130, (
            tmp_path / "runs/driver.log"
        ).read_text()  # KeyboardInterrupt, after the clean-up
        assert not _alive(worker_pid), "the driver exited and left its worker running"
    finally:
        _end(driver, worker_pid)


def test_a_worker_exits_by_itself_when_its_driver_is_killed(tmp_path):
    driver, worker_pid = _start_driver("blocking_worker", tmp_path / "runs")
    try:
        driver.kill()  # SIGKILL: no handler, no clean-up in the driver
        driver.wait()
        deadline = time.monotonic() + 5
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker_pid), "the worker outlived its killed driver by 5 s"
    finally:
        _end(driver, worker_pid)


class _Logged(StudyProgress):
    def __init__(self, total_runs: int) -> None:
        super().__init__(total_runs, enabled=False)
        self.logged: list[str] = []

    def log(self, message: str) -> None:
        self.logged.append(message)


def _run_locally(target, tmp_path: Path, monkeypatch) -> tuple[dict, list[float], list[str]]:
    monkeypatch.setattr(local, "process_main", target)
    monkeypatch.setattr(local, "BUSY_RETRY_PAUSE_S", 0.5)
    jobs = _jobs(tmp_path / "runs")
    progress = _Logged(len(jobs))
    results = LocalExecutor(["cpu"]).run(jobs, progress)
    attempts = Path(jobs[0].run_dir).with_name("seed0.attempts").read_text().split()
    return results, [float(stamp) for stamp in attempts], progress.logged


def test_a_run_whose_device_was_busy_at_its_start_is_tried_once_more(tmp_path, monkeypatch):
    results, attempts, lines = _run_locally(busy_once_worker, tmp_path, monkeypatch)
    assert results["bf16/seed0"].status == "finished" and results["bf16/seed0"].steps == 2
    assert len(attempts) == 2 and attempts[1] - attempts[0] >= 0.5  # after the pause
    assert any("busy" in line and "once more" in line for line in lines), lines
    done = json.loads((tmp_path / "runs/bf16/seed0/done.json").read_text())
    assert done["status"] == "finished" and done["steps"] == 2


@pytest.mark.parametrize(
    "target, reason",
    [(other_error_worker, "illegal memory access"), (busy_after_training_began_worker, "busy or unavailable")],
)
def test_other_failures_are_not_tried_again(target, reason, tmp_path, monkeypatch):
    results, attempts, lines = _run_locally(target, tmp_path, monkeypatch)
    assert results["bf16/seed0"].status == "failed" and reason in results["bf16/seed0"].reason
    assert len(attempts) == 1 and not any("once more" in line for line in lines)


def test_sigterm_and_sighup_interrupt_only_inside_and_only_once():
    seen: list[int] = []
    stops = (signal.SIGTERM, signal.SIGHUP)
    before = {number: signal.signal(number, lambda number, frame: seen.append(number)) for number in stops}
    try:
        for number in stops:
            with pytest.raises(KeyboardInterrupt, match=signal.Signals(number).name):
                with local.signals_as_interrupt():
                    os.kill(os.getpid(), number)
                    time.sleep(1)
            with local.signals_as_interrupt() as stop:
                stop.stopping = True  # cleaning up: a signal is ignored
                os.kill(os.getpid(), number)
            os.kill(os.getpid(), number)  # outside: the handler from before is back
        assert seen == list(stops)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup: stays ignored
        with local.signals_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def test_a_study_command_stopped_by_sigterm_exits_130_and_restores_the_handler():
    from mxlab.cli import study_commands

    before = signal.getsignal(signal.SIGTERM)

    def body() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here
        return 0

    assert study_commands._guarded(body) == 130
    assert signal.getsignal(signal.SIGTERM) == before


def test_keep_freed_memory_changes_allocation_not_values():
    """The allocator setting of CPU runs: glibc takes it (Linux here), and a computation gives the same bits."""
    import sys

    import torch

    from mxlab.experiment.worker import keep_freed_memory

    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    before = (x.abs() * 3.0 - x).sum()
    took = keep_freed_memory()
    assert took or not sys.platform.startswith("linux")
    assert torch.equal((x.abs() * 3.0 - x).sum(), before)
