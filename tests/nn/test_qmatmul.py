import pytest
import torch

from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant, qmatmul
from mxlab.numerics.hadamard import random_hadamard
from mxlab.numerics.quant import fake_quantize
from mxlab.numerics.seeding import SEED_SLOTS, derive_seed


def fq(x, quant, axis, seed=None):
    """Reference fake-quantization of one operand, in float32."""
    return fake_quantize(
        x.float(),
        quant.fmt,
        block=quant.block,
        axis=axis,
        scale_mode=quant.scale_mode,
        rounding=quant.rounding,
        seed=seed,
        pad=True,
    )


def mx_precision(fmt="e4m3", grad_fmt="e4m3", scale_mode="rceil", grad_rounding="nearest_even", seed=11):
    fwd = OperandQuant(fmt, 32, scale_mode, "nearest_even")
    grad = OperandQuant(grad_fmt, 32, scale_mode, grad_rounding)
    return MatmulPrecision(GemmQuant(fwd, fwd), GemmQuant(grad, fwd), GemmQuant(fwd, grad), seed=seed)


def test_none_precision_is_torch_matmul():
    a, b = torch.randn(2, 5, 7), torch.randn(2, 7, 3)
    assert torch.equal(qmatmul(a, b, None), torch.matmul(a, b))


@pytest.mark.parametrize("grad_rounding", ["nearest_even", "stochastic"])
def test_forward_and_gradients_equal_reference_composition(grad_rounding):
    torch.manual_seed(0)
    precision = mx_precision(grad_fmt="e5m2", grad_rounding=grad_rounding)
    a = (torch.randn(2, 3, 40, 45) * 3).requires_grad_()  # K = 45 and M = 40: both padded for quantization
    b = torch.randn(2, 3, 45, 33).requires_grad_()
    g = torch.randn(2, 3, 40, 33)
    out = qmatmul(a, b, precision)
    out.backward(g)

    seed = lambda slot: derive_seed(11, 0, SEED_SLOTS[slot])  # noqa: E731  first call of this precision
    fwd, grad_a, grad_b = precision.fwd, precision.grad_a, precision.grad_b
    expected_out = fq(a.detach(), fwd.a, -1) @ fq(b.detach(), fwd.b, -2)
    expected_grad_a = fq(g, grad_a.a, -1, seed("grad_a.g")) @ fq(b.detach(), grad_a.b, -1).transpose(-1, -2)
    expected_grad_b = fq(a.detach(), grad_b.a, -2).transpose(-1, -2) @ fq(g, grad_b.b, -2, seed("grad_b.g"))
    assert torch.equal(out, expected_out)
    assert torch.equal(a.grad, expected_grad_a)
    assert torch.equal(b.grad, expected_grad_b)
    # and quantization did something: the result is not the high-precision product
    assert not torch.equal(out, a.detach() @ b.detach())
    assert precision.calls == 1


def test_stochastic_rounding_is_reproducible_and_advances_per_call():
    torch.manual_seed(1)
    a, b, g = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64)

    def grads(precision):
        results = []
        for _ in range(2):
            a_leaf = a.clone().requires_grad_()
            qmatmul(a_leaf, b, precision).backward(g)
            results.append(a_leaf.grad)
        return results

    first = grads(mx_precision(grad_rounding="stochastic", seed=5))
    again = grads(mx_precision(grad_rounding="stochastic", seed=5))
    other_seed = grads(mx_precision(grad_rounding="stochastic", seed=6))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], first[1])  # the second call draws other bits
    assert not torch.equal(first[0], other_seed[0])


