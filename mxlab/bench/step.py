"""`mxlab bench step`: the whole training step of a spec's model, every arm against BF16 in one process.

What is timed is `mxlab.experiment.step.train_step`, the step `mxlab run` takes: forward under
the spec's autocast, the ESMM loss, the scaled backward, the loss scaler and the optimizer.
Each arm builds the model from the same seed, applies its recipe, and takes `warmup` steps and
then `steps` timed steps (CUDA events around the timed steps; `time.perf_counter` on the CPU)
over `batches` batches of the spec's data source, generated before any arm and kept on the
device, so the input pipeline is not timed. The spec's baseline arm runs first; every ratio
divides by it. Peak memory is `torch.cuda.max_memory_allocated` over the arm's steps (reset
before it; the previous arm's model, optimizer and cached blocks are freed first).

Model FLOPs per step are `mxlab.models.flops.model_flops(...).train_step` of the batches timed
(GEMMs 2 M N K, attention over useful pairs only, x3 for forward + backward); model TFLOP/s
divides them by the step time, MFU divides that by `peak_tflops` (default 989 TFLOP/s, dense
BF16 of an H100/H200 SXM). The warm-up should cover every batch once (`warmup >= batches`),
so first-call compilation of a new shape is not timed.

With `compile`, every arm is also timed with its model under `torch.compile` (default settings; the loss,
backward and optimizer as in eager mode), after the eager arm, each from an empty compile cache; the warm-up
steps compile it. Every ratio still divides by the eager baseline of the same run.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mxlab.io import write_json

DEFAULT_SPEC = Path("experiments/gem-synthetic.toml")
BF16_PEAK_TFLOPS = 989.0  # dense BF16, H100 / H200 SXM


@dataclass
class StepMeasurement:
    """One arm: ms per step, its ratio to the baseline, model TFLOP/s, MFU, peak memory (None: not measured)."""

    arm: str
    ms_per_step: float | None
    ratio_to_baseline: float | None
    model_tflops: float | None
    mfu: float | None
    peak_memory_gib: float | None
    last_loss: float | None
    skipped_steps: int = 0
    note: str = ""
    compiled: bool = False
    warmup_s: float | None = None  # wall time of the warm-up steps (with `compile`: the compilation)


def bench_spec(
    spec_path: Path,
    *,
    preset: str | None = None,
    batch_size: int | None = None,
    max_history: int | None = None,
    batches: int = 4,
    overrides: Sequence[str] = (),
) -> Any:
    """The ExperimentSpec to time: `spec_path` with `overrides` (`--set`), then the model size
    `preset`, `batch_size`, `max_history`, and train_examples = batch_size x batches.

    Refuses (ValueError) what `mxlab.experiment.load_spec` refuses (an unknown preset among them).
    """
    from mxlab.experiment import load_spec

    if batches < 1:
        raise ValueError(f"batches must be >= 1; got {batches}")
    changes = list(overrides)
    if preset is not None:
        changes.append(f'model.size="{preset}"')
    if max_history is not None:
        changes.append(f"model.max_history={int(max_history)}")
    if batch_size is not None:
        changes.append(f"train.batch_size={int(batch_size)}")
    spec = load_spec(spec_path, changes)
    return load_spec(spec_path, changes + [f"data.train_examples={spec.train.batch_size * batches}"])


def device_batches(spec: Any, batches: int, device: torch.device) -> tuple[list[Any], Any]:
    """The first `batches` training batches of the spec's source (seed 0, epoch 0) on `device`, and the
    source's info."""
    from mxlab.experiment.runner import make_data_source

    source = make_data_source(spec)
    iterator = source.train_batches(spec.train.batch_size, 0, 0)
    taken = [batch.to(device) for _, batch in zip(range(batches), iterator)]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return taken, source.info


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def arm_stepper(
    spec: Any, recipe: Any, info: Any, batches: Sequence[Any], device: torch.device, compile: bool = False
) -> tuple[Callable[[int], torch.Tensor], torch.nn.Module, Any]:
    """Build the model (seed 0) and apply `recipe`, with the spec's optimizer and the recipe's loss scaler;
    with `compile`, the steps call the model through `torch.compile(model)` (default settings).

    Returns (take, model, scaler): take(index) is one `train_step` on batches[index % len(batches)],
    returning its device-side losses.
    """
    from mxlab.experiment.optim import make_optimizer
    from mxlab.experiment.step import train_step
    from mxlab.models import build_model, esmm_loss
    from mxlab.recipe import apply_recipe
    from mxlab.recipe.loss_scaling import make_loss_scaler

    torch.manual_seed(0)
    model = build_model(spec.model, info)
    apply_recipe(model, recipe, seed=0)
    model.to(device).train()
    optimizer = make_optimizer(spec.train, model)
    scaler = make_loss_scaler(recipe.loss_scaling, model)
    forward = torch.compile(model) if compile else model

    def take(index: int) -> torch.Tensor:
        return train_step(
            forward,
            batches[index % len(batches)],
            optimizer,
            scaler,
            esmm_loss,
            device=device,
            precision=spec.train.precision,
        )

    return take, model, scaler


