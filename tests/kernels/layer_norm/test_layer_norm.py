"""The multi-row LayerNorm kernel against torch's layer_norm, forward and backward (on CUDA when there
is a device, else in the Triton interpreter; tests/kernels/conftest.py)."""
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mxlab.kernels import layer_norm as layer_norm_module  # noqa: E402  (after TRITON_INTERPRET is set)

EPS = 1e-5


def _compare(device, dtype, shape, rtol):
    """Kernel against the float32 formula with the affine parameters rounded to `dtype` as the kernel
    rounds them; `rtol`: units in the last place of the output's dtype allowed."""
    torch.manual_seed(shape[-1] + shape[0])
    n = shape[-1]
    x = (torch.randn(shape, device=device) * 3 + 1).to(dtype).requires_grad_()
    reference = x.detach().clone().requires_grad_()
    weight = (1 + torch.randn(n, device=device) / 4).requires_grad_()
    bias = (torch.randn(n, device=device) / 4).requires_grad_()
    weight_ref, bias_ref = weight.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    got = layer_norm_module.layer_norm(x, weight, bias, EPS)
    expected = F.layer_norm(reference.float(), (n,), weight_ref.to(dtype).float(), bias_ref.to(dtype).float(), EPS)
    grad = torch.randn(got.shape, device=device).to(dtype)
    got.backward(grad)
    expected.backward(grad.float())
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.to(dtype).float(), atol=rtol * 4, rtol=rtol)
    # the input gradient subtracts float32 terms: rounding differences show at its small entries
    scale = reference.grad.float().abs().max().item()
    torch.testing.assert_close(x.grad.float(), reference.grad.float(), atol=rtol * scale, rtol=0)
    # the reference's affine gradients leave the parameters' casts to `dtype` rounded to it; the kernel's are float32
    parameter_rtol = 2 ** -7 if dtype == torch.bfloat16 else 1e-4
    rows = x.numel() // n
    torch.testing.assert_close(weight.grad, weight_ref.grad, atol=1e-3 * rows ** 0.5, rtol=parameter_rtol)
    torch.testing.assert_close(bias.grad, bias_ref.grad, atol=1e-3 * rows ** 0.5, rtol=parameter_rtol)


# bfloat16: one unit in the last place on CUDA; two in the interpreter, whose float32 -> bfloat16
# conversion truncates where the GPU rounds to nearest
BF16_RTOL = 2 ** -7 if torch.cuda.is_available() else 2 ** -6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 9, 64), (37, 96), (3, 1024)])  # 96: not a power of two, masked columns
def test_kernel_matches_layer_norm_forward_and_backward(device, dtype, shape):
    _compare(device, dtype, shape, BF16_RTOL if dtype == torch.bfloat16 else 1e-5)


def test_refuses_what_it_cannot_run(device):
    ones = torch.ones(16, device=device)
    with pytest.raises(ValueError, match="normalized dim 2048 is outside 1..1024"):
        layer_norm_module.layer_norm(torch.zeros(2, 2048, device=device), torch.ones(2048, device=device),
                                     torch.ones(2048, device=device), EPS)
    with pytest.raises(ValueError, match="x must be contiguous"):
        layer_norm_module.layer_norm(torch.zeros(16, 4, device=device).T, ones, ones, EPS)
    with pytest.raises(ValueError, match=r"the bias must be a \(16,\) tensor"):
        layer_norm_module.layer_norm(torch.zeros(4, 16, device=device), ones, None, EPS)


@pytest.mark.gpu
def test_gpu_model_shape_matches_layer_norm():
    _compare("cuda", torch.bfloat16, (500_000, 256), BF16_RTOL)