def test_jagged_key_blocks_restart_per_sequence_and_zero_padded_keys_change_nothing():
    """P @ V and Q @ K^T over a padded (B, H, L, D) layout equal each sequence computed alone."""
    torch.manual_seed(2)
    precision_pv, precision_qk = mx_precision(scale_mode="floor"), mx_precision(scale_mode="floor")
    lengths, heads, n_queries, dim, width = [37, 50, 5], 2, 6, 24, 64
    P = torch.zeros(len(lengths), heads, n_queries, width)
    V = torch.zeros(len(lengths), heads, width, dim)
    K = torch.zeros(len(lengths), heads, width, dim)
    Q = torch.randn(len(lengths), heads, n_queries, dim)
    for i, length in enumerate(lengths):
        P[i, :, :, :length] = torch.softmax(torch.randn(heads, n_queries, length) * 4, dim=-1)
        V[i, :, :length] = torch.randn(heads, length, dim) * (i + 1)
        K[i, :, :length] = torch.randn(heads, length, dim)
    P.requires_grad_()
    V.requires_grad_()
    g = torch.randn(len(lengths), heads, n_queries, dim)
    out = qmatmul(P, V, precision_pv)
    out.backward(g)
    scores = qmatmul(Q, K.transpose(-1, -2), precision_qk)
    for i, length in enumerate(lengths):
        P_i = P.detach()[i : i + 1, :, :, :length].clone().requires_grad_()
        V_i = V.detach()[i : i + 1, :, :length].clone().requires_grad_()
        out_i = qmatmul(P_i, V_i, mx_precision(scale_mode="floor"))
        out_i.backward(g[i : i + 1])
        assert torch.equal(out[i : i + 1], out_i)
        # The gradients' quantized operands are the same; only the FP32 GEMM's summation order may
        # depend on the output width (1 ulp), far below one E4M3 rounding step (~6%).
        torch.testing.assert_close(P.grad[i : i + 1, :, :, :length], P_i.grad, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(V.grad[i : i + 1, :, :length], V_i.grad, rtol=1e-6, atol=1e-5)
        scores_i = qmatmul(Q[i : i + 1], K[i : i + 1, :, :length].transpose(-1, -2), mx_precision(scale_mode="floor"))
        assert torch.equal(scores[i : i + 1, :, :, :length], scores_i)
    # a key block shared across two sequences would differ: quantizing the concatenation does
    concatenated = torch.cat([P.detach()[0, :, :, :37], P.detach()[1, :, :, :50]], dim=-1)
    assert not torch.equal(
        fq(concatenated, precision_pv.fwd.a, -1)[..., 37:], fq(P.detach()[1, :, :, :50], precision_pv.fwd.a, -1)
    )


def test_gradcheck_with_quantization_off():
    precision = MatmulPrecision()  # every operand fp32: the autograd Function with plain GEMMs
    a = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: qmatmul(x, y, precision), (a, b))


def test_hadamard_on_the_token_contraction_matches_composition_and_preserves_the_product():
    torch.manual_seed(3)
    e4m3 = OperandQuant("e4m3", scale_mode="rceil")
    fp32 = OperandQuant("fp32")
    a = torch.randn(50, 16)  # M = 50: padded to 64 for the Hadamard blocks of 32
    b = torch.randn(16, 24)
    g = torch.randn(50, 24)
    for operand, expect_exact_product in ((e4m3, False), (fp32, True)):
        precision = MatmulPrecision(grad_b=GemmQuant(operand, operand, hadamard=32), seed=9)
        b_leaf = b.clone().requires_grad_()
        qmatmul(a, b_leaf, precision).backward(g)
        seed = derive_seed(9, 0, SEED_SLOTS["grad_b.hadamard"])
        pad = torch.zeros(14, 16), torch.zeros(14, 24)
        a_h = random_hadamard(torch.cat([a, pad[0]]), 32, 0, seed)
        g_h = random_hadamard(torch.cat([g, pad[1]]), 32, 0, seed)
        if expect_exact_product:
            torch.testing.assert_close(b_leaf.grad, a.T @ g, rtol=1e-5, atol=1e-5)
        else:
            expected = fq(a_h, operand, 0).T @ fq(g_h, operand, 0)
            assert torch.equal(b_leaf.grad, expected)


def test_output_keeps_the_input_dtype():
    precision = mx_precision()
    a, b = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(32, 8, dtype=torch.bfloat16)
    out = qmatmul(a, b, precision)
    assert out.dtype == torch.bfloat16
    expected = (fq(a, precision.fwd.a, -1) @ fq(b, precision.fwd.b, -2)).to(torch.bfloat16)
    assert torch.equal(out, expected)


def test_refuses_mismatched_batch_dims_and_bad_precision():
    with pytest.raises(ValueError, match="batch dims"):
        qmatmul(torch.randn(2, 4, 5), torch.randn(3, 5, 3), mx_precision())
    with pytest.raises(ValueError, match="MatmulPrecision"):
        qmatmul(torch.randn(4, 5), torch.randn(5, 3), "e4m3")
    with pytest.raises(ValueError, match="accepted"):
        OperandQuant("e4m4")
    with pytest.raises(ValueError, match="hadamard"):
        GemmQuant(OperandQuant("e4m3"), OperandQuant("e4m3"), hadamard=24)


def test_per_tensor_fp8_refuses_a_rounding_it_cannot_do():
    with pytest.raises(ValueError, match="nearest even only"):
        OperandQuant("fp8_tensor_e5m2", rounding="stochastic")
    assert OperandQuant("fp8_tensor_e5m2").describe() == "fp8_tensor_e5m2"
