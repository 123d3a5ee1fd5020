"""What a run is and what it records: the job (arm x seed, recipe, folder), the result that done.json holds,
the progress a run reports, the run folder's file names and the run's step limits. Training itself is
mxlab.experiment.train."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mxlab.experiment.artefacts import run_is_complete
from mxlab.experiment.spec import ExperimentSpec, TrainConfig

DONE = "done.json"
METRICS = "metrics.jsonl"
NUMERICS = "numerics.jsonl"
EVAL = "eval.npz"

StepHook = Callable[[int], None]


class RunProgress(Protocol):
    """What the training loop reports to (the runner shows it with rich)."""

    def start(self, label: str, total_steps: int, start_step: int) -> None: ...

    def advance(self, step: int, loss: float, examples_per_s: float) -> None: ...

    def evaluating(self) -> None: ...  # an evaluation begins; the next advance ends it

    def finish(self, status: str) -> None: ...


class SilentProgress:
    """A RunProgress that shows nothing."""

    def start(self, label: str, total_steps: int, start_step: int) -> None:
        pass

    def advance(self, step: int, loss: float, examples_per_s: float) -> None:
        pass

    def evaluating(self) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


@dataclass
class RunJob:
    """One arm x seed: what to train (`recipe` is a loaded mxlab.recipe.Recipe) and where to write it.

    `fork_dir`: the run folder whose final checkpoint the run starts from (the fork design's
    warm-up: its weights, optimizer state and data position), None from scratch; `post_training`:
    evaluate the weights of `fork_dir` (the baseline arm's run of the seed), train nothing.
    """

    arm: str
    seed: int
    recipe: Any
    recipe_source: str
    run_dir: Path
    spec: ExperimentSpec
    extra_config: dict[str, Any] = field(default_factory=dict)
    fork_dir: Path | None = None
    post_training: bool = False

    @property
    def label(self) -> str:
        return f"{self.arm}/seed{self.seed}"

    @property
    def start_label(self) -> str | None:
        """The label (ARM/seedK) of the run this one starts from (`fork_dir`), None from scratch."""
        return None if self.fork_dir is None else f"{Path(self.fork_dir).parent.name}/{Path(self.fork_dir).name}"

    def blocked_reason(self, before: RunResult) -> str | None:
        """Why this run cannot start when the run it starts from ended as `before`; None when it finished."""
        if before.status == "finished":
            return None
        return f"the run it starts from, {self.start_label}, {before.status}" + (
            f": {before.reason}" if before.reason else ""
        )


@dataclass
class RunResult:
    """The outcome recorded in done.json."""

    status: str  # finished | diverged | skipped (its backend cannot run here) | failed (crashed); `reason` says why
    steps: int
    wall_s: float
    diverged_at_step: int | None = None
    reason: str | None = None
    skipped_steps: int = 0
    resumed_from_step: int | None = None
    # What the run cost: the median over its log intervals of ms per training step, and on a GPU the
    # peak memory allocated by this run's process (torch.cuda.max_memory_allocated; None elsewhere).
    step_ms: float | None = None
    peak_memory_bytes: int | None = None
    # The code and device that trained it (mxlab.experiment.provenance.trained_with): a study resumed
    # over several machines or commits shows which runs came from which.
    trained_with: dict[str, Any] | None = None
    health: dict[str, Any] | None = None  # mxlab.experiment.health.summarize of its metrics records
    recovered: str | None = None  # how an unreadable checkpoint was handled on resume (None: nothing to heal)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "diverged_at_step": self.diverged_at_step,
            "reason": self.reason,
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "wall_s": self.wall_s,
            "resumed_from_step": self.resumed_from_step,
            "step_ms": self.step_ms,
            "peak_memory_bytes": self.peak_memory_bytes,
            "trained_with": self.trained_with,
            "health": self.health,
            **({"recovered": self.recovered} if self.recovered else {}),
        }


def run_is_done(run_dir: Path) -> bool:
    """True when `run_dir` holds a readable done.json of a finished run (with a readable eval.npz) or a diverged
    one (mxlab.experiment.artefacts); a skipped, failed or corrupt run is tried again."""
    return run_is_complete(run_dir)


def estimated_total_steps(train: TrainConfig, n_train: int) -> int:
    """Steps the run will take: epochs x ceil(n_train / batch_size), capped by max_steps when set."""
    total = train.epochs * max(1, math.ceil(n_train / train.batch_size))
    return min(total, train.max_steps) if train.max_steps else total


def step_limits(job: RunJob, n_train: int, stopped: bool = True) -> tuple[int, int]:
    """(last step, epoch bound) of the run's loop (0 = no step cap): the spec's max_steps and epochs from
    scratch, the step cap lowered to `stop_after` when set (unless not `stopped`); after a fork, the warm-up's
    steps plus the study's (its max_steps, else its epochs' worth), on the data stream continued past the
    warm-up (no epoch bound); a post-training run takes no step."""
    train = job.spec.train
    if job.post_training:
        return 0, 0
    if job.fork_dir is None:
        if stopped and train.stop_after:
            return min(train.stop_after, train.max_steps or train.stop_after), train.epochs
        return train.max_steps, train.epochs
    return train.fork_steps + estimated_total_steps(train, n_train), 2**62


def schedule_steps(job: RunJob, n_train: int) -> int:
    """The steps the learning-rate schedule spans: the run's step cap without `stop_after`, else its epochs'
    worth."""
    return step_limits(job, n_train, stopped=False)[0] or estimated_total_steps(job.spec.train, n_train)


__all__ = [
    "DONE",
    "EVAL",
    "METRICS",
    "NUMERICS",
    "RunJob",
    "RunProgress",
    "RunResult",
    "SilentProgress",
    "StepHook",
    "estimated_total_steps",
    "run_is_done",
    "schedule_steps",
    "step_limits",
]
