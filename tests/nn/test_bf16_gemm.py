"""BF16 GEMMs of CPU autocast as float32 GEMMs of bfloat16-rounded operands (mxlab.nn.bf16_gemm) against
CPU autocast's own bfloat16 kernels: the same dtype, forward and backward; the same bits where the
accumulation order cannot matter (sums of exact values), at most one bfloat16 rounding apart otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mxlab.experiment.step import autocast
from mxlab.nn.bf16_gemm import bf16_gemms_in_float32


def _run(fn, *inputs, emulated: bool):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if emulated:
            with bf16_gemms_in_float32():
                out = fn(*leaves)
        else:
            out = fn(*leaves)
    out.float().square().sum().backward()
    return out, [leaf.grad for leaf in leaves]


CASES = {
    "linear": (lambda x, w, b: F.linear(x, w, b), [(64, 48), (40, 48), (40,)]),
    "matmul": (lambda a, b: a @ b, [(3, 64, 48), (48, 40)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 64, 48), (3, 48, 40)]),
    "einsum": (lambda q, k: torch.einsum("bhtd,bhsd->bhts", q, k), [(2, 2, 16, 32), (2, 2, 24, 32)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b), [(64, 40), (64, 48), (48, 40)]),
    # operands in a list, and tensors passed by keyword: the mode finds and rounds them there too
    "einsum-list": (lambda a, b: torch.einsum("ij,jk->ik", [a, b]), [(64, 48), (48, 40)]),
    "linear-keywords": (lambda x, w, b: F.linear(input=x, weight=w, bias=b), [(64, 48), (40, 48), (40,)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_values_give_autocasts_bits_forward_and_backward(name):
    """Small integers: every product and partial sum is exact, so any accumulation order gives the same bits."""
    fn, shapes = CASES[name]
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randint(-3, 4, shape, generator=generator).float() for shape in shapes]
    real, real_grads = _run(fn, *inputs, emulated=False)
    ours, our_grads = _run(fn, *inputs, emulated=True)
    assert ours.dtype == real.dtype == torch.bfloat16
    assert torch.equal(ours, real)
    for mine, theirs in zip(our_grads, real_grads):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_values_are_within_one_bfloat16_rounding_of_autocast(name):
    fn, shapes = CASES[name]
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(shape, generator=generator) for shape in shapes]
    real, real_grads = _run(fn, *inputs, emulated=False)
    ours, our_grads = _run(fn, *inputs, emulated=True)
    for mine, theirs in [(ours, real), *zip(our_grads, real_grads)]:
        step = 2.0**-7 * theirs.float().abs().clamp_min(2.0**-20)  # one bfloat16 rounding at each value
        assert mine.dtype == theirs.dtype and ((mine.float() - theirs.float()).abs() <= step).all()


def test_outside_cpu_bfloat16_autocast_nothing_changes():
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    with bf16_gemms_in_float32():
        plain = F.linear(x, w)
    assert plain.dtype == torch.float32 and torch.equal(plain, F.linear(x, w))
    with torch.autocast("cpu", dtype=torch.bfloat16), bf16_gemms_in_float32():
        doubles = F.linear(x.double(), w.double())  # autocast leaves float64 alone, and so does the mode
    assert doubles.dtype == torch.float64


def test_the_training_steps_cpu_autocast_uses_it():
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    with autocast(torch.device("cpu"), "bf16"):
        ours = F.linear(x, w)
    expected = F.linear(x.bfloat16().float(), w.bfloat16().float()).bfloat16()
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, expected)
