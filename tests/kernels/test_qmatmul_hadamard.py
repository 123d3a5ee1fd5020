"""qmatmul with a random Hadamard transform: MX operands take the fused Hadamard + cast kernel and
give the same products and gradients as transforming in PyTorch and then quantizing."""

import pytest
import torch

from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant, qmatmul, set_gemm_observer
from mxlab.numerics import quant as quant_module


def _hadamard_precision(rounding: str) -> MatmulPrecision:
    mx = OperandQuant("e4m3", scale_mode="rceil", rounding=rounding)
    grad = OperandQuant("e5m2", scale_mode="rceil", rounding=rounding)
    return MatmulPrecision(
        fwd=GemmQuant(mx, mx, hadamard=32),
        grad_a=GemmQuant(grad, mx, hadamard=32),
        grad_b=GemmQuant(mx, grad, hadamard=32),
        seed=21,
    )


def _step(a, b, g, rounding):
    """(out, grad a, grad b, backend of the last cast) of one forward + backward."""
    a_leaf, b_leaf = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = qmatmul(a_leaf, b_leaf, _hadamard_precision(rounding))
    out.backward(g)
    return out.detach(), a_leaf.grad, b_leaf.grad, quant_module.last_backend()


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_fused_hadamard_cast_in_qmatmul_matches_transform_then_quantize(kernels, device, monkeypatch, rounding):
    torch.manual_seed(5)
    m, k, n = (50, 40, 24) if device == "cpu" else (1000, 520, 300)  # every contraction axis needs padding
    a = (torch.randn(m, k, device=device) * 3).to(torch.bfloat16)
    b = torch.randn(k, n, device=device)
    g = torch.randn(m, n, device=device).to(torch.bfloat16)
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    fused = _step(a, b, g, rounding)
    assert fused[3] == "triton"
    monkeypatch.setenv("MXLAB_BACKEND", "reference")
    composed = _step(a, b, g, rounding)
    assert composed[3] == "reference"
    for got, expected in zip(fused[:3], composed[:3]):
        assert torch.equal(got, expected)


def test_observer_sees_the_same_product_as_the_fused_path(kernels, device, monkeypatch):
    torch.manual_seed(6)
    a = torch.randn(40, 70, device=device)
    b = torch.randn(70, 16, device=device)
    g = torch.randn(40, 16, device=device)
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    fused = _step(a, b, g, "nearest_even")
    seen = []
    previous = set_gemm_observer(lambda **record: seen.append(record))
    try:
        observed = _step(a, b, g, "nearest_even")
    finally:
        set_gemm_observer(previous)
    assert [record["a"].shape[-1] for record in seen[:1]] == [96]  # the transformed, padded operand
    for got, expected in zip(fused[:3], observed[:3]):
        assert torch.equal(got, expected)
