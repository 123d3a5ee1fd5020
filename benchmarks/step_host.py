"""The host side of a whole training step on the CPU, BF16 against MX arms, with the MX cast kernels' launches
stubbed out (mxlab.bench.host): how much of an MX step at a study's size is this project's Python around the
casts, and how many cast launches a step makes (each costs a Triton launch on a GPU, which the stub leaves out;
the stub zeroes each launch's outputs, and the seconds that takes are printed, inside the step's time).

An exploration for the study-throughput work (not imported by the library). The model runs eagerly on one CPU
thread at a small batch, so its own ops cost what their dispatch costs; the casts return at once. The MX arm's
extra time over BF16 is then the emulation's Python (operand views, validation, dispatch, autograd). The jagged
attention takes its reference path on the CPU (its Triton kernels do not run here), so attention emulation is
counted as reference ops, not as launches (it weighs most on stochastic-rounding arms, whose reference derives
each element's random bits); both arms pay the CPU's bfloat16-autocast GEMM mode (mxlab.nn.bf16_gemm), which a
GPU step does not have.

    python3 benchmarks/step_host.py --spec experiments/gem-mxfp8.toml --batch 8 --max-history 16
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mxlab.bench.host import stubbed_cast_launches
from mxlab.bench.step import arm_stepper, bench_spec, device_batches
from mxlab.recipe import load_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=Path("experiments/gem-mxfp8.toml"))
    parser.add_argument("--arm", action="append", help="MX arm (repeatable; default mxfp8-rceil)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-history", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed loop")
    parser.add_argument("--loops", type=int, default=3, help="timed loops (the best is reported)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = bench_spec(args.spec, batch_size=args.batch, max_history=args.max_history, batches=1, overrides=())
    cpu = torch.device("cpu")
    print(
        f"{args.spec}: model dim {spec.model['dim']}, {spec.model['layers']} layers, batch {args.batch}, histories "
        f"up to {args.max_history}; one CPU thread, MX cast launches stubbed (outputs zeroed); "
        f"best of {args.loops} x {args.steps} steps"
    )
    baseline_ms = None
    for arm in [spec.baseline, *(args.arm or ["mxfp8-rceil"])]:
        with stubbed_cast_launches() as counter:
            batches, info = device_batches(spec, 1, cpu)
            take, _, scaler = arm_stepper(spec, load_recipe(arm), info, batches, cpu)
            for index in range(3):
                take(index)
            counter.launches = 0
            take(0)
            launches = counter.launches
            best, fills = float("inf"), 0.0
            for _ in range(args.loops):
                counter.fill_s = 0.0
                began = time.perf_counter()
                for index in range(args.steps):
                    take(index)
                elapsed = (time.perf_counter() - began) / args.steps
                if elapsed < best:
                    best, fills = elapsed, counter.fill_s / args.steps
        ms, fill_ms = best * 1e3, fills * 1e3
        baseline_ms = baseline_ms or ms
        print(f"  {arm:<16} {ms:7.1f} ms / step  {ms / baseline_ms:5.2f}x  +{ms - baseline_ms:5.1f} ms  "
              f"{launches} cast launches / step, the stub's output fills {fill_ms:.1f} ms of it, "
              f"{int(getattr(scaler, 'skipped_steps', 0))} steps skipped by the loss scaler")  # fmt: skip


if __name__ == "__main__":
    main()
