"""One run: build the model for a seed, apply the arm's recipe, train, evaluate, write the run folder.

The run folder (docs/INTERFACES.md, "Study folder") is written atomically file by file;
`done.json` comes last. A run with a checkpoint resumes from it and produces exactly what an
uninterrupted run produces: the checkpoint holds the model, optimizer, loss scaler, every RNG
state, the step, the data position (epoch, batches consumed in it) and the partial log interval.

`train_run` is four phases over one `TrainingRun` (the run's state): setup (the model, optimizer,
loss scaler, config files), resume (a checkpoint of its own, or the fork it starts from), the loop
(steps, reads, checks, checkpoints) and finish (the last record, evaluation, done.json). The model
factory and the loss are parameters (default: the spec's builder through `mxlab.models.build`, and
`mxlab.models.loss_for` of its [tasks]).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mxlab import io
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
from mxlab.experiment.run_job import (
    DONE,
    EVAL,
    METRICS,
    NUMERICS,
    RunJob,
    RunProgress,
    RunResult,
    SilentProgress,
    StepHook,
    estimated_total_steps,
    run_is_done,
    schedule_steps,
    step_limits,
)
from mxlab.experiment.step import PendingStep, ReadStep, autocast, read_pending, train_step
from mxlab.experiment.training_recipe import set_output_biases
from mxlab.models import build, loss_components, loss_for

ModelFactory = Callable[[dict[str, Any], Any], torch.nn.Module]  # (model_config, DataInfo) -> model
LossFunction = Callable[[Any, Any], dict[str, torch.Tensor]]  # (model output, batch) -> {"loss": total, ...}
# The torch.compile backend of a run with [train] compile: None is torch's default (Inductor). Internal: tests set
# "aot_eager" (or a counting backend) to compare a compiled run's bits with an eager run's without Inductor.
COMPILE_BACKEND: str | Callable[..., Any] | None = None


def build_run_model(job: RunJob, info: Any, model_factory: ModelFactory | None = None) -> tuple[torch.nn.Module, Any]:
    """Build the model with torch.manual_seed(job.seed) (same init for every arm of a seed), set its output
    biases (train.output_bias), then apply the recipe. Returns (model on the CPU, plan).
    `model_factory(model_config, info)` builds the model (default: the spec's [model] and [tasks] through
    mxlab.models.build, which refuses what it cannot build).
    """
    from mxlab.recipe import apply_recipe  # here, not at import: mxlab.recipe loads the MX emulation

    if model_factory is None:

        def model_factory(config: Any, info: Any) -> torch.nn.Module:
            return build(config, info, job.spec.tasks)

    torch.manual_seed(job.seed)
    np.random.seed(job.seed)
    random.seed(job.seed)
    model = model_factory(job.spec.model, info)
    set_output_biases(model, info, job.spec.train.output_bias)
    plan = apply_recipe(model, job.recipe, seed=job.seed)
    return model, plan


def compiled_module(module: torch.nn.Module) -> torch.nn.Module:
    """`torch.compile(module)` with torch's default settings (COMPILE_BACKEND's backend where set), from an empty
    compile cache: each run compiles its own model, so the graphs of runs before it in the same process (the inline
    executor, a reused worker) neither guard its calls nor count toward torch's recompile limit. The compiled
    module shares `module`'s parameters and buffers; only its state_dict keys differ (an `_orig_mod.` prefix), so
    a run saves and loads the plain model's state."""
    import torch._dynamo  # here: only a compiled run pays its import

    torch._dynamo.reset()
    return torch.compile(module) if COMPILE_BACKEND is None else torch.compile(module, backend=COMPILE_BACKEND)


