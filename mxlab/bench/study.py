"""`mxlab bench study`: a spec's arms timed at the spec's own sizes and runs per device, and the study's projected time.

Every training arm, and in the fork design the warm-up's recipe, trains `steps` steps from scratch in runs of the
spec's first K seeds at once on one device (K = runs per device; each run in its own worker process, as `mxlab
run` runs them; under CUDA MPS with `mps`), each run ending in its full evaluation. Per arm: the median over its
runs of each run's median time per step (done.json `step_ms`), its ratio to the baseline's, and the run's fixed
cost (its wall time less its steps at that time: start, data, evaluation, checkpoints). The projection: each
run of the spec (every seed's warm-up and arms) costs its fixed cost plus its steps at its arm's time per step;
K runs share a device, so the study takes the sum over runs / K on one device (GPU-hours: the same sum / K in
hours, per device), measured at K runs at once. A post-training arm trains no step and is projected at the
baseline's fixed cost.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mxlab.io import write_json


@dataclass
class ArmCost:
    """One arm's measured cost per run: ms per step (median over runs), fixed seconds, and its projected share."""

    arm: str
    runs: int  # runs of the spec this arm (or the warm-up) trains
    steps_per_run: int
    ms_per_step: float | None
    ratio: float | None  # to the baseline's ms per step
    fixed_s: float | None
    projected_s: float | None  # its runs' time on one device at K at once
    note: str = ""


def _timed_runs(spec: Any, arms: Sequence[str], out: Path, steps: int, runs_per_device: int, device: str, mps: bool):
    """{arm: [done.json of each run]} of `steps` steps from scratch of the spec's first K seeds per arm."""
    from mxlab.experiment.execution import ExecutionOptions
    from mxlab.experiment.executors import make_executor
    from mxlab.experiment.executors.mps import mps_daemon
    from mxlab.experiment.runner import run_jobs
    from mxlab.experiment.study_jobs import arm_jobs, recipe_arm
    from mxlab.io import read_json

    timing = dataclasses.replace(
        spec.with_train(fork_from="", fork_steps=0, max_steps=steps, lr_decay_steps=0, checkpoint_every=10**9),
        seeds=list(spec.seeds[:runs_per_device]),
    )
    paths = dict(spec.recipe_paths)
    if spec.train.fork_from:
        paths.setdefault(spec.train.fork_from, spec.fork_recipe_path)
    options = ExecutionOptions(executor="local", runs_per_device=runs_per_device, mps=mps)
    executor = make_executor(options, [device], spec.execution)
    done: dict[str, list[dict[str, Any]]] = {}
    with mps_daemon(mps):
        for arm in arms:
            jobs = arm_jobs(timing, out / "runs", [recipe_arm(arm, paths[arm])])
            run_jobs(jobs, executor, show_progress=False)
            done[arm] = [read_json(job.run_dir / "done.json") for job in jobs]
    return done


