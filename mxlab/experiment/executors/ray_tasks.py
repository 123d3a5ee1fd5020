"""Runs as Ray tasks: every (arm, seed) one task (num_gpus=1 on GPUs, num_cpus on CPUs), local Ray or a cluster.

Each task builds its data source on the worker and writes its run folder through the same atomic
writes as a local run (a shared filesystem is assumed: every worker sees the study folder at the
same path). A worker that dies mid-run is retried by Ray (`max_retries`); the retry continues
from the run's last checkpoint, and a task whose run is already done only reads its record back.
An exception inside a run is recorded in its done.json as failed, like the local executor does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxlab.experiment.executors.progress import StudyProgress, describe
from mxlab.experiment.train import RunJob, RunResult
from mxlab.experiment.worker import describe_error, read_result, record_failure, run_job

POLL_S = 0.25


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "executor 'ray' needs the ray package: pip install 'ray>=2.60' (or pip install -e '.[test]')"
        ) from None
    return ray


def _task(job: RunJob, device: str) -> dict[str, Any]:
    """The body of one Ray task: train `job` (or read it back when done); returns its done.json record."""
    try:
        return run_job(job, device).to_dict()
    except Exception as error:  # recorded like a local run; Ray retries only a dead worker
        return record_failure(job.run_dir, describe_error(error)).to_dict()


class RayExecutor:
    """Every job a Ray task; `address` None starts a local Ray (with `num_cpus`), else ray.init(address=...).

    `gpus` > 0: each task asks for num_gpus=1/`runs_per_device` (Ray's fractional GPUs) and trains on
    cuda; else num_cpus=`cpus_per_run` on the CPU.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        gpus: int = 0,
        cpus_per_run: int = 1,
        max_retries: int = 3,
        num_cpus: int | None = None,
        runs_per_device: int = 1,
    ) -> None:
        if gpus < 0 or cpus_per_run < 1 or max_retries < 0 or runs_per_device < 1:
            raise ValueError(
                "ray executor: need gpus >= 0, cpus_per_run >= 1, max_retries >= 0, runs_per_device >= 1; "
                f"got {gpus}, {cpus_per_run}, {max_retries}, {runs_per_device}"
            )
        self.address, self.gpus, self.cpus_per_run = address or None, gpus, cpus_per_run
        self.max_retries, self.num_cpus, self.runs_per_device = max_retries, num_cpus, runs_per_device

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            if self.address is None:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.address, log_to_driver=False)
        return ray

    def run(self, jobs: Sequence[RunJob], progress: StudyProgress) -> dict[str, RunResult]:
        """Submit every job as a task, follow their progress files, collect their records."""
        ray = self._connect()
        resources = {"num_gpus": 1 / self.runs_per_device} if self.gpus else {"num_cpus": self.cpus_per_run}
        remote = ray.remote(max_retries=self.max_retries, retry_exceptions=False, **resources)(_task)
        device = "cuda" if self.gpus else "cpu"
        jobs = [
            dataclasses.replace(
                job,
                run_dir=Path(job.run_dir).resolve(),  # workers may start elsewhere
                fork_dir=Path(job.fork_dir).resolve() if job.fork_dir is not None else None,
            )
            for job in jobs
        ]
        pending = {remote.remote(job, device): job for job in jobs}
        results: dict[str, RunResult] = {}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
                for job in pending.values():
                    progress.poll(job.label, job.run_dir)
                for ref in ready:
                    job = pending.pop(ref)
                    try:
                        ray.get(ref)
                        results[job.label] = read_result(job.run_dir)
                    except Exception as error:  # retries used up: the worker kept dying
                        results[job.label] = record_failure(job.run_dir, f"ray task failed: {describe_error(error)}")
                    progress.run_done(job.label, describe(results[job.label]))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
        return results