class TrainingRun:
    """One run's state from setup to finish: the model, optimizer, loss scaler and monitor, the data position
    (step, epoch, batches taken in the epoch), the log records and the divergence checks' state.

    Constructing it is the setup (nothing trained), `resume` continues a checkpoint or a fork, `loop`
    trains, `finish` evaluates and writes done.json.
    """

    def __init__(
        self,
        job: RunJob,
        source: Any,
        device: torch.device,
        *,
        progress: RunProgress,
        world: World,
        model_factory: ModelFactory | None,
        loss: LossFunction,
    ) -> None:
        """Set the run up: its model built and its recipe applied, config.json, plan.json and plan.txt written
        (rank 0); nothing trained."""
        from mxlab.recipe.loss_scaling import make_loss_scaler

        self.job, self.source, self.device, self.progress, self.world = job, source, device, progress, world
        self.loss, self.run_dir, self.train = loss, Path(job.run_dir), job.spec.train
        self.components = loss_components(job.spec.tasks)  # the loss parts each metrics record carries
        if world.writes:
            (self.run_dir / DONE).unlink(missing_ok=True)  # a "skipped" or "failed" record of an earlier try
        if device.type == "cpu" and self.train.cpu_threads:
            torch.set_num_threads(self.train.cpu_threads)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.model, self.plan = build_run_model(job, source.info, model_factory)
        self.model.to(device)
        # the module the training step calls (DDP in a group, compiled with train.compile). Evaluation stays eager on
        # self.model: eval mode, no gradients and its own batch sizes would be graphs of their own compiled for a
        # pass made once per eval, and eager, eval.npz depends on the weights alone; checkpoints, resume and fork
        # starts also use self.model (plain state_dict keys)
        self.trained = world.wrap(self.model)
        if self.train.compile:
            self.trained = compiled_module(self.trained)
        self.optimizer = make_optimizer(self.train, self.model)
        self.scaler = make_loss_scaler(job.recipe.loss_scaling, self.model)
        self.monitor = None
        if self.train.diagnostics_every:
            from mxlab.recipe.diagnostics import NumericsMonitor

            self.monitor = NumericsMonitor(self.model, every=self.train.diagnostics_every)
        self.step, self.epoch, self.batches_in_epoch = 0, 0, 0
        self.nonfinite_streak, self.elapsed_before = 0, 0.0
        self.metrics: list[dict[str, Any]] = []
        self.numerics: list[dict[str, Any]] = []
        self.interval = LogInterval()
        self.resumed_from: int | None = None
        self.recovered: str | None = None
        self.fork_position: tuple[int, int] | None = None  # the fork warm-up's (epoch, batches taken in it)
        self.max_steps, self.epochs = step_limits(job, source.n_train)
        self.total_steps = schedule_steps(job, source.n_train)
        self.pending: list[PendingStep] = []  # steps taken whose losses are still on the device
        self.last_read: ReadStep | None = None
        self.diverged_at: int | None = None
        self.reason: str | None = None
        self.status = "finished"
        self.started = time.perf_counter()
        self._write_config()

    def _write_config(self) -> None:
        job = self.job
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "arm": job.arm,
            "seed": job.seed,
            "data_order_seed": data_order_seed(job),
            "recipe": job.recipe_source,
            "device": str(self.device),
            "data": job.spec.data,
            "model": job.spec.model,
            "train": job.spec.to_dict()["train"],
            "study": job.spec.name,
            "world_size": self.world.size,
            "fork": None if job.fork_dir is None else {"from": str(job.fork_dir), "post_training": job.post_training},
            **job.extra_config,
        }
        if self.world.writes:
            io.write_json(self.run_dir / "config.json", config)
            io.write_json(self.run_dir / "plan.json", self.plan.to_dict())
            io.write_text(self.run_dir / "plan.txt", self.plan.table() + "\n")

    def resume(self) -> None:
        """Continue from the run's own checkpoint (model, optimizer, scaler, RNGs, data position, logs), else
        from the run it forks from (`start_from_fork`); from scratch when it has neither."""
        from mxlab.recipe import load_rounding_state

        job, model = self.job, self.model
        checkpoint, self.recovered = load_resume_checkpoint(self.run_dir)
        if checkpoint is not None:
            model.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.scaler.load_state_dict(checkpoint["scaler"])
            self.step, self.epoch = checkpoint["step"], checkpoint["epoch"]
            self.batches_in_epoch = checkpoint["batches_in_epoch"]
            self.nonfinite_streak, self.elapsed_before = checkpoint["nonfinite_streak"], checkpoint["elapsed_s"]
            self.interval.load(checkpoint["interval"])
            self.metrics = [record for record in io.read_jsonl(self.run_dir / METRICS) if record["step"] <= self.step]
            self.numerics = [record for record in io.read_jsonl(self.run_dir / NUMERICS) if record["step"] <= self.step]
            restore_rng(checkpoint["rng"])
            load_rounding_state(model, checkpoint["rounding"])
            self.resumed_from = self.step
            self.fork_position = fork_data_position(job.fork_dir) if job.fork_dir is not None else None
        elif job.fork_dir is not None:
            optimizer = None if job.post_training else self.optimizer
            self.step, self.epoch, self.batches_in_epoch = start_from_fork(job.fork_dir, model, optimizer)
            self.fork_position = (self.epoch, self.batches_in_epoch)

    def seconds(self) -> float:
        """Training seconds so far, over every attempt of the run."""
        return self.elapsed_before + (time.perf_counter() - self.started)

    def save_logs(self) -> None:
        if not self.world.writes:
            return
        io.write_jsonl(self.run_dir / METRICS, self.metrics)
        if self.monitor is not None:
            io.write_jsonl(self.run_dir / NUMERICS, self.numerics)

    def save_checkpoint(self) -> None:
        from mxlab.recipe import rounding_state

        self.save_logs()  # logs first: a crash in between leaves logs ahead of the checkpoint, trimmed on resume
        if not self.world.writes:
            return
        write_checkpoint(
            self.run_dir / CHECKPOINT,
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng_state(),
                "step": self.step,
                "epoch": self.epoch,
                "batches_in_epoch": self.batches_in_epoch,
                "nonfinite_streak": self.nonfinite_streak,
                "elapsed_s": self.seconds(),
                "interval": self.interval.state(),
                "rounding": rounding_state(self.model),
            },
        )

    def replay_pending(self) -> None:
        """Read the pending steps back (one transfer) and run the per-step checks and log records on them.

        On a divergence, `step` becomes the step that diverged (the steps queued after it are dropped).
        """
        train = self.train
        waited = time.perf_counter()
        entries = read_pending(self.pending)
        self.pending.clear()
        if entries:
            entries[-1].seconds += time.perf_counter() - waited  # the wait for the device belongs to the steps
        for entry in entries:
            self.last_read = entry
            self.interval.add(entry)
            self.nonfinite_streak = 0 if math.isfinite(entry.losses[0]) else self.nonfinite_streak + 1
            if self.nonfinite_streak > train.nonfinite_patience:
                self.diverged_at = entry.step
                self.reason = f"non-finite loss ({entry.losses[0]}) on {self.nonfinite_streak} consecutive steps"
            elif entry.scale < train.min_loss_scale:
                self.diverged_at = entry.step
                self.reason = f"loss scale {entry.scale:g} fell below the floor {train.min_loss_scale:g}"
            at_end = bool(self.max_steps and entry.step >= self.max_steps)
            if entry.step % train.log_every == 0 or self.diverged_at is not None or at_end:
                self._record(entry)
                self.progress.advance(entry.step, self.metrics[-1]["loss"], self.metrics[-1]["examples_per_s"])
            if self.diverged_at is not None:
                self.step = entry.step
                return

    def _record(self, entry: ReadStep) -> None:
        """Close the log interval at `entry` into a metrics record."""
        previous = self.metrics[-1] if self.metrics else None
        tasks = source_tasks(self.source, self.job.spec.tasks)
        self.metrics.append(self.interval.record(entry, self.seconds(), previous, self.train, tasks, self.components))
        self.interval = LogInterval()

    def loop(self, on_step: StepHook | None = None) -> None:
        """Train until the step cap, the epoch bound or a divergence; `on_step(step)` after every step (after its
        checkpoint)."""
        train, device, optimizer, monitor = self.train, self.device, self.optimizer, self.monitor
        self.progress.start(self.job.label, self.max_steps or self.total_steps, self.step)
        self.started = time.perf_counter()
        self.model.train()
        while self.epoch < self.epochs and self.diverged_at is None and not self._at_cap():
            batches = training_batches(self.job, self.source, self.epoch, self.batches_in_epoch, self.fork_position)
            tick = time.perf_counter()
            for batch in batches:
                rows = int(batch.click.shape[0])
                batch, weight = self.world.shard(batch)
                batch = batch.to(device)
                sampling = monitor.sampling(self.step + 1) if monitor is not None else None
                factor = lr_factor(train, self.step + 1, self.total_steps)  # of the step alone: resumes agree
                for group in optimizer.param_groups:
                    group["lr"] = group["base_lr"] * factor
                losses = train_step(
                    self.trained,
                    batch,
                    optimizer,
                    self.scaler,
                    self.loss,
                    device=device,
                    precision=train.precision,
                    sampling=sampling,
                    loss_weight=weight,
                )
                losses = self.world.mean_on_device(losses, weight)
                self.step += 1
                self.batches_in_epoch += 1
                if monitor is not None:
                    self.numerics.extend(monitor.drain())
                seconds = time.perf_counter() - tick
                self.pending.append(
                    PendingStep.after(self.step, self.epoch, losses, self.scaler, rows, seconds, optimizer.grad_norm)
                )
                at_end = self._at_cap()
                checkpoint_due = bool(train.checkpoint_every and self.step % train.checkpoint_every == 0)
                if self.step % train.log_every == 0 or checkpoint_due or at_end:
                    self.replay_pending()
                if train.eval_every and self.step % train.eval_every == 0 and self.diverged_at is None:
                    self.progress.evaluating()
                    # into this step's record (eval_every is a multiple of log_every); every rank evaluates, so
                    # stochastic-rounding counters stay the same across a data-parallel group
                    with autocast(device, train.precision):
                        self.metrics[-1]["heldout"] = held_out_metrics(
                            self.model,
                            self.source,
                            train.eval_batch_size,
                            device,
                            train.eval_slice,
                            self.job.spec.tasks,
                        )
                tick = time.perf_counter()
                if self.diverged_at is not None or at_end:
                    break
                if checkpoint_due:
                    self.save_checkpoint()
                if on_step is not None:
                    on_step(self.step)
            else:
                self.replay_pending()
                self.epoch += 1
                self.batches_in_epoch = 0

    def _at_cap(self) -> bool:
        return bool(self.max_steps and self.step >= self.max_steps)

    def finish(self) -> RunResult:
        """Close the last partial log interval, evaluate a finished run (eval.npz) or keep a diverged one's logs,
        write done.json (rank 0); returns its RunResult."""
        train, device, scaler = self.train, self.device, self.scaler
        if self.diverged_at is not None:
            self.status = "diverged"
        if self.interval.losses:  # a last record for a partial log interval at the end of training
            closing = (
                self.last_read
                or read_pending(
                    [PendingStep.after(self.step, min(self.epoch, self.epochs - 1), torch.zeros(3), scaler, 0, 0.0)]
                )[0]
            )
            self._record(closing)
        if self.status == "finished" and self.world.writes:
            self.save_checkpoint()
            self.progress.evaluating()
            with autocast(device, train.precision):
                arrays = evaluate_model(
                    self.model, self.source, train.eval_batch_size, device, tasks=self.job.spec.tasks
                )
            io.write_npz(self.run_dir / EVAL, arrays)
        else:
            self.save_logs()
        diverged = self.diverged_at is not None and self.last_read
        result = RunResult(
            status=self.status,
            steps=self.step,
            wall_s=self.seconds(),
            diverged_at_step=self.diverged_at,
            reason=self.reason,
            skipped_steps=self.last_read.skipped if diverged else scaler.skipped_steps,
            resumed_from_step=self.resumed_from,
            step_ms=median_step_ms(self.metrics, train.batch_size),
            peak_memory_bytes=int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
            trained_with=trained_with(str(device)),
            health=summarize(self.metrics),
            recovered=self.recovered,
        )
        if self.world.writes:
            io.write_json(self.run_dir / DONE, result.to_dict())
        return result


