"""The host side of a whole training step on the CPU, BF16 against MX arms, with the MX cast kernels' launches
stubbed out (mxlab.bench.host): how much of an MX step at a study's size is this project's Python around the
casts, and how many cast launches a step makes (each costs a Triton launch on a GPU, which the stub leaves out).

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
import os
import time
from pathlib import Path
from unittest import mock

import torch

from mxlab.bench.cast_kernels import cast_kernels_replaced
from mxlab.bench.step import arm_stepper, bench_spec, device_batches
from mxlab.recipe import load_recipe


class CountingLaunch:
    """Stands in for a @triton.jit cast kernel: `[grid](...)` counts the launch and returns at once."""

    def __init__(self) -> None:
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs) -> None:
            self.launches += 1

        return launch


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
    counter = CountingLaunch()
    print(
        f"{args.spec}: model dim {spec.model['dim']}, {spec.model['layers']} layers, batch {args.batch}, histories "
        f"up to {args.max_history}; one CPU thread, MX cast launches stubbed; best of {args.loops} x {args.steps} steps"
    )
    baseline_ms = None
    for arm in [spec.baseline, *(args.arm or ["mxfp8-rceil"])]:
        with (
            cast_kernels_replaced(lambda kernel: counter),
            mock.patch.dict(os.environ, TRITON_INTERPRET="1", MXLAB_BACKEND="triton"),
        ):
            batches, info = device_batches(spec, 1, cpu)
            take, _, _ = arm_stepper(spec, load_recipe(arm), info, batches, cpu)
            for index in range(3):
                take(index)
            counter.launches = 0
            take(0)
            launches = counter.launches
            best = float("inf")
            for _ in range(args.loops):
                began = time.perf_counter()
                for index in range(args.steps):
                    take(index)
                best = min(best, (time.perf_counter() - began) / args.steps)
        ms = best * 1e3
        baseline_ms = baseline_ms or ms
        print(f"  {arm:<16} {ms:7.1f} ms / step  {ms / baseline_ms:5.2f}x  +{ms - baseline_ms:5.1f} ms  "
              f"{launches} cast launches / step")  # fmt: skip


if __name__ == "__main__":
    main()
