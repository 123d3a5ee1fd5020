"""The one-pass rotary kernel against the PyTorch formula of mxlab.nn.attention, forward and backward
(on CUDA when there is a device, else in the Triton interpreter; tests/kernels/conftest.py)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mxlab.kernels import rotary  # noqa: E402  (after TRITON_INTERPRET is set)
from mxlab.nn.rotary import RotaryTable, rotary_embedding, rotary_table, segment_positions  # noqa: E402


def _torch_rotary(x, table):
    """`rotary_embedding`'s PyTorch formula (the path it takes on the CPU), on a CPU copy of x."""
    return rotary_embedding(x.cpu(), RotaryTable(table.cos.cpu(), table.sin.cpu())).to(x.device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_kernel_matches_the_pytorch_formula_forward_and_backward_on_strided_input(device, dtype, head_dim):
    torch.manual_seed(head_dim)
    heads, total = 3, 150  # 150 tokens: the last program is partly masked
    offsets = torch.tensor([0, 70, 70, 150], device=device)
    table = rotary_table(segment_positions(offsets, total=total) * 37, head_dim)  # large angles too
    qkv = (torch.randn(total, 3, heads, head_dim, device=device) * 4).to(dtype)
    x = qkv[:, 1]  # a strided view, as the model's keys are
    leaf = x.detach().clone().requires_grad_()
    expected = _torch_rotary(leaf, table)
    grad = torch.randn(expected.shape, device=device).to(dtype)
    expected.backward(grad)
    view = qkv.detach().clone().requires_grad_()
    got = rotary.rotate(view[:, 1], table.cos, table.sin)
    got.backward(grad)
    assert got.dtype == dtype and got.is_contiguous()
    tolerance = {"atol": 0, "rtol": 2**-7} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-6}
    torch.testing.assert_close(got, expected, **tolerance)
    torch.testing.assert_close(view.grad[:, 1], leaf.grad, **tolerance)
    assert not view.grad[:, 0].any() and not view.grad[:, 2].any()  # the other slices of the strided input get none


def test_refuses_what_it_cannot_run(device):
    table = rotary_table(torch.arange(4, device=device), 8)
    with pytest.raises(ValueError, match="head_dim 6 is not twice a power of two"):
        rotary.rotate(torch.zeros(4, 1, 6, device=device), table.cos, table.sin)
    with pytest.raises(ValueError, match=r"cos must be a contiguous float32 tensor of shape \(4, 4\)"):
        rotary.rotate(torch.zeros(4, 1, 8, device=device), table.cos.double(), table.sin)
    with pytest.raises(ValueError, match="head dim of x must be contiguous"):
        rotary.rotate(torch.zeros(4, 8, 2, device=device).transpose(1, 2), table.cos, table.sin)


@pytest.mark.gpu
def test_gpu_model_shape_matches_the_pytorch_formula():
    torch.manual_seed(0)
    lengths = torch.randint(0, 1025, (512,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).cuda()
    total = int(offsets[-1])
    table = rotary_table(segment_positions(offsets, total=total), 64)
    qkv = torch.randn(total, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    reference = qkv.detach().clone().requires_grad_()
    got = rotary.rotate(qkv[:, 0], table.cos, table.sin)
    expected = _torch_rotary(reference[:, 0], table)
    grad = torch.randn_like(got)
    got.backward(grad)
    expected.backward(grad)
    # One bfloat16 ulp, or, where the two terms cancel, their float32 rounding (the kernel may fuse a product
    # and a sum into one FMA): terms below 2^4 here, so under 2 x 2^4 x 2^-24 = 2^-19.
    torch.testing.assert_close(got, expected, atol=2**-19, rtol=2**-7)
    torch.testing.assert_close(qkv.grad, reference.grad, atol=2**-19, rtol=2**-7)