def _skipped(job: RunJob, device: torch.device, progress: RunProgress, world: World) -> RunResult | None:
    """The "skipped" RunResult (written to done.json) when a backend of the arm's recipe cannot run on `device`
    (mxlab.recipe.unavailable_reason); None when it can."""
    from mxlab.recipe import unavailable_reason

    reason = unavailable_reason(job.recipe, device)
    if reason is None:
        return None
    result = RunResult(status="skipped", steps=0, wall_s=0.0, reason=reason)
    if world.writes:
        Path(job.run_dir).mkdir(parents=True, exist_ok=True)
        io.write_json(Path(job.run_dir) / DONE, result.to_dict())
    progress.finish("skipped")
    return result


def train_run(
    job: RunJob,
    source: Any,
    device: torch.device | str,
    *,
    progress: RunProgress | None = None,
    on_step: StepHook | None = None,
    world: World | None = None,
    model_factory: ModelFactory | None = None,
    loss: LossFunction | None = None,
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
    A recipe that a backend cannot run on `device` (mxlab.recipe.unavailable_reason) is recorded as
    skipped, with the reason, before the model is built (done.json status "skipped").
    In a data-parallel group (`world`, mxlab.experiment.distributed) each rank trains on its shard
    of every batch and only rank 0 writes the run folder.
    `model_factory(model_config, info) -> nn.Module` and `loss(output, batch) -> {"loss": ..., ...}` default to
    the spec's [model] builder (mxlab.models.build) and the loss of its [tasks] (mxlab.models.loss_for).
    With train.compile the steps call the model through `compiled_module` (torch.compile); the rest is as above.
    """
    run_dir = Path(job.run_dir)
    if run_is_done(run_dir):
        raise ValueError(f"{run_dir} already has {DONE}; remove it to run {job.label} again")
    progress = progress or SilentProgress()
    world = world or World()
    device = torch.device(device)
    skipped = _skipped(job, device, progress, world)
    if skipped is not None:
        return skipped
    if loss is None:
        loss = loss_for(job.spec.tasks)
    run = TrainingRun(job, source, device, progress=progress, world=world, model_factory=model_factory, loss=loss)
    run.resume()
    try:
        run.loop(on_step)
        return run.finish()
    finally:
        progress.finish(run.status if run_is_done(run_dir) else "interrupted")


__all__ = [
    "DONE",
    "EVAL",
    "METRICS",
    "NUMERICS",
    "LossFunction",
    "ModelFactory",
    "RunJob",
    "RunProgress",
    "RunResult",
    "SilentProgress",
    "StepHook",
    "TrainingRun",
    "build_run_model",
    "compiled_module",
    "estimated_total_steps",
    "run_is_done",
    "step_limits",
    "train_run",
]