def run_study_bench(
    spec_path: Path,
    *,
    steps: int = 20,
    runs_per_device: int | None = None,
    device: str = "cuda",
    mps: bool = False,
    overrides: Sequence[str] = (),
    json_path: Path | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time the spec's arms (module docstring) and print per arm ms/step, the ratio to the baseline, the fixed
    cost per run and the projected study time. Returns {spec, device, steps, runs_per_device, arms: [ArmCost],
    projected_s, projected_gpu_hours}. `device`: cpu, cuda:N, cuda (the first GPU) or auto. Refuses (ValueError)
    steps < 1, runs per device < 1, an unknown device and a CUDA device on a machine without one."""
    from mxlab.experiment import load_spec
    from mxlab.experiment.run_job import estimated_total_steps
    from mxlab.experiment.runner import resolve_devices
    from mxlab.experiment.spec import post_training_recipe
    from mxlab.experiment.worker import make_data_source

    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    device = resolve_devices(device, gpus=1 if device in ("cuda", "auto") else 0)[0]  # workers need cuda:N
    spec = load_spec(spec_path, list(overrides))
    k = runs_per_device if runs_per_device is not None else (spec.execution.runs_per_device or 1)
    if k < 1:
        raise ValueError(f"--runs-per-device must be >= 1, got {k}")
    train = spec.train
    trained = [arm for arm in spec.arms if post_training_recipe(arm) is None]
    timed = list(dict.fromkeys([spec.baseline, *trained, *([train.fork_from] if train.fork_from else [])]))
    n_train = make_data_source(spec).n_train
    arm_steps = estimated_total_steps(train, n_train)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mxlab-bench-study-") as folder:
        done = _timed_runs(spec, timed, Path(folder), steps, k, device, mps)
    measured: dict[str, tuple[float | None, float | None, str]] = {}
    for arm, records in done.items():
        finished = [r for r in records if r.get("status") == "finished" and r.get("step_ms")]
        if not finished:
            reasons = sorted({str(r.get("reason") or r.get("status")) for r in records})
            measured[arm] = (None, None, "; ".join(reasons))
            continue
        ms = statistics.median(float(r["step_ms"]) for r in finished)
        fixed = statistics.median(
            max(0.0, float(r["wall_s"]) - int(r["steps"]) * float(r["step_ms"]) / 1e3) for r in finished
        )
        measured[arm] = (ms, fixed, "")
    base_ms = measured.get(spec.baseline, (None, None, ""))[0]

    def cost(arm: str, runs: int, steps_per_run: int, label: str | None = None) -> ArmCost:
        source = spec.baseline if post_training_recipe(arm) else arm
        ms, fixed, note = measured.get(source, (None, None, "not timed"))
        if post_training_recipe(arm):
            ms, note = None, "post-training: no steps; the baseline's fixed cost"
        ratio = ms / base_ms if ms is not None and base_ms else None
        projected = None if fixed is None else runs * (fixed + steps_per_run * (ms or 0.0) / 1e3) / k
        return ArmCost(label or arm, runs, steps_per_run, ms, ratio, fixed, projected, note)

    rows = []
    if train.fork_from:
        rows.append(cost(train.fork_from, len(spec.seeds), train.fork_steps, f"warm-up ({train.fork_from})"))
    rows += [cost(arm, len(spec.seeds), 0 if post_training_recipe(arm) else arm_steps) for arm in spec.arms]
    known = [row.projected_s for row in rows if row.projected_s is not None]
    total = sum(known) if len(known) == len(rows) else None
    result = {
        "spec": str(spec_path),
        "device": device,
        "steps": steps,
        "runs_per_device": k,
        "mps": mps,
        "bench_wall_s": round(time.perf_counter() - started, 1),
        "arms": [asdict(row) for row in rows],
        "projected_s": total,
        "projected_gpu_hours": None if total is None or not device.startswith("cuda") else total / 3600,
    }
    echo(format_study_bench(result))
    if json_path is not None:
        write_json(json_path, result)
    return result


def format_study_bench(result: dict[str, Any]) -> str:
    """The table `mxlab bench study` prints."""
    k = result["runs_per_device"]
    lines = [
        f"{result['spec']}: {result['steps']} steps per run, {k} runs at once on {result['device']}"
        + (" (MPS)" if result["mps"] else "")
        + f"; measured in {result['bench_wall_s']:.0f} s",
        f"{'arm':<28} {'runs':>5} {'steps/run':>10} {'ms/step':>9} {'x base':>7} {'fixed s':>8} {'projected':>10}",
    ]
    for row in result["arms"]:

        def number(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        lines.append(
            f"{row['arm']:<28} {row['runs']:>5} {row['steps_per_run']:>10} {number(row['ms_per_step'], '.1f'):>9} "
            f"{number(row['ratio'], '.2f'):>7} {number(row['fixed_s'], '.1f'):>8} "
            f"{number(None if row['projected_s'] is None else row['projected_s'] / 60, '.1f') + ' min':>10}"
            + (f"  {row['note']}" if row["note"] else "")
        )
    total = result["projected_s"]
    lines.append(
        "projected study: "
        + (
            "- (an arm could not be timed)"
            if total is None
            else f"{total / 60:.1f} min on one device at {k} runs at once"
        )
        + (f", {result['projected_gpu_hours']:.2f} GPU-hours" if result["projected_gpu_hours"] is not None else "")
    )
    return "\n".join(lines)
