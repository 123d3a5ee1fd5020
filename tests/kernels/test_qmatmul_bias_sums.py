"""The bias gradient of an emulated linear layer comes from the cast that reads the output gradient along its rows
(float32 column sums over 32-row blocks): the products and the other gradients keep their bits, the bias gradient
is g.sum(0) within one bfloat16 unit in the last place, on the Triton kernels as on the reference."""
import pytest
import torch

from mxlab.nn import qmatmul as qm
from mxlab.numerics import quant


def _precision(fmt: str, grad_fmt: str, grad_rounding: str, grad_a_fmt: str | None = None) -> qm.MatmulPrecision:
    fwd = qm.OperandQuant(fmt, 32, "rceil", "nearest_even")
    grad = qm.OperandQuant(grad_fmt, 32, "rceil", grad_rounding)
    grad_a = qm.OperandQuant(grad_a_fmt or grad_fmt, 32, "rceil", grad_rounding)
    return qm.MatmulPrecision(qm.GemmQuant(fwd, fwd), qm.GemmQuant(grad_a, fwd), qm.GemmQuant(fwd, grad), seed=9)


def _step(precision_factory, a, b, bias, g):
    a, b, bias = (t.detach().clone().requires_grad_() for t in (a, b, bias))
    out = qm.qmatmul(a, b, precision_factory(), bias=bias)
    out.backward(g)
    return out.detach(), a.grad, b.grad, bias.grad


RECIPES = {
    "stochastic gradients": lambda: _precision("e4m3", "e4m3", "stochastic"),
    "e2m1": lambda: _precision("e2m1", "e2m1", "nearest_even"),
    "two gradient specs": lambda: _precision("e4m3", "e4m3", "nearest_even", grad_a_fmt="e5m2"),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_bias_gradient_from_the_gradient_cast(kernels, device, monkeypatch, recipe):
    _check_bias_gradient(device, monkeypatch, recipe, (70, 64, 40) if device == "cpu" else (4099, 256, 768))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_bias_gradient_from_the_gradient_cast_at_layer_size_on_the_gpu(kernel_module, monkeypatch, recipe):
    _check_bias_gradient("cuda", monkeypatch, recipe, (65537, 256, 1024))


def _check_bias_gradient(device, monkeypatch, recipe, shape):
    generator = torch.Generator().manual_seed(11)
    m, k, n = shape
    a = torch.randn(m, k, generator=generator).to(device, torch.bfloat16)
    b = torch.randn(k, n, generator=generator).to(device, torch.bfloat16)
    bias = torch.randn(n, generator=generator).to(device, torch.bfloat16)
    g = (torch.randn(m, n, generator=generator) * 1e-2).to(device, torch.bfloat16)
    summed = []
    original = quant.fake_quantize_summing_columns
    monkeypatch.setattr(quant, "fake_quantize_summing_columns",
                        lambda x, *args, **kw: summed.append(quant.last_backend()) or original(x, *args, **kw))
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    fused = _step(RECIPES[recipe], a, b, bias, g)
    assert quant.last_backend() == "triton" and len(summed) == 1
    monkeypatch.setenv("MXLAB_BACKEND", "reference")
    composed = _step(RECIPES[recipe], a, b, bias, g)
    for name, got, expected in zip(("out", "grad a", "grad b"), fused, composed):
        assert torch.equal(got, expected), name
    exact = g.double().sum(0)
    for bias_grad in (fused[3], composed[3]):
        assert bias_grad.dtype == torch.bfloat16
        assert bool(((bias_grad.double() - exact).abs() <= exact.abs() * 2.0**-8 + 2.0**-126).all())


def test_column_sums_come_only_with_column_blocks(kernels, device):
    from mxlab.numerics.formats import FORMATS

    x = torch.ones(64, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="column sums come with a 2-D tensor blocked along axis 0"):
        kernels.fake_quantize(x, FORMATS["e4m3"], axis=-1, column_sums=True)
    values, sums = kernels.fake_quantize(x, FORMATS["e4m3"], axis=0, column_sums=True)
    assert torch.equal(values, x) and torch.equal(sums.cpu(), torch.full((64,), 64.0))
