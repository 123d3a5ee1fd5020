"""`mxlab bench host` on the CPU: measures, restores the kernels and the environment, refuses bad sizes."""
import os

import pytest

pytest.importorskip("triton")

from mxlab.bench.host import run_host_bench, stubbed_cast_launches  # noqa: E402
from mxlab.numerics.quant import _import_kernels  # noqa: E402


def test_host_bench_times_the_baseline_and_each_recipe_and_restores_the_kernels():
    kernels = _import_kernels()
    before = {name: getattr(kernels, name) for name in ("_mx_kernel", "_mx_column_tile_kernel", "_mx_columns_kernel")}
    environment = {name: os.environ.get(name) for name in ("TRITON_INTERPRET", "MXLAB_BACKEND")}
    lines: list[str] = []
    results = run_host_bench(["mxfp8-rceil"], width=32, tokens=8, steps=2, loops=1, echo=lines.append)
    assert [result.arm for result in results] == ["nn.Linear (bf16)", "QLinear mxfp8-rceil"]
    assert results[0].ratio == 1.0 and results[1].microseconds > 0
    assert results[1].ratio == pytest.approx(results[1].microseconds / results[0].microseconds)
    assert len(lines) == 3 and "stubbed" in lines[0]
    assert {name: getattr(kernels, name) for name in before} == before
    assert {name: os.environ.get(name) for name in environment} == environment


def test_stubbed_launches_are_restored_after_an_error():
    kernels = _import_kernels()
    original = kernels._mx_kernel
    with pytest.raises(KeyError):
        with stubbed_cast_launches():
            assert kernels._mx_kernel is not original
            raise KeyError("inside")
    assert kernels._mx_kernel is original


def test_host_bench_refuses_bad_sizes():
    with pytest.raises(ValueError, match="width must be >= 1, got 0"):
        run_host_bench(["mxfp8-rceil"], width=0)
