"""`mxlab bench host`: the stub that stands in for the cast launches, and what its timing leaves out."""

import math

import pytest
import torch
from torch import nn

from mxlab.bench import timing
from mxlab.bench.host import run_host_bench, stubbed_cast_launches
from mxlab.recipe import apply_recipe, load_recipe


def test_the_stubbed_launches_zero_their_outputs_and_count_them():
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(64, 64))
    apply_recipe(layer, load_recipe("mxfp8-rceil"))
    x = torch.randn(32, 64, requires_grad=True)
    with stubbed_cast_launches() as stub:
        out = layer(x)
        out.sum().backward()
    assert stub.launches > 0 and stub.fill_s > 0
    # both operands of the forward GEMM come back as zeros: the output is the bias alone, and every gradient finite
    assert torch.equal(out, layer[0].bias.detach().expand_as(out))
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters()) and torch.isfinite(x.grad).all()


def test_the_host_time_leaves_out_what_excluded_counts(monkeypatch):
    clock = [0.0]
    left_out = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def step():
        clock[0] += 5e-6  # the host work measured
        clock[0] += 3e-6  # work the figure leaves out
        left_out[0] += 3e-6

    assert timing.best_host_us(step, steps=4, loops=2, excluded=lambda: left_out[0]) == pytest.approx(5.0)
    assert timing.best_host_us(step, steps=4, loops=2) == pytest.approx(8.0)


def test_the_bench_times_the_baseline_and_each_recipe_and_refuses_bad_sizes():
    results = run_host_bench(["mxfp8-rceil"], width=32, tokens=32, steps=2, loops=1, echo=lambda text: None)
    assert [r.arm for r in results] == ["nn.Linear (bf16)", "QLinear mxfp8-rceil"] and results[0].ratio == 1.0
    assert all(r.microseconds > 0 and math.isfinite(r.ratio) for r in results)
    with pytest.raises(ValueError, match="width must be >= 1, got 0"):
        run_host_bench(width=0)
