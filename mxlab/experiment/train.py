"""One run: build the model for a seed, apply the arm's recipe, train, evaluate, write the run folder.

The run folder (docs/INTERFACES.md, "Study folder") is written atomically file by file;
`done.json` comes last. A run with a checkpoint resumes from it and produces exactly what an
uninterrupted run produces: the checkpoint holds the model, optimizer, loss scaler, every RNG
state, the step, the data position (epoch, batches consumed in it) and the partial log interval.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from mxlab import io
from mxlab.experiment.artefacts import run_is_complete
from mxlab.experiment.checkpoint import (
    CHECKPOINT,
    fork_data_position,
    load_resume_checkpoint,
    restore_rng,
    rng_state,
    start_from_fork,
)
from mxlab.experiment.checkpoint import save_checkpoint as write_checkpoint
from mxlab.experiment.data_order import data_order_seed, training_batches
from mxlab.experiment.distributed import World
from mxlab.experiment.evaluate import evaluate_model, held_out_metrics, source_tasks
from mxlab.experiment.health import summarize
from mxlab.experiment.metrics_log import LogInterval, median_step_ms
from mxlab.experiment.optim import lr_factor, make_optimizer
from mxlab.experiment.provenance import trained_with
from mxlab.experiment.spec import ExperimentSpec, TrainConfig
from mxlab.experiment.step import PendingStep, ReadStep, autocast, read_pending, train_step

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


def build_run_model(job: RunJob, info: Any) -> tuple[torch.nn.Module, Any]:
    """Build the model of the spec's [model] and [tasks] (mxlab.models.build) with torch.manual_seed(job.seed)
    (same init for every arm of a seed), set its output biases (train.output_bias), then apply the recipe.
    Returns (model on the CPU, plan); refuses what mxlab.models.build refuses.
    """
    from mxlab.experiment.training_recipe import set_output_biases
    from mxlab.models import build
    from mxlab.recipe import apply_recipe

    torch.manual_seed(job.seed)
    np.random.seed(job.seed)
    random.seed(job.seed)
    model = build(job.spec.model, info, job.spec.tasks)
    set_output_biases(model, info, job.spec.train.output_bias)
    plan = apply_recipe(model, job.recipe, seed=job.seed)
    return model, plan


def estimated_total_steps(train: TrainConfig, n_train: int) -> int:
    """Steps the run will take: epochs x ceil(n_train / batch_size), capped by max_steps when set."""
    total = train.epochs * max(1, math.ceil(n_train / train.batch_size))
    return min(total, train.max_steps) if train.max_steps else total


def step_limits(job: RunJob, n_train: int) -> tuple[int, int]:
    """(last step, epoch bound) of the run's loop (0 = no step cap): the spec's max_steps and epochs from
    scratch; after a fork, the warm-up's steps plus the study's (its max_steps, else its epochs' worth),
    on the data stream continued past the warm-up (no epoch bound); a post-training run takes no step."""
    train = job.spec.train
    if job.post_training:
        return 0, 0
    if job.fork_dir is None:
        return train.max_steps, train.epochs
    return train.fork_steps + estimated_total_steps(train, n_train), 2**62


def _rounding_state(model: torch.nn.Module) -> dict[str, int]:
    """The stochastic-rounding call counters of the quantized products (empty with stand-in recipes)."""
    import mxlab.recipe as recipe_module

    state = getattr(recipe_module, "rounding_state", None)
    return state(model) if state is not None else {}


def _load_rounding_state(model: torch.nn.Module, state: dict[str, int]) -> None:
    import mxlab.recipe as recipe_module

    load = getattr(recipe_module, "load_rounding_state", None)
    if load is not None:
        load(model, state)


def _plan_text(plan: Any) -> str:
    table = getattr(plan, "table", None)
    return table() if callable(table) else str(plan)


def _plan_dict(plan: Any) -> Any:
    to_dict = getattr(plan, "to_dict", None)
    return to_dict() if callable(to_dict) else {"plan": str(plan)}


def train_run(
    job: RunJob,
    source: Any,
    device: torch.device | str,
    *,
    progress: RunProgress | None = None,
    on_step: StepHook | None = None,
    world: World | None = None,
) -> RunResult:
    """Train and evaluate one arm x seed, writing its run folder; continue from its checkpoint if there is one.

    Returns the RunResult that done.json records. A non-finite loss on more than
    train.nonfinite_patience consecutive steps, or a loss scale below train.min_loss_scale,
    ends the run as diverged (no eval.npz). The step itself (`mxlab.experiment.step.train_step`)
    reads nothing back; the losses of the steps since the last read are read at once every
    train.log_every steps, at each checkpoint and at the end, and checked step by step then (so a
    divergence is recorded at the step it happened; up to log_every - 1 more steps were queued).
    `on_step(step)` is called after every step (after its checkpoint); an exception from it stops
    the run with its files as they were at the last checkpoint (how tests simulate a kill).
    Refuses a run folder that already has done.json.
    A job with `fork_dir` and no checkpoint of its own starts from that run's final checkpoint
    (`start_from_fork`: weights, optimizer state unless post-training, data position; `step_limits`);
    a post-training job takes no step and only evaluates.
    A recipe that Transformer Engine cannot run on `device` (mxlab.recipe.backends.te) is recorded as
    skipped, with the reason, before the model is built (done.json status "skipped").
    In a data-parallel group (`world`, mxlab.experiment.distributed) each rank trains on its shard
    of every batch and only rank 0 writes the run folder.
    """
    from mxlab.models import loss_components, loss_for
    from mxlab.recipe.loss_scaling import make_loss_scaler

    run_dir = Path(job.run_dir)
    if run_is_done(run_dir):
        raise ValueError(f"{run_dir} already has {DONE}; remove it to run {job.label} again")
    progress = progress or SilentProgress()
    world = world or World()
    train = job.spec.train
    device = torch.device(device)
    from mxlab.recipe.backends.te import recipe_unavailable_reason

    skip_reason = recipe_unavailable_reason(job.recipe, device)
    if skip_reason is not None:  # the arm's backend (Transformer Engine) cannot run here: record why, train nothing
        result = RunResult(status="skipped", steps=0, wall_s=0.0, reason=skip_reason)
        if world.writes:
            run_dir.mkdir(parents=True, exist_ok=True)
            io.write_json(run_dir / DONE, result.to_dict())
        progress.finish("skipped")
        return result

    if world.writes:
        (run_dir / DONE).unlink(missing_ok=True)  # a "skipped" or "failed" record of an earlier attempt; this one runs
    if device.type == "cpu" and train.cpu_threads:
        torch.set_num_threads(train.cpu_threads)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, plan = build_run_model(job, source.info)
    loss_fn, components = loss_for(job.spec.tasks), loss_components(job.spec.tasks)
    tasks = source_tasks(source, job.spec.tasks)
    model.to(device)
    trained = world.wrap(model)
    optimizer = make_optimizer(train, model)
    scaler = make_loss_scaler(job.recipe.loss_scaling, model)
    monitor = None
    if train.diagnostics_every:
        from mxlab.recipe.diagnostics import NumericsMonitor

        monitor = NumericsMonitor(model, every=train.diagnostics_every)

    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "arm": job.arm,
        "seed": job.seed,
        "data_order_seed": data_order_seed(job),
        "recipe": job.recipe_source,
        "device": str(device),
        "data": job.spec.data,
        "model": job.spec.model,
        "train": job.spec.to_dict()["train"],
        "study": job.spec.name,
        "world_size": world.size,
        "fork": None if job.fork_dir is None else {"from": str(job.fork_dir), "post_training": job.post_training},
        **job.extra_config,
    }
    if world.writes:
        io.write_json(run_dir / "config.json", config)
        io.write_json(run_dir / "plan.json", _plan_dict(plan))
        io.write_text(run_dir / "plan.txt", _plan_text(plan) + "\n")

    step, epoch, batches_in_epoch = 0, 0, 0
    nonfinite_streak, elapsed_before = 0, 0.0
    metrics: list[dict[str, Any]] = []
    numerics: list[dict[str, Any]] = []
    interval = LogInterval()
    resumed_from: int | None = None
    fork_position: tuple[int, int] | None = (
        None  # the fork warm-up's (epoch, batches taken in it): where the arm's data begins
    )
    checkpoint_path = run_dir / CHECKPOINT
    checkpoint, recovered = load_resume_checkpoint(run_dir)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        step, epoch, batches_in_epoch = checkpoint["step"], checkpoint["epoch"], checkpoint["batches_in_epoch"]
        nonfinite_streak, elapsed_before = checkpoint["nonfinite_streak"], checkpoint["elapsed_s"]
        interval.load(checkpoint["interval"])
        metrics = [record for record in io.read_jsonl(run_dir / METRICS) if record["step"] <= step]
        numerics = [record for record in io.read_jsonl(run_dir / NUMERICS) if record["step"] <= step]
        restore_rng(checkpoint["rng"])
        _load_rounding_state(model, checkpoint["rounding"])
        resumed_from = step
        fork_position = fork_data_position(job.fork_dir) if job.fork_dir is not None else None
    elif job.fork_dir is not None:
        step, epoch, batches_in_epoch = start_from_fork(job.fork_dir, model, None if job.post_training else optimizer)
        fork_position = (epoch, batches_in_epoch)
    max_steps, epochs = step_limits(job, source.n_train)

    def save_logs() -> None:
        if not world.writes:
            return
        io.write_jsonl(run_dir / METRICS, metrics)
        if monitor is not None:
            io.write_jsonl(run_dir / NUMERICS, numerics)

    def save_checkpoint() -> None:
        save_logs()  # logs first: a crash in between leaves logs ahead of the checkpoint, trimmed on resume
        if not world.writes:
            return
        write_checkpoint(
            checkpoint_path,
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": rng_state(),
                "step": step,
                "epoch": epoch,
                "batches_in_epoch": batches_in_epoch,
                "nonfinite_streak": nonfinite_streak,
                "elapsed_s": elapsed_before + (time.perf_counter() - started),
                "interval": interval.state(),
                "rounding": _rounding_state(model),
            },
        )

    pending: list[PendingStep] = []  # steps taken whose losses are still on the device
    last_read: ReadStep | None = None

    def replay_pending() -> None:
        """Read the pending steps back (one transfer) and run the per-step checks and log records on them.

        On a divergence, `step` becomes the step that diverged (the steps queued after it are dropped).
        """
        nonlocal nonfinite_streak, interval, diverged_at, reason, step, last_read
        waited = time.perf_counter()
        entries = read_pending(pending)
        pending.clear()
        if entries:
            entries[-1].seconds += time.perf_counter() - waited  # the wait for the device belongs to the steps
        for entry in entries:
            last_read = entry
            interval.add(entry)
            nonfinite_streak = 0 if math.isfinite(entry.losses[0]) else nonfinite_streak + 1
            if nonfinite_streak > train.nonfinite_patience:
                diverged_at, reason = (
                    entry.step,
                    f"non-finite loss ({entry.losses[0]}) on {nonfinite_streak} consecutive steps",
                )
            elif entry.scale < train.min_loss_scale:
                diverged_at, reason = (
                    entry.step,
                    f"loss scale {entry.scale:g} fell below the floor {train.min_loss_scale:g}",
                )
            if entry.step % train.log_every == 0 or diverged_at is not None or (max_steps and entry.step >= max_steps):
                seconds = elapsed_before + (time.perf_counter() - started)
                metrics.append(
                    interval.record(entry, seconds, metrics[-1] if metrics else None, train, tasks, components)
                )
                progress.advance(entry.step, metrics[-1]["loss"], metrics[-1]["examples_per_s"])
                interval = LogInterval()
            if diverged_at is not None:
                step = entry.step
                return

    total_steps = max_steps or estimated_total_steps(train, source.n_train)
    progress.start(job.label, total_steps, step)
    started = time.perf_counter()
    diverged_at: int | None = None
    reason: str | None = None
    model.train()
    status = "finished"
    try:
        while epoch < epochs and diverged_at is None and not (max_steps and step >= max_steps):
            batches = training_batches(job, source, epoch, batches_in_epoch, fork_position)
            tick = time.perf_counter()
            for batch in batches:
                rows = int(batch.click.shape[0])
                batch, weight = world.shard(batch)
                batch = batch.to(device)
                sampling = monitor.sampling(step + 1) if monitor is not None else None
                factor = lr_factor(train, step + 1, total_steps)  # of the step alone: a resumed run takes the same
                for group in optimizer.param_groups:
                    group["lr"] = group["base_lr"] * factor
                losses = train_step(
                    trained,
                    batch,
                    optimizer,
                    scaler,
                    loss_fn,
                    device=device,
                    precision=train.precision,
                    sampling=sampling,
                    loss_weight=weight,
                )
                losses = world.mean_on_device(losses, weight)
                step += 1
                batches_in_epoch += 1
                if monitor is not None:
                    numerics.extend(monitor.drain())
                seconds = time.perf_counter() - tick
                pending.append(PendingStep.after(step, epoch, losses, scaler, rows, seconds, optimizer.grad_norm))
                at_end = bool(max_steps and step >= max_steps)
                checkpoint_due = bool(train.checkpoint_every and step % train.checkpoint_every == 0)
                if step % train.log_every == 0 or checkpoint_due or at_end:
                    replay_pending()
                if train.eval_every and step % train.eval_every == 0 and diverged_at is None:
                    progress.evaluating()
                    with autocast(
                        device, train.precision
                    ):  # into this step's record (eval_every is a multiple of log_every);
                        # every rank evaluates, so stochastic-rounding counters stay the same across
                        # a data-parallel group
                        metrics[-1]["heldout"] = held_out_metrics(
                            model, source, train.eval_batch_size, device, train.eval_slice, job.spec.tasks
                        )
                tick = time.perf_counter()
                if diverged_at is not None or at_end:
                    break
                if checkpoint_due:
                    save_checkpoint()
                if on_step is not None:
                    on_step(step)
            else:
                replay_pending()
                epoch += 1
                batches_in_epoch = 0
        if diverged_at is not None:
            status = "diverged"
        # a last record for a partial log interval at the end of training
        if interval.losses:
            closing = (
                last_read
                or read_pending([PendingStep.after(step, min(epoch, epochs - 1), torch.zeros(3), scaler, 0, 0.0)])[0]
            )
            seconds = elapsed_before + (time.perf_counter() - started)
            metrics.append(
                interval.record(closing, seconds, metrics[-1] if metrics else None, train, tasks, components)
            )
            interval = LogInterval()
        if status == "finished" and world.writes:
            save_checkpoint()
            progress.evaluating()
            with autocast(device, train.precision):
                arrays = evaluate_model(model, source, train.eval_batch_size, device, tasks=job.spec.tasks)
            io.write_npz(run_dir / EVAL, arrays)
        else:
            save_logs()
        result = RunResult(
            status=status,
            steps=step,
            wall_s=elapsed_before + (time.perf_counter() - started),
            diverged_at_step=diverged_at,
            reason=reason,
            skipped_steps=last_read.skipped
            if diverged_at is not None and last_read
            else int(getattr(scaler, "skipped_steps", 0)),
            resumed_from_step=resumed_from,
            step_ms=median_step_ms(metrics, train.batch_size),
            peak_memory_bytes=int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
            trained_with=trained_with(str(device)),
            health=summarize(metrics),
            recovered=recovered,
        )
        if world.writes:
            io.write_json(run_dir / DONE, result.to_dict())
    finally:
        progress.finish(status if run_is_done(run_dir) else "interrupted")
    return result
