"""Layer sensitivity: quantize one layer at a time, and all layers but one, and rank the layers.

For a recipe R and every quantizable module M of the spec's model, two short trainings per seed:
`only:M` (M under R, every other module BF16) and `allbut:M` (every module under R except M),
next to the spec's baseline arm and R on all layers, all through the study runner. Each run is
compared with the baseline of its seed on NE (in %) and AUC; layers are ranked by the NE
regression that quantizing them alone causes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mxlab import io
from mxlab.experiment.execution import INLINE, ExecutionOptions
from mxlab.experiment.executors import make_executor
from mxlab.experiment.executors.mps import check_mps_devices, mps_daemon
from mxlab.experiment.runner import check_out_dir, resolve_devices, run_phase
from mxlab.experiment.spec import ExperimentSpec, recipe_dir_for, resolve_recipe_path
from mxlab.experiment.study_jobs import arm_jobs, fork_jobs
from mxlab.experiment.train import RunJob, RunResult, build_run_model, estimated_total_steps
from mxlab.experiment.worker import make_data_source

DEFAULT_SWEEP_STEPS = 200


@dataclass
class LayerSensitivity:
    """One module's effect: deltas against the baseline (mean over seeds) for only-this and all-but-this."""

    module: str
    only: dict[str, float]
    allbut: dict[str, float]
    only_diverged: int
    allbut_diverged: int

    @property
    def score(self) -> float:
        """NE regression (mean over tasks, in %) of quantizing this module alone; the ranking key."""
        return self.only["ne_pct_mean"]


@dataclass
class SweepResult:
    """The ranked layers, the full-recipe deltas, and the files written."""

    recipe: str
    layers: list[LayerSensitivity]
    full_recipe: dict[str, float]
    markdown_path: Path
    json_path: Path
    table: str


def _recipe_for(name_or_path: str, spec: ExperimentSpec) -> tuple[Any, str, str]:
    from mxlab.recipe import load_recipe

    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        return load_recipe(path), path.stem, str(path)
    recipe_dir = recipe_dir_for(spec.spec_path) if spec.spec_path else Path("experiments/recipes")
    resolved = resolve_recipe_path(name_or_path, recipe_dir)
    return load_recipe(resolved), name_or_path, str(resolved)


def _ne_and_auc(eval_npz: Path) -> dict[str, dict[str, float]]:
    """{task: {ne, auc}} of one eval.npz (no per-user metrics: a short run's eval set may not support them)."""
    from mxlab.metrics import load_eval, task_metrics, task_views

    return {task: task_metrics(view.labels, view.probs) for task, view in task_views(load_eval(eval_npz)).items()}


def _run_deltas(run_dir: Path, baseline_dir: Path) -> dict[str, float] | None:
    """{ne_pct_TASK, auc_TASK} of a run against its seed's baseline; None when the run diverged."""
    if not (run_dir / "eval.npz").exists():
        return None
    run, base = _ne_and_auc(run_dir / "eval.npz"), _ne_and_auc(baseline_dir / "eval.npz")
    deltas = {}
    for task in run:
        deltas[f"ne_pct_{task}"] = 100.0 * (run[task]["ne"] - base[task]["ne"]) / base[task]["ne"]
        deltas[f"auc_{task}"] = run[task]["auc"] - base[task]["auc"]
    return deltas


def _baseline_noise_floor(baseline_dir: Path, seeds: Sequence[int]) -> float | None:
    """Mean |NE delta %| of the baseline of one seed against the baseline of another (all pairs, all tasks);
    None with one seed."""
    if len(seeds) < 2:
        return None
    metrics = {seed: _ne_and_auc(baseline_dir / f"seed{seed}" / "eval.npz") for seed in seeds}
    deltas = [
        abs(100.0 * (metrics[b][task]["ne"] - metrics[a][task]["ne"]) / metrics[a][task]["ne"])
        for index, a in enumerate(seeds)
        for b in seeds[index + 1 :]
        for task in metrics[a]
    ]
    return float(np.mean(deltas))


def _mean_deltas(per_seed: Sequence[dict[str, float] | None], tasks: Sequence[str]) -> tuple[dict[str, float], int]:
    """({ne_pct_TASK, auc_TASK} mean over the finished seeds, with ne_pct_mean and auc_mean over `tasks`; inf when
    none finished, the number diverged)."""
    finished = [deltas for deltas in per_seed if deltas is not None]
    diverged = len(per_seed) - len(finished)
    keys = [f"ne_pct_{task}" for task in tasks] + [f"auc_{task}" for task in tasks]
    mean = {key: float(np.mean([d[key] for d in finished])) if finished else math.inf for key in keys}
    mean["ne_pct_mean"] = float(np.mean([mean[f"ne_pct_{task}"] for task in tasks]))
    mean["auc_mean"] = float(np.mean([mean[f"auc_{task}"] for task in tasks]))
    return mean, diverged