def time_arm(
    spec: Any,
    recipe: Any,
    info: Any,
    batches: Sequence[Any],
    device: torch.device,
    warmup: int,
    steps: int,
    compile: bool = False,
) -> tuple[float, int | None, float, int, float | None]:
    """Build the arm (`arm_stepper`, compiled with `compile` from an empty compile cache), take `warmup` then
    `steps` timed steps over `batches` in turn.

    Returns (ms per timed step, peak allocated bytes (None on the CPU), the last step's loss, skipped steps,
    seconds of the warm-up steps (None without any): building the model excluded, compiling it included).
    """
    if compile:
        torch._dynamo.reset()
    take, _, scaler = arm_stepper(spec, recipe, info, batches, device, compile)
    warming = time.perf_counter()
    for index in range(warmup):
        take(index)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    warmup_s = time.perf_counter() - warming if warmup else None
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for index in range(warmup, warmup + steps):
            losses = take(index)
        end.record()
        torch.cuda.synchronize(device)
        ms = start.elapsed_time(end) / steps
        peak: int | None = torch.cuda.max_memory_allocated(device)
    else:
        began = time.perf_counter()
        for index in range(warmup, warmup + steps):
            losses = take(index)
        ms = (time.perf_counter() - began) * 1e3 / steps
        peak = None
    return ms, peak, float(losses[0]), int(getattr(scaler, "skipped_steps", 0)), warmup_s


def run_step_bench(
    spec_path: Path = DEFAULT_SPEC,
    *,
    arms: Sequence[str] = (),
    preset: str | None = None,
    batch_size: int | None = None,
    max_history: int | None = None,
    overrides: Sequence[str] = (),
    warmup: int = 5,
    steps: int = 20,
    batches: int = 4,
    device: str = "cuda",
    peak_tflops: float = BF16_PEAK_TFLOPS,
    json_path: Path | None = None,
    echo: Callable[[str], None] = print,
    compile: bool = False,
) -> dict[str, Any]:
    """Time the training step of every arm (default: the spec's arms; the baseline always first); with `compile`,
    each arm eager and then compiled (see the module docstring), all as ratios to the eager baseline.

    Returns (and writes to `json_path` when given) {spec, device, model, batch_size, history
    (mean, max tokens per example), flops_per_step, peak_tflops, warmup, steps, batches, compile, torch,
    arms: [StepMeasurement as dict], complete}. Each row is echoed as it is measured and `json_path` rewritten
    with the rows so far (complete False until the last), so a run stopped part-way keeps what it measured.
    An arm whose backend cannot run on `device`, or that runs out of memory, gets a row with a note and no
    figures. Refuses (ValueError) an unknown arm,
    device "cuda" without CUDA, steps < 1, warmup < 0, peak_tflops <= 0.
    """
    from mxlab.experiment.spec import recipe_dir_for, resolve_recipe_path
    from mxlab.models.flops import model_flops
    from mxlab.recipe import load_recipe
    from mxlab.recipe.backends.te import recipe_unavailable_reason

    if steps < 1 or warmup < 0 or peak_tflops <= 0:
        raise ValueError(f"need steps >= 1, warmup >= 0, peak_tflops > 0; got {steps}, {warmup}, {peak_tflops}")
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available here; use --device cpu")
    spec = bench_spec(
        Path(spec_path),
        preset=preset,
        batch_size=batch_size,
        max_history=max_history,
        batches=batches,
        overrides=overrides,
    )
    names = [spec.baseline] + [arm for arm in (arms or spec.arms) if arm != spec.baseline]
    recipe_dir = recipe_dir_for(Path(spec_path))
    recipes = {arm: load_recipe(spec.recipe_paths.get(arm) or resolve_recipe_path(arm, recipe_dir)) for arm in names}
    if target.type == "cpu" and spec.train.cpu_threads:
        torch.set_num_threads(spec.train.cpu_threads)
    on_device, info = device_batches(spec, batches, target)
    lengths = [batch.history_lengths().cpu() for batch in on_device]
    timed = [index % len(on_device) for index in range(warmup, warmup + steps)]
    flops = sum(model_flops(spec.model, info, lengths[index]).train_step for index in timed) / steps
    rows: list[StepMeasurement] = []
    all_lengths = torch.cat(lengths)

    def result(complete: bool) -> dict[str, Any]:
        return {
            "spec": str(spec_path),
            "device": torch.cuda.get_device_name(target) if target.type == "cuda" else "cpu",
            "model": spec.model,
            "precision": spec.train.precision,
            "batch_size": spec.train.batch_size,
            "history": {"mean": float(all_lengths.double().mean()), "max": int(all_lengths.max())},
            "flops_per_step": flops,
            "peak_tflops": peak_tflops,
            "warmup": warmup,
            "steps": steps,
            "batches": len(on_device),
            "compile": compile,
            "torch": torch.__version__,
            "arms": [asdict(row) for row in rows],
            "complete": complete,
        }

    def measured(row: StepMeasurement) -> None:
        rows.append(row)
        echo(row_line(asdict(row)))
        if json_path is not None:
            write_json(Path(json_path), result(complete=False))

    for arm, compiled in [(arm, compiled) for arm in names for compiled in ((False, True) if compile else (False,))]:
        reason = recipe_unavailable_reason(recipes[arm], target)
        if reason is not None:
            measured(StepMeasurement(arm, None, None, None, None, None, None, note=reason, compiled=compiled))
            continue
        _free(target)
        if compiled:
            echo(f"{arm}: compiling (the {warmup} warm-up steps compile the model; minutes for the GEM model)...")
        try:
            ms, peak, loss, skipped, warmup_s = time_arm(
                spec, recipes[arm], info, on_device, target, warmup, steps, compiled
            )
        except RuntimeError as error:  # torch.cuda.OutOfMemoryError is one; a Triton launch says "out of memory"
            if not (isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()):
                raise
            note = f"out of memory: {str(error).splitlines()[0]}"
            measured(StepMeasurement(arm, None, None, None, None, None, None, note=note, compiled=compiled))
            continue
        finally:
            _free(target)
        tflops = flops / (ms * 1e-3) / 1e12
        baseline_ms = rows[0].ms_per_step if rows else ms
        measured(
            StepMeasurement(
                arm,
                ms,
                ms / baseline_ms if baseline_ms else None,
                tflops,
                tflops / peak_tflops,
                None if peak is None else peak / 2**30,
                loss,
                skipped,
                compiled=compiled,
                warmup_s=warmup_s,
            )
        )
    final = result(complete=True)
    echo(format_table(final))
    if json_path is not None:
        write_json(Path(json_path), final)
    return final


