"""The BF16 tensor-core path of emulated GEMMs: its exactness claim (CPU) and its use on CUDA (GPU)."""

from __future__ import annotations

import pytest
import torch

from mxlab.nn import operands
from mxlab.nn import qmatmul as qm
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.quant import fake_quantize
from mxlab.numerics.vocab import ScaleMode


def _adversarial_bfloat16(generator: torch.Generator) -> torch.Tensor:
    """(64, 256) bfloat16: normal values over a wide exponent range, bfloat16 subnormals, the largest
    finite values, zeros and single outliers in otherwise tiny blocks."""
    x = torch.randn(64, 256, generator=generator) * torch.exp2(
        torch.randint(-140, 120, (64, 1), generator=generator).float()
    )
    x[0, :32] = torch.finfo(torch.bfloat16).max * torch.linspace(-1, 1, 32)
    x[1, :32] = torch.tensor(2.0**-133) * torch.arange(32)  # bfloat16 subnormals
    x[2, :32] = 0.0
    x[3, :32] = 2.0**-130
    x[3, 5] = 2.0**-100
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("scale_mode", [mode.value for mode in ScaleMode])
def test_mx_values_of_bfloat16_inputs_are_exact_in_bfloat16(fmt: str, scale_mode: str) -> None:
    """The claim behind the tensor-core path: fake-quantizing a bfloat16 tensor gives values that
    bfloat16 holds exactly, so the bfloat16 result equals the float32 one bit for bit."""
    x = _adversarial_bfloat16(torch.Generator().manual_seed(len(fmt) * 7 + len(scale_mode)))
    for axis in (-1, 0):
        from_float32 = fake_quantize(x.float(), fmt, axis=axis, scale_mode=scale_mode)
        in_bfloat16 = fake_quantize(x, fmt, axis=axis, scale_mode=scale_mode)
        assert in_bfloat16.dtype == torch.bfloat16
        finite = torch.isfinite(from_float32)
        assert torch.equal(in_bfloat16.float()[finite], from_float32[finite])
        assert torch.equal(from_float32.to(torch.bfloat16).float()[finite], from_float32[finite])


def test_exactness_check_rejects_values_bfloat16_would_round() -> None:
    assert operands.exact_in_bfloat16(torch.tensor([0.0, 1.5, -3.0 * 2.0**-126, 2.0**120]))
    assert not operands.exact_in_bfloat16(torch.tensor([1.0, 9.0 * 2.0**-135]))  # bfloat16 subnormal, 4 bits: rounds
    assert not operands.exact_in_bfloat16(torch.tensor([2.0**-140]))


def test_operand_dtypes_and_factors_on_the_cpu() -> None:
    quant = qm.OperandQuant("e4m3")
    x = torch.randn(8, 64)
    values, factor = operands.quantized_operand(x, quant, -1, 0)
    assert values.dtype == torch.float32 and factor is None
    values, factor = operands.quantized_operand(x.to(torch.bfloat16), quant, -1, 0)
    assert values.dtype == torch.bfloat16 and factor is None
    values, factor = operands.quantized_operand(x, qm.OperandQuant("fp8_tensor_e4m3"), -1, 0)
    assert values.dtype == torch.float32 and factor is not None and factor.dim() == 0
    assert torch.equal(values * factor, fake_quantize(x, "fp8_tensor_e4m3"))


