"""Where the runs of a study run: `local` (worker processes on this machine), `ray` (Ray tasks) or `inline`.

An executor has one method, `run(jobs, progress) -> {label: RunResult}`: it trains every job
given (the runner passes only runs without a finished record), records a crashed run as failed
in its done.json, and goes on with the others. `make_executor` builds one from its name in
mxlab.experiment.execution.EXECUTOR_REGISTRY, whose entries are the factories below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mxlab.experiment.execution import EXECUTOR_REGISTRY, EXECUTORS, INLINE, ExecutionConfig, ExecutionOptions
from mxlab.experiment.executors.local import InlineExecutor, LocalExecutor
from mxlab.experiment.executors.progress import StudyProgress
from mxlab.experiment.executors.ray_tasks import RayExecutor
from mxlab.experiment.train import RunJob

__all__ = ["EXECUTORS", "InlineExecutor", "LocalExecutor", "RayExecutor", "StudyProgress", "make_executor"]


def make_executor(
    options: ExecutionOptions,
    devices: Sequence[str],
    execution: ExecutionConfig,
    *,
    source: Any = None,
    on_step: Callable[[RunJob, int], None] | None = None,
) -> Any:
    """The executor that resolved `options.executor` names in EXECUTOR_REGISTRY, for `devices`, with the Ray
    settings of the spec's [execution] table (`execution`: cpus_per_run, max_retries); the inline one trains on
    `source` (None: built per spec) with the `on_step` hooks. Refuses an unregistered name (listing EXECUTORS),
    DDP on Ray, and DDP with more than one run per device (outside this process)."""
    if options.executor not in EXECUTOR_REGISTRY:
        raise ValueError(f"unknown executor {options.executor!r}; accepted: {', '.join(EXECUTORS)}")
    if options.executor != INLINE and options.nproc_per_node > 1 and (options.runs_per_device or 1) > 1:
        raise ValueError(
            "--nproc-per-node trains one run at a time over the devices; it does not combine with "
            f"--runs-per-device {options.runs_per_device}"
        )
    factory = EXECUTOR_REGISTRY.resolve(options.executor)
    return factory(options, devices, execution, source=source, on_step=on_step)


def local_executor(options: ExecutionOptions, devices: Sequence[str], execution: ExecutionConfig, **_: Any) -> Any:
    """A LocalExecutor: a worker process per run, `options.runs_per_device` at once per device."""
    return LocalExecutor(devices, nproc_per_node=options.nproc_per_node, runs_per_device=options.runs_per_device or 1)


def ray_executor(options: ExecutionOptions, devices: Sequence[str], execution: ExecutionConfig, **_: Any) -> Any:
    """A RayExecutor on the GPUs asked for (none on CPU devices); refuses DDP (`options.nproc_per_node` > 1)."""
    if options.nproc_per_node > 1:
        raise ValueError("--nproc-per-node runs on the local executor only; use --executor local (or torchrun)")
    on_gpu = any(device.startswith("cuda") for device in devices)
    return RayExecutor(
        address=options.ray_address,
        gpus=(options.gpus or len(devices)) if on_gpu else 0,
        cpus_per_run=execution.cpus_per_run,
        max_retries=execution.max_retries,
        runs_per_device=options.runs_per_device or 1,
    )


def inline_executor(
    options: ExecutionOptions,
    devices: Sequence[str],
    execution: ExecutionConfig,
    *,
    source: Any = None,
    on_step: Callable[[RunJob, int], None] | None = None,
) -> Any:
    """An InlineExecutor: every run in this process on the first device, on `source`, with `on_step`."""
    return InlineExecutor(devices[0], source=source, on_step=on_step)
