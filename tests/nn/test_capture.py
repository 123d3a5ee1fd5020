"""Emulated MX layers under CUDA-graph capture: a deterministic recipe's layer replays its eager bits; a layer
whose calls draw seeds (stochastic rounding, random Hadamard) refuses to be captured."""

import pytest
import torch
from torch import nn

from mxlab.nn.precision import GemmQuant, MatmulPrecision, OperandQuant
from mxlab.recipe import apply_recipe, load_recipe


def _precision(rounding: str = "nearest_even", hadamard=None) -> MatmulPrecision:
    operand = OperandQuant("e4m3", 32, "rceil")
    grad = OperandQuant("e4m3", 32, "rceil", rounding)
    return MatmulPrecision(
        GemmQuant(operand, operand, hadamard), GemmQuant(grad, operand), GemmQuant(operand, grad), name="layer"
    )


def test_seeds_are_refused_only_while_a_graph_is_captured_and_only_where_a_call_draws_them(monkeypatch):
    deterministic, stochastic, hadamard = _precision(), _precision("stochastic"), _precision(hadamard=32)
    assert not deterministic.draws_per_call and stochastic.draws_per_call and hadamard.draws_per_call
    stochastic.next_call_seeds()  # eager: drawn
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    deterministic.next_call_seeds()
    for precision in (stochastic, hadamard):
        with pytest.raises(RuntimeError, match="layer rounds stochastically or uses a random Hadamard"):
            precision.next_call_seeds()
    assert stochastic.calls == 1  # a refused call draws nothing


def _captured_step(recipe: str):
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(256, 512)).cuda().to(torch.bfloat16)
    apply_recipe(layer, load_recipe(recipe), seed=0)
    x = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)

    def step():
        return torch.autograd.grad(layer(x), [x, layer[0].weight], grad)

    return step


@pytest.mark.gpu
def test_a_deterministic_mx_layer_replays_its_eager_bits_from_a_cuda_graph():
    step = _captured_step("mxfp8-rceil")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = [t.clone() for t in step()]  # warm-up on the side stream, as capture asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for want, got in zip(eager, captured):
            assert torch.equal(want.view(torch.int16), got.view(torch.int16))


@pytest.mark.gpu
def test_a_stochastic_mx_layer_refuses_capture():
    step = _captured_step("mxfp8-rceil-sr")
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="rounds stochastically"):
        with torch.cuda.graph(graph):
            step()
