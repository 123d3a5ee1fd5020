"""`mxlab bench host`: the host (Python) time of one emulated linear layer's forward + backward, as a ratio
to `nn.Linear` timed in the same run, on the CPU with the MX cast kernels' launches replaced by no-ops.

A step of a small layer on a GPU costs at least its host time: dispatch, views and launch arguments of
every cast, autograd, the GEMMs' host side. This bench isolates the part mxlab's Python adds. CPU
tensors take the Triton path (TRITON_INTERPRET=1 while it runs) and every launch only zeroes its outputs (time
left out of the figures), so nothing is computed: only the host time counts. Not in it: Triton's own
launch cost, CUDA's, and `qmatmul`'s exactness check of float32 operands (which runs, and synchronizes,
on CUDA only). The GEMMs run on the CPU at a small width (default 64), so they cost little.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from unittest import mock

import torch
from torch import nn

from mxlab.bench.cast_kernels import cast_kernels_replaced
from mxlab.bench.timing import best_host_us

DEFAULT_RECIPES = ("mxfp8-rceil", "mxfp8-hadamard", "fp8-tensor")


@dataclass
class HostMeasurement:
    """Best-of-loops host time of one forward + backward (microseconds) and its ratio to nn.Linear."""

    arm: str
    microseconds: float
    ratio: float


class LaunchStub:
    """Stands in for the @triton.jit cast kernels: `[grid](*args, **options)` zeroes the launch's output
    tensors (every tensor argument after the input) and returns. Left uninitialised, outputs can hold NaNs or
    subnormals that slow the CPU GEMMs after them by chance, and non-finite gradients make a loss scaler
    skip its steps. `launches` counts the launches, `fill_s` totals the seconds the zeroing took (what a
    timing leaves out)."""

    def __init__(self) -> None:
        self.launches = 0
        self.fill_s = 0.0

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs) -> None:
        self.launches += 1
        began = time.perf_counter()
        for value in args[1:]:
            if isinstance(value, torch.Tensor) and value.numel():
                value.zero_()
        self.fill_s += time.perf_counter() - began


@contextlib.contextmanager
def stubbed_cast_launches() -> Iterator[LaunchStub]:
    """The MX cast kernels' launches replaced by one `LaunchStub` (yielded), CPU tensors on the Triton path;
    restores both on exit."""
    stub = LaunchStub()
    with (
        cast_kernels_replaced(lambda kernel: stub),
        mock.patch.dict(os.environ, TRITON_INTERPRET="1", MXLAB_BACKEND="triton"),
    ):
        yield stub


def run_host_bench(
    recipes: Sequence[str] = DEFAULT_RECIPES,
    *,
    width: int = 64,
    tokens: int = 64,
    steps: int = 200,
    loops: int = 5,
    echo: Callable[[str], None] = print,
) -> list[HostMeasurement]:
    """Host time of `nn.Linear(width, width)` (BF16, the baseline) and of the same layer under each recipe
    (`apply_recipe`), forward + backward on (tokens, width) BF16 inputs; returns the measurements, baseline
    first, and prints them. Refuses (ValueError) sizes, steps or loops below 1 and what `load_recipe` refuses."""
    from mxlab.recipe import apply_recipe, load_recipe

    for name, value in (("width", width), ("tokens", tokens), ("steps", steps), ("loops", loops)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    loaded = [(name, load_recipe(name)) for name in recipes]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=generator, dtype=torch.float32).to(torch.bfloat16).requires_grad_(True)

    def layer_step(layer: nn.Module) -> Callable[[], None]:
        def step() -> None:
            layer(x).sum().backward()

        return step

    def linear() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(width, width)).to(torch.bfloat16)

    baseline = best_host_us(layer_step(linear()), steps, loops)
    results = [HostMeasurement("nn.Linear (bf16)", baseline, 1.0)]
    with stubbed_cast_launches() as stub:
        for name, recipe in loaded:
            model = linear()
            apply_recipe(model, recipe)
            microseconds = best_host_us(layer_step(model), steps, loops, excluded=lambda: stub.fill_s)
            results.append(HostMeasurement(f"QLinear {name}", microseconds, microseconds / baseline))
    echo(
        f"host time of one forward + backward, {tokens}x{width} BF16 input, cast launches stubbed "
        f"(best of {loops} x {steps} steps)"
    )
    for measurement in results:
        echo(f"  {measurement.arm:32s} {measurement.microseconds:8.0f} us  {measurement.ratio:5.2f}x")
    return results
