"""The strided RMSNorm kernel against torch's rms_norm, forward and backward (on CUDA when there is a
device, else in the Triton interpreter; tests/kernels/conftest.py)."""
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mxlab.kernels import rms_norm as rms_norm_module  # noqa: E402  (after TRITON_INTERPRET is set)

EPS = torch.finfo(torch.float32).eps


def _float32_rms_norm(x, weight, dtype):
    """torch's rms_norm in float32 of x, with the weight rounded to `dtype` as the kernel rounds it."""
    return F.rms_norm(x.float(), x.shape[-1:], weight.to(dtype).float(), EPS)


def _compare(device, dtype, tokens, heads, dim, tolerance):
    torch.manual_seed(dim + tokens)
    projection = (torch.randn(tokens, 2, heads, dim, device=device) * 3).to(dtype).requires_grad_()
    reference = projection.detach().clone().requires_grad_()
    weight = (1 + torch.randn(dim, device=device) / 4).requires_grad_()
    weight_reference = weight.detach().clone().requires_grad_()
    got = rms_norm_module.rms_norm(projection[:, 1], weight, EPS)  # a strided view, as the model's keys are
    expected = _float32_rms_norm(reference[:, 1], weight_reference, dtype)
    grad = torch.randn(got.shape, device=device).to(dtype)
    got.backward(grad)
    expected.backward(grad.float())
    assert got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got, expected.to(dtype), **tolerance)
    # the input gradient subtracts two float32 terms: rounding differences show at its small entries
    scale = reference.grad[:, 1].float().abs().max().item()
    torch.testing.assert_close(projection.grad[:, 1].float(), reference.grad[:, 1].float(), atol=tolerance["rtol"] * scale, rtol=0)
    assert not projection.grad[:, 0].any()
    # the reference's weight gradient leaves the weight's cast to `dtype` rounded to it; the kernel's is float32
    torch.testing.assert_close(weight.grad, weight_reference.grad, atol=1e-3 * tokens ** 0.5,
                               rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dim", [16, 64])
def test_kernel_matches_rms_norm_forward_and_backward_on_strided_input(device, dtype, dim):
    # bfloat16: one unit in the last place on CUDA; two in the interpreter, whose float32 -> bfloat16
    # conversion truncates (the weight's and the output's) where the GPU rounds to nearest
    bf16_rtol = 2 ** -7 if torch.cuda.is_available() else 2 ** -6
    tolerance = {"atol": 1e-2, "rtol": bf16_rtol} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    _compare(device, dtype, tokens=45, heads=3, dim=dim, tolerance=tolerance)  # 135 rows: the last program partly masked


def test_refuses_what_it_cannot_run(device):
    weight = torch.ones(24, device=device)
    with pytest.raises(ValueError, match="normalized dim 24 is not a power of two from 16 to 256"):
        rms_norm_module.rms_norm(torch.zeros(4, 1, 24, device=device), weight, EPS)
    with pytest.raises(ValueError, match=r"the weight must be \(16,\)"):
        rms_norm_module.rms_norm(torch.zeros(4, 1, 16, device=device), weight, EPS)
    with pytest.raises(ValueError, match="normalized dim of x must be contiguous"):
        rms_norm_module.rms_norm(torch.zeros(4, 16, 2, device=device).transpose(1, 2), torch.ones(16, device=device), EPS)


@pytest.mark.gpu
def test_gpu_model_shape_matches_rms_norm():
    _compare("cuda", torch.bfloat16, tokens=300_000, heads=4, dim=64, tolerance={"atol": 1e-2, "rtol": 2 ** -7})