def test_per_tensor_scales_multiply_the_accumulator() -> None:
    """A per-tensor FP8 GEMM is (q_a @ q_b) * (scale_inv_a * scale_inv_b), the FP8 hardware form."""
    generator = torch.Generator().manual_seed(5)
    a, b = torch.randn(40, 96, generator=generator), torch.randn(96, 24, generator=generator) * 1e-3
    quant = qm.OperandQuant("fp8_tensor_e4m3")
    gemm = qm.GemmQuant(quant, quant)
    out = qm.qmatmul(a, b, qm.MatmulPrecision(fwd=gemm, grad_a=gemm, grad_b=gemm))
    (qa, fa), (qb, fb) = operands.quantized_operand(a, quant, -1, 0), operands.quantized_operand(b, quant, -2, 0)
    expected = (qa.double() @ qb.double()) * (fa.double() * fb.double())
    assert torch.allclose(out.double(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("operand", [qm.OperandQuant("e4m3", scale_mode="rceil"), qm.OperandQuant("fp8_tensor_e4m3")])
def test_cuda_emulated_gemm_uses_tensor_cores_and_matches_float32(dtype: torch.dtype, operand: qm.OperandQuant) -> None:
    generator = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(1000, 512, device="cuda", generator=generator).to(dtype).requires_grad_()
    b = (torch.randn(512, 384, device="cuda", generator=generator) * 0.05).to(dtype).requires_grad_()
    gemm = qm.GemmQuant(operand, operand)
    precision = qm.MatmulPrecision(fwd=gemm, grad_a=gemm, grad_b=gemm)
    a_q, a_factor = operands.quantized_operand(a.detach(), operand, -1, 0)
    b_q, b_factor = operands.quantized_operand(b.detach(), operand, -2, 0)
    assert a_q.dtype == b_q.dtype == torch.bfloat16  # float32 MX inputs pass the exactness check
    out = qm.qmatmul(a, b, precision)
    factor = 1.0 if a_factor is None else float(a_factor.double() * b_factor.double())
    exact = (a_q.double() @ b_q.double()) * factor
    bound = 512 * 2.0**-23 * (a_q.double().abs() @ b_q.double().abs()) * abs(factor)  # float32 accumulation, any order
    assert bool(((out.double() - exact).abs() <= bound + exact.abs() * 2.0**-8).all())
    if dtype == torch.float32:  # float32 result: only accumulation order separates it from a float32 GEMM
        assert bool(((out.double() - exact).abs() <= bound + exact.abs() * 2.0**-23).all())
    out.backward(torch.randn_like(out))
    assert a.grad is not None and torch.isfinite(a.grad).all() and b.grad is not None


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n", [(4096, 1024, 256), (256, 65536, 256)]
)  # the second: a wgrad's long contraction (split-K)
def test_cuda_bfloat16_result_is_the_float32_accumulator_rounded_once(m: int, k: int, n: int) -> None:
    """bfloat16 operands, bfloat16 result: cuBLAS writes bfloat16 from its float32 accumulator, the bias
    added there; equal to the float32 product plus bias rounded once, but for accumulation order (split-K
    partial sums reduced in bfloat16 would make most elements differ, not under 1%)."""
    generator = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(m, k, device="cuda", generator=generator).bfloat16()
    b = (torch.randn(k, n, device="cuda", generator=generator) * 0.05).bfloat16()
    bias = torch.randn(n, device="cuda", generator=generator).bfloat16()
    operand = qm.OperandQuant("e4m3", scale_mode="rceil")
    gemm = qm.GemmQuant(operand, operand)
    out = qm.qmatmul(a, b, qm.MatmulPrecision(fwd=gemm, grad_a=gemm, grad_b=gemm), bias=bias)
    a_q, _ = operands.quantized_operand(a, operand, -1, 0)
    b_q, _ = operands.quantized_operand(b, operand, -2, 0)
    expected = (torch.mm(a_q, b_q, out_dtype=torch.float32) + bias.float()).bfloat16()
    assert out.dtype == torch.bfloat16
    ulp = torch.finfo(torch.bfloat16).eps * expected.float().abs().clamp_min(2.0**-126)
    order = k * 2.0**-23 * (a_q.float().abs() @ b_q.float().abs())  # two float32 accumulation orders
    assert bool(((out.float() - expected.float()).abs() <= ulp + order).all())
    assert (out == expected).float().mean().item() > 0.99
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction  # the setting is restored
