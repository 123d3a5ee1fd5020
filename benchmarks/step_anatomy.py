"""Where an emulated MX training step spends its memory, its host syncs and its GPU time, arm by arm.

An exploration for the training-step issue (not imported by the library): for each arm it builds the
model as `mxlab bench step` does, takes warm-up steps, then on one step records

- the tensors autograd keeps between the forward and the backward (saved_tensors_hooks), deduplicated
  by storage, summed by dtype and by the module whose forward saved them;
- on CUDA, the host synchronisations (torch.cuda.set_sync_debug_mode("warn")), each attributed to the
  innermost mxlab source line on the stack;
- the peak allocated memory of the step;

and, over `--profile-steps` steps, the GPU kernels by total time (torch.profiler).

    python3 benchmarks/step_anatomy.py --preset h200 --batch 4096 --max-history 1024 --json $OUT/anatomy.json
    python3 benchmarks/step_anatomy.py --device cpu --preset tiny --batch 64 --arms bf16,mxfp8-rceil   # a smoke test
"""

from __future__ import annotations

import argparse
import collections
import json
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from mxlab.bench.step import arm_stepper, bench_spec, device_batches
from mxlab.experiment.spec import recipe_dir_for, resolve_recipe_path
from mxlab.recipe import load_recipe

GIB = 2**30


def _module_stack(model: torch.nn.Module) -> tuple[list[str], list[Any]]:
    """A stack of the qualified names of the modules whose forward is running, kept by hooks."""
    stack: list[str] = []
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda _m, _a, name=name: stack.append(name or "<model>")))
        handles.append(
            module.register_forward_hook(lambda _m, _a, _o: (stack.pop(), None)[1])
        )  # None: output unchanged
    return stack, handles


def _sync_site(stack: list[traceback.FrameSummary], frames: int = 0) -> str:
    """The innermost mxlab line of the stack, or with `frames` its innermost lines whatever their module."""
    if frames:
        return " <- ".join(
            f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in reversed(stack[-frames:])
        )
    for frame in reversed(stack):
        if "/mxlab/" in frame.filename or "/kernels/" in frame.filename:
            return f"{frame.filename.split('/mxlab/')[-1].split('/kernels/')[-1]}:{frame.lineno} {frame.name}"
    return "(outside mxlab)"


