"""Where the runs of a study run: `local` (worker processes on this machine) or `ray` (Ray tasks).

An executor has one method, `run(jobs, progress) -> {label: RunResult}`: it trains every job
given (the runner passes only runs without a finished record), records a crashed run as failed
in its done.json, and goes on with the others. `make_executor` builds one from its name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.executors.local import InlineExecutor, LocalExecutor
from mxlab.experiment.executors.progress import StudyProgress
from mxlab.experiment.executors.ray_tasks import RayExecutor
from mxlab.experiment.spec import EXECUTORS, ExecutionConfig

__all__ = ["EXECUTORS", "InlineExecutor", "LocalExecutor", "RayExecutor", "StudyProgress", "make_executor"]


def make_executor(options: ExecutionOptions, devices: Sequence[str], execution: ExecutionConfig) -> Any:
    """The executor of resolved `options` (`options.executor` 'local' or 'ray') for `devices`, with the Ray
    settings of the spec's [execution] table (`execution`: cpus_per_run, max_retries); refuses another
    name, DDP on Ray, and DDP with more than one run per device."""
    name, nproc_per_node, runs_per_device = options.executor, options.nproc_per_node, options.runs_per_device or 1
    if nproc_per_node > 1 and runs_per_device > 1:
        raise ValueError(
            "--nproc-per-node trains one run at a time over the devices; it does not combine with "
            f"--runs-per-device {runs_per_device}"
        )
    if name == "local":
        return LocalExecutor(devices, nproc_per_node=nproc_per_node, runs_per_device=runs_per_device)
    if name == "ray":
        if nproc_per_node > 1:
            raise ValueError("--nproc-per-node runs on the local executor only; use --executor local (or torchrun)")
        on_gpu = any(device.startswith("cuda") for device in devices)
        return RayExecutor(
            address=options.ray_address,
            gpus=(options.gpus or len(devices)) if on_gpu else 0,
            cpus_per_run=execution.cpus_per_run,
            max_retries=execution.max_retries,
            runs_per_device=runs_per_device,
        )
    raise ValueError(f"unknown executor {name!r}; accepted: {', '.join(EXECUTORS)}")
