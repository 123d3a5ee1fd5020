"""The progress of a study on the terminal (rich): runs done of all with one ETA for the whole study, and one
live line per running run (its step, or "evaluating" while it evaluates).

The same on every executor: a run in this process reports through `run_progress(label)`; a run in
another process or on another host writes RUN/progress.json, which `poll` reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mxlab.experiment.worker import PROGRESS


def study_eta(elapsed_s: float, total_runs: int, done_runs: int, running: Iterable[float]) -> float | None:
    """Seconds left for the whole study: the elapsed time scaled by the share not yet done, the share done
    counting finished runs and each running run's fraction of its steps (clipped to [0, 1]); None before any
    progress."""
    done = done_runs + sum(min(max(float(f), 0.0), 1.0) for f in running)
    if done <= 0 or elapsed_s <= 0 or total_runs <= 0:
        return None
    return max(elapsed_s * (total_runs - done) / done, 0.0)


def format_duration(seconds: float | None) -> str:
    """'45 s', '3 min 05 s', '2 h 07 min'; '-' for None."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def run_state(step: int, total: int, phase: str = "training") -> str:
    """A run line's state: 'evaluating' while it evaluates, else 'step S/T'. Refuses an unknown phase."""
    if phase not in ("training", "evaluating"):
        raise ValueError(f"run phase {phase!r} is not one of ['training', 'evaluating']")
    return "evaluating" if phase == "evaluating" else f"step {step}/{total}"


class StudyProgress:
    """Runs done of all with the study's ETA, and per running run: its state, loss, examples/s."""

    def __init__(self, total_runs: int, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[state]}"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=Console(stderr=True, log_path=False),
            disable=not enabled,
        )
        self.study_task = self.progress.add_task("runs", total=total_runs, loss="-", speed="", state="", eta="")
        self.total_runs, self.done_runs, self.started = total_runs, 0, time.monotonic()
        self.lines: dict[str, Any] = {}
        self.fractions: dict[str, float] = {}
        self.enabled = enabled

    def __enter__(self) -> StudyProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def log(self, message: str) -> None:
        """Print one line above the live lines."""
        if self.enabled:
            self.progress.console.log(message)

    def study_eta_text(self) -> str:
        """'study ETA 3 min 05 s': the whole study's time left, from the runs done and the running runs' steps."""
        eta = study_eta(time.monotonic() - self.started, self.total_runs, self.done_runs, self.fractions.values())
        return f"study ETA {format_duration(eta)}"

    def update(
        self,
        label: str,
        step: int,
        total: int,
        loss: float | None,
        examples_per_s: float | None,
        phase: str = "training",
    ) -> None:
        """Show (or add) the live line of run `label`, and the study's ETA."""
        if label not in self.lines:
            self.lines[label] = self.progress.add_task(
                label, total=total, completed=step, loss="-", speed="", state="", eta=""
            )
        self.fractions[label] = step / total if total else 0.0
        self.progress.update(
            self.lines[label],
            total=total,
            completed=step,
            state=run_state(step, total, phase),
            loss="-" if loss is None else f"{loss:.4f}",
            speed="" if examples_per_s is None or phase == "evaluating" else f"{examples_per_s:,.0f} ex/s",
        )
        self.progress.update(self.study_task, eta=self.study_eta_text())

    def poll(self, label: str, run_dir: Path) -> None:
        """Update run `label`'s line from RUN/progress.json (no-op while there is none yet)."""
        try:
            state = json.loads((Path(run_dir) / PROGRESS).read_text())
        except (OSError, ValueError):
            return
        self.update(
            label,
            int(state.get("step", 0)),
            int(state.get("total", 0)),
            state.get("loss"),
            state.get("examples_per_s"),
            "evaluating" if state.get("phase") == "evaluating" else "training",
        )

    def run_done(self, label: str, status: str) -> None:
        """Remove run `label`'s line, count it done and log its outcome."""
        task = self.lines.pop(label, None)
        self.fractions.pop(label, None)
        if task is not None:
            self.progress.remove_task(task)
        self.done_runs += 1
        self.progress.advance(self.study_task)
        self.progress.update(self.study_task, eta=self.study_eta_text())
        self.log(f"{label}: {status}")

    def run_progress(self, label: str) -> _LineProgress:
        """A RunProgress (mxlab.experiment.train) that drives run `label`'s line from this process."""
        return _LineProgress(self, label)


class _LineProgress:
    def __init__(self, study: StudyProgress, label: str) -> None:
        self.study, self.label, self.total, self.step, self.loss = study, label, 0, 0, None

    def start(self, label: str, total_steps: int, start_step: int) -> None:
        self.total, self.step = total_steps, start_step
        self.study.update(self.label, start_step, total_steps, None, None)

    def advance(self, step: int, loss: float, examples_per_s: float) -> None:
        self.step, self.loss = step, loss
        self.study.update(self.label, step, self.total, loss, examples_per_s)

    def evaluating(self) -> None:
        self.study.update(self.label, self.step, self.total, self.loss, None, "evaluating")

    def finish(self, status: str) -> None:
        pass


def describe(result: Any) -> str:
    """One line for a RunResult: 'finished, 12 steps in 3.1 s', 'diverged at step 5 (...)', 'skipped: ...'."""
    if result.status in ("skipped", "failed"):
        return f"{result.status}: {result.reason}"
    if result.status == "diverged":
        return f"diverged at step {result.diverged_at_step} ({result.reason})"
    return f"{result.status}, {result.steps} steps in {result.wall_s:.1f} s"
