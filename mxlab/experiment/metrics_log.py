"""The run's metrics.jsonl records: the losses and throughput of each log interval, and the step time
they give."""

from __future__ import annotations

import statistics
from typing import Any

from mxlab.experiment.step import ReadStep


def median_step_ms(records: list[dict[str, Any]], batch_size: int) -> float | None:
    """The median over metrics records of ms per step (batch_size / examples_per_s); None without a timed record."""
    times = [1000.0 * batch_size / r["examples_per_s"] for r in records if r.get("examples_per_s", 0) > 0]
    return statistics.median(times) if times else None


class LogInterval:
    """Loss sums and example counts since the last metrics record (part of the checkpoint)."""

    def __init__(self) -> None:
        self.losses: list[list[float]] = []
        self.steps: list[int] = []
        self.grad_norms: list[float] = []
        self.examples = 0
        self.seconds = 0.0

    def state(self) -> dict[str, Any]:
        return {
            "losses": self.losses,
            "examples": self.examples,
            "seconds": self.seconds,
            "steps": self.steps,
            "grad_norms": self.grad_norms,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.losses, self.examples, self.seconds = state["losses"], state["examples"], state["seconds"]
        self.steps, self.grad_norms = list(state.get("steps", [])), list(state.get("grad_norms", []))

    def mean(self, index: int) -> float:
        values = [entry[index] for entry in self.losses]
        return float(sum(values) / len(values)) if values else float("nan")

    def add(self, entry: ReadStep) -> None:
        """Count one step read back from the device."""
        self.losses.append(entry.losses)
        self.steps.append(entry.step)
        self.grad_norms.append(entry.grad_norm)
        self.examples += entry.examples
        self.seconds += entry.seconds

    def record(
        self,
        entry: ReadStep,
        time_s: float,
        previous: dict[str, Any] | None = None,
        train: Any = None,
        tasks: tuple[str, ...] = ("ctr", "ctcvr"),
        components: tuple[str, ...] = ("ctr", "ctcvr"),
    ) -> dict[str, Any]:
        """The metrics.jsonl record of this interval, ending at `entry`: mean losses (loss_C of each of the loss's
        `components` that `tasks` has), loss scale, throughput, and given `train` the health fields
        (mxlab.experiment.health; `previous`: the run's last record)."""
        from mxlab.experiment.health import interval_health

        health = {}
        if train is not None:
            losses = [values[0] for values in self.losses]
            health = interval_health(self.steps, losses, self.grad_norms, previous, train)
        return {
            "step": entry.step,
            "epoch": entry.epoch,
            "loss": self.mean(0),
            **{f"loss_{name}": self.mean(i + 1) for i, name in enumerate(components) if name in tasks},
            "loss_scale": entry.scale,
            "skipped": entry.skipped,
            "examples_per_s": self.examples / self.seconds if self.seconds > 0 else 0.0,
            "time_s": time_s,
            **health,
        }