def row_line(row: dict[str, Any]) -> str:
    """One measured row as a progress line: arm, mode, ms per step and ratio (or the note), warm-up seconds."""
    mode = "compiled" if row.get("compiled") else "eager"
    if row["ms_per_step"] is None:
        return f"{row['arm']} ({mode}): {row['note']}"
    warm = f", warm-up {row['warmup_s']:.1f} s" if row.get("warmup_s") is not None else ""
    return f"{row['arm']} ({mode}): {row['ms_per_step']:.1f} ms / step, {row['ratio_to_baseline']:.2f}x baseline{warm}"


def format_table(result: dict[str, Any]) -> str:
    """The measurements of `run_step_bench` as a markdown table with a heading line."""

    def figure(value: float | None, pattern: str) -> str:
        return "-" if value is None else pattern.format(value)

    model = result["model"]
    lines = [
        f"Training step on {result['device']}: model {model.get('size')} "
        f"(dim {model.get('dim')}, {model.get('layers')} layers, "
        f"{model.get('heads')} heads, max_history {model.get('max_history')}), batch {result['batch_size']}, "
        f"history mean {result['history']['mean']:.0f} / max {result['history']['max']}, "
        f"{result['flops_per_step'] / 1e12:.3g} model TFLOP per step, MFU against {result['peak_tflops']:g} TFLOP/s; "
        f"{result['warmup']} warm-up + {result['steps']} timed steps; x baseline: ms / ms of the eager "
        f"{result['arms'][0]['arm'] if result['arms'] else 'baseline'} in this run",
        "",
        "| arm | mode | ms / step | x baseline | model TFLOP/s | MFU | peak GiB | warm-up s | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["arms"]:
        mode = "compiled" if row.get("compiled") else "eager"
        lines.append(
            f"| {row['arm']} | {mode} | {figure(row['ms_per_step'], '{:.1f}')} | "
            f"{figure(row['ratio_to_baseline'], '{:.2f}')} | "
            f"{figure(row['model_tflops'], '{:.3g}')} | {figure(row['mfu'], '{:.2%}')} | "
            f"{figure(row['peak_memory_gib'], '{:.1f}')} | {figure(row.get('warmup_s'), '{:.1f}')} | {row['note']} |"
        )
    return "\n".join(lines)


__all__ = [
    "BF16_PEAK_TFLOPS",
    "DEFAULT_SPEC",
    "StepMeasurement",
    "arm_stepper",
    "bench_spec",
    "device_batches",
    "format_table",
    "row_line",
    "run_step_bench",
    "time_arm",
]
