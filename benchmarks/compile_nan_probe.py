"""Where a compiled training step first goes non-finite: per arm, eager and `torch.compile`d, the losses of
each step and whether any output, gradient or parameter is non-finite, and the compiled forward's outputs
against eager mode's on the same weights before any step.

    python3 benchmarks/compile_nan_probe.py [--spec experiments/quickstart.toml] [--arms bf16,mxfp8-rceil]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mxlab.bench.step import arm_stepper, bench_spec, device_batches
from mxlab.experiment.spec import recipe_dir_for, resolve_recipe_path
from mxlab.recipe import load_recipe


def non_finite(tensors) -> list[str]:
    return [name for name, tensor in tensors if tensor is not None and not torch.isfinite(tensor).all()]


def outputs(model, batch, device, precision):
    from mxlab.experiment.step import autocast

    with torch.no_grad(), autocast(device, precision):
        result = model(batch)
    return result._asdict() if hasattr(result, "_asdict") else {"out": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="experiments/quickstart.toml")
    parser.add_argument("--arms", default="bf16,mxfp8-rceil")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--history", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    spec = bench_spec(Path(args.spec), batch_size=args.batch, max_history=args.history, batches=1)
    batches, info = device_batches(spec, 1, device)
    for arm in args.arms.split(","):
        recipe = load_recipe(spec.recipe_paths.get(arm) or resolve_recipe_path(arm, recipe_dir_for(Path(args.spec))))
        for compiled in (False, True):
            torch._dynamo.reset()
            take, model, scaler = arm_stepper(spec, recipe, info, batches, device, compiled)
            if compiled:
                eager = outputs(model, batches[0], device, spec.train.precision)
                fast = outputs(torch.compile(model), batches[0], device, spec.train.precision)
                for key in eager:
                    a, b = eager[key].float(), fast[key].float()
                    print(
                        f"{arm} compiled forward {key}: max |diff| {float((a - b).abs().nan_to_num(1e9).max()):.3g}, "
                        f"non-finite eager {int((~torch.isfinite(a)).sum())} compiled {int((~torch.isfinite(b)).sum())}"
                    )
                torch._dynamo.reset()
            for index in range(args.steps):
                losses = take(index)
                grads = non_finite((name, p.grad) for name, p in model.named_parameters())
                params = non_finite(model.named_parameters())
                print(
                    f"{arm} compiled={compiled} step {index}: losses {losses.tolist()} "
                    f"skipped {int(getattr(scaler, 'skipped_steps', 0))} non-finite grads {grads[:4]} "
                    f"({len(grads)}) params {params[:4]} ({len(params)})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
