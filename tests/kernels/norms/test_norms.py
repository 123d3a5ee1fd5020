"""The norm kernels (LayerNorm, RMSNorm) against the float32 formulas, forward and backward (on CUDA
when there is a device, else in the Triton interpreter; tests/kernels/conftest.py)."""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mxlab.kernels import norms  # noqa: E402  (after TRITON_INTERPRET is set)

EPS = 1e-5
# bfloat16: one unit in the last place on CUDA; two in the interpreter, whose float32 -> bfloat16
# conversion truncates (the parameters' and the output's) where the GPU rounds to nearest
BF16_RTOL = 2**-7 if torch.cuda.is_available() else 2**-6


def _compare(kind, x, rtol):
    """The kernel on x against the float32 formula with the parameters rounded to x's dtype as the kernel
    rounds them; `rtol`: units in the last place of x's dtype allowed."""
    dtype, n, device = x.dtype, x.shape[-1], x.device
    torch.manual_seed(n)
    weight = (1 + torch.randn(n, device=device) / 4).requires_grad_()
    bias = (torch.randn(n, device=device) / 4).requires_grad_() if kind == "layer" else None
    params_ref = [p.detach().clone().requires_grad_() for p in (weight, bias) if p is not None]
    reference = x.detach().clone().requires_grad_()
    if kind == "layer":
        got = norms.layer_norm(x, weight, bias, EPS)
        expected = F.layer_norm(reference.float(), (n,), *(p.to(dtype).float() for p in params_ref), EPS)
    else:
        got = norms.rms_norm(x, weight, EPS)
        expected = F.rms_norm(reference.float(), (n,), params_ref[0].to(dtype).float(), EPS)
    grad = torch.randn(got.shape, device=device).to(dtype)
    got.backward(grad)
    expected.backward(grad.float())
    assert got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got.float(), expected.to(dtype).float(), atol=4 * rtol, rtol=rtol)
    # the input gradient subtracts float32 terms: rounding differences show at its small entries
    scale = reference.grad.float().abs().max().item()
    mine = x.grad if x._base is None else x._base.grad[:, 1]  # a strided x is slice 1 of its base (`_strided`)
    torch.testing.assert_close(mine.float(), reference.grad.float(), atol=rtol * scale, rtol=0)
    # the reference's parameter gradients leave the casts to `dtype` rounded to it; the kernel's are float32
    rows = x.numel() // n
    for mine_p, ref_p in zip([p for p in (weight, bias) if p is not None], params_ref):
        torch.testing.assert_close(
            mine_p.grad, ref_p.grad, atol=1e-3 * rows**0.5, rtol=2**-7 if dtype == torch.bfloat16 else 1e-4
        )


def _strided(shape, dtype, device):
    """A (tokens, heads, dim) view of a (tokens, 2, heads, dim) tensor, as the model's keys are."""
    torch.manual_seed(shape[-1] + shape[0])
    projection = (torch.randn(shape[0], 2, *shape[1:], device=device) * 3 + 1).to(dtype).requires_grad_()
    return projection[:, 1]


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape, strided", [((45, 3, 64), True), ((37, 96), False), ((3, 4, 1024), False)])
def test_kernels_match_the_float32_formulas_forward_and_backward(device, kind, dtype, shape, strided):
    # 135 and 37 rows: the last program partly masked; 96: not a power of two, masked columns
    if strided:
        x = _strided(shape, dtype, device)
    else:
        torch.manual_seed(shape[-1])
        x = (torch.randn(shape, device=device) * 3 + 1).to(dtype).requires_grad_()
    _compare(kind, x, BF16_RTOL if dtype == torch.bfloat16 else 1e-5)
    if strided:
        assert not x._base.grad[:, 0].any()  # the other slice of the strided input gets no gradient


def test_refuses_what_it_cannot_run(device):
    ones = torch.ones(16, device=device)
    with pytest.raises(ValueError, match="normalized dim 2048 is outside 1..1024"):
        norms.rms_norm(torch.zeros(2, 2048, device=device), torch.ones(2048, device=device), EPS)
    with pytest.raises(ValueError, match="normalized dim of x must be contiguous"):
        norms.rms_norm(torch.zeros(16, 4, device=device).T, torch.ones(16, device=device), EPS)
    with pytest.raises(ValueError, match=r"the bias must be a \(16,\) tensor"):
        norms.layer_norm(torch.zeros(4, 16, device=device), ones, torch.ones(8, device=device), EPS)
    with pytest.raises(ValueError, match="layer_norm needs a bias"):
        norms.layer_norm(torch.zeros(4, 16, device=device), ones, None, EPS)
    with pytest.raises(ValueError, match=r"x must be \(rows, dim\) or \(tokens, heads, dim\)"):
        norms.rms_norm(torch.zeros(16, device=device), ones, EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_gpu_model_shapes_match_the_float32_formulas(kind):
    if kind == "rms":  # the QK-norm: heads of 64 in a strided view
        x = _strided((300_000, 4, 64), torch.bfloat16, "cuda")
    else:  # the history LayerNorm: rows of 256
        x = (torch.randn(500_000, 256, device="cuda") * 3 + 1).to(torch.bfloat16).requires_grad_()
    _compare(kind, x, BF16_RTOL)