def _format_table(
    recipe: str,
    layers: Sequence[LayerSensitivity],
    full: dict[str, float],
    seeds: Sequence[int],
    steps: int,
    noise_floor: float | None,
    warmup: str = "",
    task: str = "ctr",
) -> str:
    """The sweep's markdown table; AUC columns are `task`'s (the study's first task)."""
    auc, name = f"auc_{task}", f"{task.upper()} AUC"
    start = f" from the seed's {warmup} (the spec's fork design)" if warmup else " from scratch"
    lines = [
        f"# Layer sensitivity of `{recipe}`",
        "",
        f"{len(seeds)} seed(s) ({', '.join(map(str, seeds))}), "
        f"{steps} training steps per run{start}. Deltas against the "
        "baseline arm of the same seed, mean over seeds: NE in % (positive = worse), AUC absolute (negative = worse). "
        "`only` quantizes this module alone (every other module "
        "BF16); `all but` quantizes every module except this one. "
        "`recovers` is the NE the full recipe loses minus what "
        "all-but-this loses: what keeping this module in BF16 wins back.",
        "",
        f"Full recipe (every module quantized): NE {full['ne_pct_mean']:+.3f}% (mean over tasks), "
        f"{name} {full[auc]:+.5f}.",
        "",
        (
            "Noise floor: the baseline against itself under another "
            f"seed moves NE by {noise_floor:.3f}% (mean |delta| over "
            "tasks and seed pairs); layer deltas of that size are not distinguishable from seed noise."
            if noise_floor is not None
            else "Noise floor: not measured (one seed); run with several seeds (--seeds 0,1,2) "
            "before trusting small differences."
        ),
        "",
        f"| rank | module | only: NE % | only: {name} | all but: NE % | all but: {name} | recovers NE % | diverged |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for rank, layer in enumerate(layers, 1):
        recovers = full["ne_pct_mean"] - layer.allbut["ne_pct_mean"]
        diverged = (
            f"{layer.only_diverged} only, {layer.allbut_diverged} all-but"
            if layer.only_diverged or layer.allbut_diverged
            else ""
        )
        lines.append(
            f"| {rank} | `{layer.module}` | {layer.only['ne_pct_mean']:+.3f} | {layer.only[auc]:+.5f} | "
            f"{layer.allbut['ne_pct_mean']:+.3f} | {layer.allbut[auc]:+.5f} | {recovers:+.3f} | {diverged} |"
        )
    return "\n".join(lines) + "\n"


def _arm_folder(kind: str, module: str) -> str:
    return f"{kind}--{module.replace('/', '_')}"


def sweep_layers(
    spec: ExperimentSpec,
    recipe: str,
    *,
    seeds: Sequence[int] | None = None,
    steps: int | None = None,
    out_dir: str | Path | None = None,
    device: str = "auto",
    resume: bool = False,
    show_progress: bool = True,
    runs_per_device: int | None = None,
    mps: bool = False,
) -> SweepResult:
    """Run the layer-sensitivity sweep of `recipe` (a name in the spec's recipes/ folder or a .toml path).

    Returns the SweepResult, layers ranked by the NE regression of quantizing them alone (worst
    first); writes DIR/sweep/sweep.md and DIR/sweep/sweep.json (DIR defaults to reports/NAME).
    `steps` defaults to min(200, the spec's own length). In the fork design (`[train] fork_from`) every
    run continues from its seed's warm-up (DIR/sweep/runs/_fork/seedK, trained first), as the study's
    arms do. Runs go one at a time in this process on one device, or, with `runs_per_device` K (or
    several devices), K at once per device in worker processes; `mps` starts the CUDA MPS daemon so
    that runs sharing a GPU run side by side (as `mxlab run --mps`). Refuses an unknown recipe, seeds
    that are not integers >= 0, steps < 1, runs_per_device < 1, `mps` without CUDA, and an existing
    sweep without `resume`.
    """
    from mxlab.recipe import quantizable_modules, single_layer_recipe

    seeds = tuple(spec.seeds if seeds is None else seeds)
    if not seeds or any(isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 for seed in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {list(seeds)}")
    source = make_data_source(spec)
    if steps is None:
        steps = min(DEFAULT_SWEEP_STEPS, estimated_total_steps(spec.train, source.n_train))
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if runs_per_device is not None and runs_per_device < 1:
        raise ValueError(f"runs_per_device must be >= 1, got {runs_per_device}")
    quantized_recipe, recipe_name, recipe_source = _recipe_for(recipe, spec)
    steps_per_epoch = max(1, math.ceil(source.n_train / spec.train.batch_size))
    sweep_spec = dataclasses.replace(spec, seeds=seeds).with_train(
        max_steps=steps, epochs=math.ceil(steps / steps_per_epoch)
    )

    out_dir = Path(out_dir) if out_dir is not None else Path("reports") / spec.name
    sweep_dir = out_dir / "sweep"
    runs_root = sweep_dir / "runs"
    check_out_dir(sweep_spec, sweep_dir, resume, runs_root=runs_root, recorded="sweep_spec.json")

    from mxlab.recipe import load_recipe

    probe = RunJob(spec.baseline, seeds[0], load_recipe(spec.recipe_paths[spec.baseline]), "", runs_root, sweep_spec)
    probe_model, _ = build_run_model(probe, source.info)
    modules = list(quantizable_modules(probe_model, quantized_recipe))
    if not modules:
        raise ValueError("the model has no quantizable modules to sweep")
    del probe_model

    tag = {"sweep_recipe": recipe_name}
    arms: list[tuple[str, Any, str, dict[str, Any]]] = [
        (spec.baseline, probe.recipe, str(spec.recipe_paths[spec.baseline]), tag),
        (recipe_name, quantized_recipe, recipe_source, tag),
    ]
    for module in modules:
        for kind, invert, words in (("only", False, "only"), ("allbut", True, "all but")):
            arm_recipe = single_layer_recipe(quantized_recipe, module, invert=invert)
            arms.append((_arm_folder(kind, module), arm_recipe, f"{recipe_source} {words} {module}", tag))
    warmups = fork_jobs(sweep_spec, runs_root)
    jobs = arm_jobs(sweep_spec, runs_root, arms)
    devices = resolve_devices(device)
    one_by_one = len(devices) <= 1 and runs_per_device is None  # short runs: one at a time, in this process
    options = ExecutionOptions(executor=INLINE if one_by_one else "local", runs_per_device=runs_per_device, mps=mps)
    if mps:
        check_mps_devices(devices, "local")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    io.write_json(
        sweep_dir / "sweep_spec.json", {**sweep_spec.to_dict(), "sweep_recipe": recipe_source, "modules": modules}
    )
    with mps_daemon(mps):
        executor = make_executor(options, devices, spec.execution, source=source)
        results: dict[str, RunResult] = {}
        for phase in (warmups, jobs):  # a seed whose warm-up failed has nothing to continue from
            run_phase(phase, results, executor, show_progress=show_progress)

    def per_seed(arm: str) -> list[dict[str, float] | None]:
        return [
            _run_deltas(runs_root / arm / f"seed{seed}", runs_root / spec.baseline / f"seed{seed}") for seed in seeds
        ]

    baseline_missing = [seed for seed in seeds if not (runs_root / spec.baseline / f"seed{seed}" / "eval.npz").exists()]
    if baseline_missing:
        raise RuntimeError(
            f"the baseline arm {spec.baseline!r} diverged for seeds "
            f"{baseline_missing}; the sweep has nothing to compare against"
        )
    tasks = spec.task_names
    full, _ = _mean_deltas(per_seed(recipe_name), tasks)
    layers = []
    for module in modules:
        only, only_diverged = _mean_deltas(per_seed(_arm_folder("only", module)), tasks)
        allbut, allbut_diverged = _mean_deltas(per_seed(_arm_folder("allbut", module)), tasks)
        layers.append(LayerSensitivity(module, only, allbut, only_diverged, allbut_diverged))
    layers.sort(key=lambda layer: (-layer.score, layer.only["auc_mean"]))

    noise_floor = _baseline_noise_floor(runs_root / spec.baseline, seeds)
    warmup = f"{spec.train.fork_from} warm-up of {spec.train.fork_steps} steps" if warmups else ""
    table = _format_table(recipe_name, layers, full, seeds, steps, noise_floor, warmup, tasks[0])
    markdown_path, json_path = sweep_dir / "sweep.md", sweep_dir / "sweep.json"
    io.write_text(markdown_path, table)
    io.write_json(
        json_path,
        {
            "recipe": recipe_name,
            "recipe_source": recipe_source,
            "baseline": spec.baseline,
            "seeds": list(seeds),
            "steps": steps,
            "design": sweep_spec.design,
            "full_recipe": full,
            "noise_floor_ne_pct": noise_floor,
            "ranking": [
                {
                    "rank": rank,
                    "module": layer.module,
                    "only": layer.only,
                    "allbut": layer.allbut,
                    "only_diverged": layer.only_diverged,
                    "allbut_diverged": layer.allbut_diverged,
                }
                for rank, layer in enumerate(layers, 1)
            ],
        },
    )
    return SweepResult(recipe_name, layers, full, markdown_path, json_path, table)
