"""An operand quantized along both of its dims from one read (`_one_read_pair`) gives the bits of two casts:
the output gradient for both backward GEMMs, and a b of at most an eighth of a's size (a linear layer's
weight) for the forward and the grad of a."""

import pytest
import torch

from mxlab.nn import qmatmul as qm
from mxlab.numerics import quant
from mxlab.recipe import diagnostics


def _precision(fmt: str = "e4m3", grad_fmt: str = "e4m3", seed: int = 5) -> qm.MatmulPrecision:
    fwd = qm.OperandQuant(fmt, 32, "rceil", "nearest_even")
    grad = qm.OperandQuant(grad_fmt, 32, "rceil", "nearest_even")
    return qm.MatmulPrecision(qm.GemmQuant(fwd, fwd), qm.GemmQuant(grad, fwd), qm.GemmQuant(fwd, grad), seed=seed)


def _product_and_grads(precision, a, b, bias, g):
    a, b, bias = (t.detach().clone().requires_grad_() for t in (a, b, bias))
    out = qm.qmatmul(a, b, precision, bias=bias)
    out.backward(g)
    return out.detach(), a.grad, b.grad, bias.grad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _inputs(device: str, m: int = 70, k: int = 64, n: int = 96):
    """a, b, bias, g in bfloat16; a, b and g spread over 2^-12..2^12, so that their blocks along rows and along
    columns hold elements below their blocks' e4m3 normal range, which the two quantizations round differently."""
    generator = torch.Generator().manual_seed(3)

    def spread(*shape):
        return torch.randn(*shape, generator=generator) * 2.0 ** torch.randint(-12, 13, shape, generator=generator)

    a, b = spread(m, k).to(device, torch.bfloat16), spread(k, n).to(device, torch.bfloat16)
    bias = torch.randn(n, generator=generator).to(device, torch.bfloat16)
    return a, b, bias, (spread(m, n) * 1e-3).to(device, torch.bfloat16)


def _assert_same_products(expected, got, g) -> None:
    """out, grad a and grad b bit for bit; the bias gradient (g summed over rows in float32, rounded once to
    bfloat16, in whatever order) within one bfloat16 unit in the last place of the exact sum."""
    for name, want, have in zip(("out", "grad a", "grad b"), expected, got):
        assert want.dtype == have.dtype and torch.equal(_bits(want), _bits(have)), name
    exact = g.double().sum(0)
    for bias_grad in (expected[3], got[3]):
        assert bias_grad.dtype == g.dtype
        assert bool(((bias_grad.double() - exact).abs() <= exact.abs() * 2.0**-8 + 2.0**-126).all())


def _compare(monkeypatch, device: str, fused_expected: int, precision_factory=_precision, m: int = 70) -> None:
    """Run one product unfused, then with the one-read path forced on; same products, and the path ran (for g
    with the bias gradient's column sums)."""
    a, b, bias, g = _inputs(device, m=m)
    monkeypatch.setattr(quant, "rowcol_in_one_read", lambda x, fmt, rounding="nearest_even": False)
    expected = _product_and_grads(precision_factory(), a, b, bias, g)
    calls = []
    rowcol = quant.fake_quantize_rowcol
    monkeypatch.setattr(quant, "rowcol_in_one_read", lambda x, fmt, rounding="nearest_even": True)
    monkeypatch.setattr(
        quant,
        "fake_quantize_rowcol",
        lambda x, *args, **kw: calls.append((tuple(x.shape), kw.get("column_sums", False))) or rowcol(x, *args, **kw),
    )
    got = _product_and_grads(precision_factory(), a, b, bias, g)
    assert len(calls) == fused_expected
    assert [sums for shape, sums in calls] == [shape == tuple(g.shape) for shape, _ in calls]  # g's call sums it
    _assert_same_products(expected, got, g)


def test_one_read_path_gives_the_bits_of_two_casts(monkeypatch):
    _compare(monkeypatch, "cpu", fused_expected=1)  # g, once per backward (b: 6144 elements, a: 4480)


def test_a_small_b_is_read_once_for_the_forward_and_the_grad_of_a(monkeypatch):
    _compare(monkeypatch, "cpu", fused_expected=2, m=800)  # b (6144 elements, a: 51200) and g


def test_operands_with_two_specs_are_quantized_where_they_are_used(monkeypatch):
    # g's specs in the grad of a (e5m2) and of b (e4m3) differ: no one-read pair
    def two_specs():
        fwd, other = qm.OperandQuant("e4m3", 32, "rceil"), qm.OperandQuant("e5m2", 32, "rceil")
        return qm.MatmulPrecision(qm.GemmQuant(fwd, fwd), qm.GemmQuant(other, fwd), qm.GemmQuant(other, fwd), seed=5)

    _compare(monkeypatch, "cpu", fused_expected=0, precision_factory=two_specs)


def test_an_observed_step_quantizes_each_operand_where_it_is_used(monkeypatch):
    monkeypatch.setattr(quant, "rowcol_in_one_read", lambda x, fmt, rounding="nearest_even": True)
    seen = {}
    previous = qm.set_gemm_observer(lambda **kw: seen.setdefault(kw["gemm"], (kw["a"], kw["b"])))
    try:
        a, b, bias, g = _inputs("cpu")
        _product_and_grads(_precision(), a, b, bias, g)
    finally:
        qm.set_gemm_observer(previous)
    assert len(seen) == 3  # every GEMM shown with its unquantized operands, a and g among them
    (fwd_a, _), (grad_a_g, _), (grad_b_a, grad_b_g) = (seen[label] for label in sorted(seen))
    assert torch.equal(fwd_a, a) and torch.equal(grad_a_g, g) and torch.equal(grad_b_a, a) and torch.equal(grad_b_g, g)


def test_one_read_pays_only_with_the_hardware_fp8_conversion():
    x = torch.ones(64, 64, dtype=torch.bfloat16)
    assert not quant.rowcol_in_one_read(x, "e4m3")  # the CPU: no fused launch
    assert not quant.rowcol_in_one_read(x, "not-a-format")
    assert diagnostics is not None


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_one_read_path_on_the_gpu_gives_the_bits_of_two_casts(monkeypatch, fmt):
    x = torch.ones(64, 64, dtype=torch.bfloat16, device="cuda")
    if not quant.rowcol_in_one_read(x, fmt):
        pytest.skip("no hardware FP8 conversion on this GPU")
    a, b, bias, g = _inputs("cuda", m=16411, k=256, n=1024)  # b and g read once
    precision = lambda: _precision(fmt, fmt)  # noqa: E731
    monkeypatch.setattr(quant, "rowcol_in_one_read", lambda x, fmt, rounding="nearest_even": False)
    expected = _product_and_grads(precision(), a, b, bias, g)
    monkeypatch.undo()
    got = _product_and_grads(precision(), a, b, bias, g)
    _assert_same_products(expected, got, g)