def anatomy(
    spec: Any,
    arm: str,
    recipe: Any,
    info: Any,
    batches: list[Any],
    device: torch.device,
    warmup: int,
    profile_steps: int,
    stacks: int = 0,
    sync_frames: int = 0,
) -> dict[str, Any]:
    take, model, scaler = arm_stepper(spec, recipe, info, batches, device)
    for index in range(warmup):
        take(index)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)

    seen: set[tuple[int, int]] = set()
    by_dtype: collections.Counter = collections.Counter()
    by_module: collections.Counter = collections.Counter()
    stack, handles = _module_stack(model)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and storage.nbytes():
            seen.add(key)
            by_dtype[str(tensor.dtype)] += storage.nbytes()
            by_module[stack[-1] if stack else "<outside modules>"] += storage.nbytes()
        return tensor

    syncs: collections.Counter = collections.Counter()
    original_showwarning = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if "synchroniz" in str(message):
            syncs[_sync_site(traceback.extract_stack()[:-1], sync_frames)] += 1
        else:
            original_showwarning(message, category, filename, lineno, file, line)

    try:
        with warnings.catch_warnings(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            if cuda:  # catch_warnings restores the filters and showwarning on exit
                warnings.showwarning = record
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
            take(warmup)
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        for handle in handles:
            handle.remove()
    result: dict[str, Any] = {
        "arm": arm,
        "saved_gib": sum(by_dtype.values()) / GIB,
        "saved_by_dtype_gib": {key: value / GIB for key, value in by_dtype.most_common()},
        "saved_by_module_gib": {key: value / GIB for key, value in by_module.most_common(20)},
        "host_syncs": sum(syncs.values()),
        "host_syncs_by_line": dict(syncs.most_common(20)),
    }
    if cuda:
        torch.cuda.synchronize(device)
        result["step_peak_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        result["held_before_step_gib"] = before / GIB
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities, with_stack=stacks > 0) as profiler:
        for index in range(warmup + 1, warmup + 1 + profile_steps):
            take(index)
        if cuda:
            torch.cuda.synchronize(device)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = []
    for event in sorted(profiler.key_averages(), key=lambda e: getattr(e, sort), reverse=True)[:25]:
        rows.append(
            {
                "name": event.key[:90],
                "calls_per_step": event.count / profile_steps,
                "ms_per_step": getattr(event, sort) / 1e3 / profile_steps,
            }
        )
    result["top_kernels"] = rows
    if stacks:
        result["top_ops_by_stack"] = _ops_by_stack(profiler, cuda, profile_steps, stacks)
    del take, model, scaler
    if cuda:
        torch.cuda.empty_cache()
    return result


def _ops_by_stack(profiler: Any, cuda: bool, profile_steps: int, count: int) -> list[dict[str, Any]]:
    """The `count` (outermost aten op, calling mxlab lines) pairs with the most device (or CPU) time, the
    lines found by walking each op's parents up to the Python function events that with_stack records."""
    totals: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for event in profiler.events():
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (parent is not None and parent.name.startswith("aten::")):
            continue
        frames = []
        while parent is not None and len(frames) < 3:
            if ("mxlab/" in parent.name or "kernels/" in parent.name) and "(" in parent.name:
                frames.append(parent.name.split("mxlab/")[-1])
            parent = parent.cpu_parent
        key = (event.name, tuple(frames))
        totals[key] += event.device_time_total if cuda else event.cpu_time_total
        calls[key] += 1
    return [
        {
            "name": name,
            "calls_per_step": calls[(name, frames)] / profile_steps,
            "ms_per_step": total / 1e3 / profile_steps,
            "mxlab_frames": list(frames),
        }
        for (name, frames), total in totals.most_common(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="experiments/gem-synthetic.toml")
    parser.add_argument("--arms", default="bf16,mxfp8-rceil,mxfp8-rceil-sr")
    parser.add_argument("--preset", default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--max-history", type=int, default=None)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--stacks", type=int, default=0, help="also list this many aten ops by the mxlab lines calling them"
    )
    parser.add_argument(
        "--sync-frames",
        type=int,
        default=0,
        help="name each host sync by its innermost N stack lines, torch's included (default: the mxlab line)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    spec = bench_spec(
        Path(args.spec), preset=args.preset, batch_size=args.batch, max_history=args.max_history, batches=args.batches
    )
    batches, info = device_batches(spec, args.batches, device)
    recipe_dir = recipe_dir_for(Path(args.spec))
    results = []
    for arm in args.arms.split(","):
        recipe = load_recipe(spec.recipe_paths.get(arm) or resolve_recipe_path(arm, recipe_dir))
        result = anatomy(
            spec, arm, recipe, info, batches, device, args.warmup, args.profile_steps, args.stacks, args.sync_frames
        )
        results.append(result)
        print(
            f"\n== {arm}: saved for backward {result['saved_gib']:.2f} GiB "
            + " ".join(f"{k} {v:.2f}" for k, v in result["saved_by_dtype_gib"].items())
            + (f"; step peak {result['step_peak_gib']:.2f} GiB" if "step_peak_gib" in result else "")
            + f"; host syncs per step {result['host_syncs']}"
        )
        for name, gib in list(result["saved_by_module_gib"].items())[:10]:
            print(f"   saved {gib:7.3f} GiB  {name}")
        for line, count in list(result["host_syncs_by_line"].items())[:10]:
            print(f"   sync x{count:<4} {line}")
        for row in result["top_kernels"][:15]:
            print(f"   {row['ms_per_step']:8.2f} ms  x{row['calls_per_step']:<6g} {row['name']}")
        for row in result.get("top_ops_by_stack", []):
            print(
                f"   {row['ms_per_step']:8.2f} ms  x{row['calls_per_step']:<6g} "
                f"{row['name']:<22} {' <- '.join(row['mxlab_frames'])}"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
