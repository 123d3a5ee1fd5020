"""The execution options of a study: where and how its runs run, in one object.

The spec's [execution] table is an `ExecutionConfig`. The command line builds an `ExecutionOptions`
once from its flags and hands it down (mxlab.cli -> `run_study` -> `make_executor`);
`resolved(spec.execution)` fills every option the command line left open from that table; `flags()`
gives the flags back for the study's reproduce command. None of the options changes a result
(docs/running.md). The executors register by name in `EXECUTOR_REGISTRY` (mxlab.registry); a spec and
the command line choose among `EXECUTORS`, every registered name but the in-process one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mxlab.registry import Registry

INLINE = "inline"  # every run in the calling process: what `on_step` hooks need; not a command-line choice
EXECUTOR_REGISTRY = Registry(
    "executor",
    {
        name: f"mxlab.experiment.executors:{name}_executor"
        for name in ("local", "ray", INLINE)  # factories (options, devices, execution, *, source, on_step)
    },
)
EXECUTORS = tuple(name for name in EXECUTOR_REGISTRY if name != INLINE)  # what a spec or the command line names


@dataclass(frozen=True)
class ExecutionConfig:
    """The [execution] table: where the runs run (docs/running.md); it does not change any result.

    `executor`: "local" (each run in its own worker process on this machine, one per GPU) or "ray"
    (each run a Ray task). `gpus`: how many GPUs to use, 0 = every visible one. `ray_address`: ""
    starts a local Ray, else ray.init(address=...) (e.g. "auto"). `cpus_per_run`: a Ray task's
    num_cpus on CPU. `max_retries`: how often Ray retries a run whose worker died. `runs_per_device`:
    how many runs share one device at a time (a small model leaves most of a GPU idle; each run still
    has its own process, and its results do not depend on its neighbours). `mps`: start the CUDA MPS
    control daemon for the study (local executor, CUDA devices), so runs that share a GPU run their
    kernels side by side (docs/running.md).
    """

    executor: str = "local"
    gpus: int = 0
    ray_address: str = ""
    cpus_per_run: int = 1
    max_retries: int = 3
    runs_per_device: int = 1
    mps: bool = False


@dataclass(frozen=True)
class ExecutionOptions:
    """The `mxlab run` execution flags; None: the spec's [execution] value.

    `executor`: local | ray (| inline, from Python only); `ray_address`: the Ray cluster to join;
    `gpus`: GPUs to use (0 = every visible one); `runs_per_device`: runs at once per device; `mps`: start
    the CUDA MPS daemon; `nproc_per_node`: processes that train each run data-parallel; `keep_runs`: keep
    each run's full folder beside its record.
    """

    executor: str | None = None
    ray_address: str | None = None
    gpus: int | None = None
    runs_per_device: int | None = None
    mps: bool | None = None
    nproc_per_node: int = 1
    keep_runs: bool = True

    def check(self) -> ExecutionOptions:
        """Returns self; refuses (ValueError naming the value and what is accepted) an unknown executor,
        gpus < 0, runs_per_device < 1 or nproc_per_node < 1."""
        if self.executor is not None and self.executor not in EXECUTOR_REGISTRY:
            raise ValueError(f"unknown executor {self.executor!r}; accepted: {', '.join(EXECUTORS)}")
        for name, low in (("gpus", 0), ("runs_per_device", 1), ("nproc_per_node", 1)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{_flag(name)} must be >= {low}, got {value}")
        return self

    def resolved(self, execution: ExecutionConfig) -> ExecutionOptions:
        """These options with every None taken from `execution` (the spec's [execution] table); checked."""
        self.check()
        shared = {field.name for field in dataclasses.fields(ExecutionConfig)}
        filled = {
            field.name: getattr(execution, field.name)
            for field in dataclasses.fields(self)
            if field.name in shared and getattr(self, field.name) is None
        }
        return dataclasses.replace(self, **filled)

    def flags(self) -> list[str]:
        """The `mxlab run` flags that ask for these options: one per option set away from its default
        (the inline executor, which the command line does not offer, gives none)."""
        flags: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or value == field.default or (field.name == "executor" and value == INLINE):
                continue
            if isinstance(value, bool):
                flags.append(_flag(field.name) if value else _flag(f"no_{field.name}"))
            else:
                flags += [_flag(field.name), str(value)]
        return flags

    def record(self, execution: ExecutionConfig, devices: list[str]) -> dict[str, Any]:
        """What study.json records of the execution: the spec's table, then these options (resolved) and the
        devices; keep_runs (what is kept on disk afterwards) is left out."""
        options = dataclasses.asdict(self.resolved(execution))
        del options["keep_runs"]
        return {**dataclasses.asdict(execution), **options, "devices": list(devices)}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


__all__ = ["EXECUTORS", "EXECUTOR_REGISTRY", "INLINE", "ExecutionConfig", "ExecutionOptions"]
