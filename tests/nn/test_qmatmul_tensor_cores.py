"""The BF16 tensor-core path of emulated GEMMs: its exactness claim (CPU) and its use on CUDA (GPU)."""
from __future__ import annotations

import pytest
import torch

from mxlab.formats import FORMATS
from mxlab.nn import qmatmul as qm
from mxlab.quant import fake_quantize
from mxlab.reference import SCALE_MODES


def _adversarial_bfloat16(generator: torch.Generator) -> torch.Tensor:
    """(64, 256) bfloat16: normal values over a wide exponent range, bfloat16 subnormals, the largest
    finite values, zeros and single outliers in otherwise tiny blocks."""
    x = torch.randn(64, 256, generator=generator) * torch.exp2(torch.randint(-140, 120, (64, 1), generator=generator).float())
    x[0, :32] = torch.finfo(torch.bfloat16).max * torch.linspace(-1, 1, 32)
    x[1, :32] = torch.tensor(2.0 ** -133) * torch.arange(32)  # bfloat16 subnormals
    x[2, :32] = 0.0
    x[3, :32] = 2.0 ** -130
    x[3, 5] = 2.0 ** -100
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
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
    assert qm._exact_in_bfloat16(torch.tensor([0.0, 1.5, -3.0 * 2.0 ** -126, 2.0 ** 120]))
    assert not qm._exact_in_bfloat16(torch.tensor([1.0, 9.0 * 2.0 ** -135]))  # bfloat16 subnormal, 4 bits: rounds
    assert not qm._exact_in_bfloat16(torch.tensor([2.0 ** -140]))


def test_float32_operands_stay_float32_on_the_cpu() -> None:
    quant = qm.OperandQuant("e4m3")
    x = torch.randn(8, 64)
    assert qm._quantized_operand(x, quant, -1, 0).dtype == torch.float32
    assert qm._quantized_operand(x.to(torch.bfloat16), quant, -1, 0).dtype == torch.bfloat16
    assert qm._quantized_operand(x, qm.OperandQuant("fp8_tensor_e4m3"), -1, 0).dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_emulated_gemm_uses_tensor_cores_and_matches_float32(dtype: torch.dtype) -> None:
    generator = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(1000, 512, device="cuda", generator=generator).to(dtype).requires_grad_()
    b = (torch.randn(512, 384, device="cuda", generator=generator) * 0.05).to(dtype).requires_grad_()
    quant = qm.OperandQuant("e4m3", scale_mode="rceil")
    gemm = qm.GemmQuant(quant, quant)
    precision = qm.MatmulPrecision(fwd=gemm, grad_a=gemm, grad_b=gemm)
    a_q = qm._quantized_operand(a.detach(), quant, -1, 0)
    b_q = qm._quantized_operand(b.detach(), quant, -2, 0)
    assert a_q.dtype == b_q.dtype == torch.bfloat16  # the float32 inputs pass the exactness check
    out = qm.qmatmul(a, b, precision)
    exact = a_q.double() @ b_q.double()
    bound = 512 * 2.0 ** -23 * (a_q.double().abs() @ b_q.double().abs())  # float32 accumulation, any order
    assert bool(((out.double() - exact).abs() <= bound + exact.abs() * 2.0 ** -8).all())
    if dtype == torch.float32:  # float32 result: only accumulation order separates it from the float32 GEMM
        assert bool(((out.double() - exact).abs() <= bound).all())
    out.backward(torch.randn_like(out))
    assert a.grad is not None and torch.isfinite(a.grad).all() and b.grad is not None
