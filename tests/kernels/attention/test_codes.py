"""The attention's operand codes: looked up once per policy spec, refusing what the kernels cannot run."""

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():  # the attention kernels are decorated on import: interpreted where no GPU is
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mxlab.kernels.attention import codes as attention_codes  # noqa: E402  (after TRITON_INTERPRET is set)
from mxlab.nn.precision import GemmQuant, OperandQuant  # noqa: E402


def _policy(fmt: str = "e4m3", grad_scale=None, hadamard=None):
    operand = OperandQuant(fmt, 32, "rceil")
    gemm = GemmQuant(operand, operand, hadamard)
    product = SimpleNamespace(fwd=gemm, grad_a=gemm, grad_b=gemm, grad_scale=grad_scale)
    return SimpleNamespace(qk=product, pv=product)


def test_equal_specs_share_their_codes_and_other_specs_do_not():
    first, again = attention_codes._codes(_policy()), attention_codes._codes(_policy())
    assert first is again  # cached by the specs, not by the policy object
    other = attention_codes._codes(_policy("e5m2"))
    assert other != first and other.q_d != first.q_d


def test_refuses_a_gradient_scale_and_a_hadamard_transform_on_every_call():
    for _ in range(2):  # a refusal is not cached as an answer
        with pytest.raises(ValueError, match="grad_scale is set"):
            attention_codes._codes(_policy(grad_scale=2.0))
        with pytest.raises(ValueError, match="Hadamard"):
            attention_codes._codes(_policy(hadamard=32))
