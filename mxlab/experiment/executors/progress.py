"""The progress of a study on the terminal (rich): runs done of all, and one live line per running run.

The same on every executor: a run in this process reports through `run_progress(label)`; a run in
another process or on another host writes RUN/progress.json, which `poll` reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mxlab.experiment.worker import PROGRESS


class StudyProgress:
    """Runs done of all, and per running run: step of total, loss, examples/s, elapsed, ETA."""

    def __init__(self, total_runs: int, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True, log_path=False),
            disable=not enabled,
        )
        self.study_task = self.progress.add_task("runs", total=total_runs, loss="-", speed="")
        self.lines: dict[str, Any] = {}
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

    def update(self, label: str, step: int, total: int, loss: float | None, examples_per_s: float | None) -> None:
        """Show (or add) the live line of run `label`."""
        if label not in self.lines:
            self.lines[label] = self.progress.add_task(label, total=total, completed=step, loss="-", speed="")
        self.progress.update(
            self.lines[label],
            total=total,
            completed=step,
            loss="-" if loss is None else f"{loss:.4f}",
            speed="" if examples_per_s is None else f"{examples_per_s:,.0f} ex/s",
        )

    def poll(self, label: str, run_dir: Path) -> None:
        """Update run `label`'s line from RUN/progress.json (no-op while there is none yet)."""
        try:
            state = json.loads((Path(run_dir) / PROGRESS).read_text())
        except (OSError, ValueError):
            return
        self.update(
            label, int(state.get("step", 0)), int(state.get("total", 0)), state.get("loss"), state.get("examples_per_s")
        )

    def run_done(self, label: str, status: str) -> None:
        """Remove run `label`'s line, count it done and log its outcome."""
        task = self.lines.pop(label, None)
        if task is not None:
            self.progress.remove_task(task)
        self.progress.advance(self.study_task)
        self.log(f"{label}: {status}")

    def run_progress(self, label: str) -> _LineProgress:
        """A RunProgress (mxlab.experiment.train) that drives run `label`'s line from this process."""
        return _LineProgress(self, label)


class _LineProgress:
    def __init__(self, study: StudyProgress, label: str) -> None:
        self.study, self.label, self.total = study, label, 0

    def start(self, label: str, total_steps: int, start_step: int) -> None:
        self.total = total_steps
        self.study.update(self.label, start_step, total_steps, None, None)

    def advance(self, step: int, loss: float, examples_per_s: float) -> None:
        self.study.update(self.label, step, self.total, loss, examples_per_s)

    def finish(self, status: str) -> None:
        pass


def describe(result: Any) -> str:
    """One line for a RunResult: 'finished, 12 steps in 3.1 s', 'diverged at step 5 (...)', 'skipped: ...'."""
    if result.status in ("skipped", "failed"):
        return f"{result.status}: {result.reason}"
    if result.status == "diverged":
        return f"diverged at step {result.diverged_at_step} ({result.reason})"
    return f"{result.status}, {result.steps} steps in {result.wall_s:.1f} s"
