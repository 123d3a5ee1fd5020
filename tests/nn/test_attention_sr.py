"""Stochastic rounding in the reference jagged attention: layout-independent counters, one seed set per call.

`qmatmul(..., counters=, seeds=)` draws stochastic bits from explicit counters; the reference attention path gives
every stochastically rounded operand the counters of docs/numerics.md ("Jagged attention"), so its bits depend
neither on the length buckets nor on the chunking of the padded score tensors.
"""

from __future__ import annotations

import pytest
import torch

from mxlab.nn.attention import JaggedAttention, rounds_stochastically, score_counter, token_counter
from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant, qmatmul
from mxlab.recipe import AttentionPolicy, AttentionRecipe


def _precision(rounding: str, grad_rounding: str, block=32, fmt: str = "e4m3", seed: int = 11) -> MatmulPrecision:
    fwd, grad = OperandQuant(fmt, block, "rceil", rounding), OperandQuant(fmt, block, "rceil", grad_rounding)
    return MatmulPrecision(fwd=GemmQuant(fwd, fwd), grad_a=GemmQuant(grad, fwd), grad_b=GemmQuant(fwd, grad), seed=seed)


def _policy(rounding: str = "nearest_even", grad_rounding: str = "stochastic") -> AttentionPolicy:
    fwd = OperandQuant("e4m3", 32, "rceil", rounding)
    grad = OperandQuant("e5m2", 32, "rceil", grad_rounding)
    recipe = AttentionRecipe(fwd, grad, fwd, grad)
    return AttentionPolicy(
        qk=recipe.product_precision("qk", "attention", 1), pv=recipe.product_precision("pv", "attention", 2)
    )


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64)


def _forward_backward(a, b, grad, product):
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = product(a, b)
    return (out, *torch.autograd.grad(out, (a, b), grad))


@pytest.mark.parametrize("block", [32, (32, 32)], ids=["block32", "tile32x32"])
@pytest.mark.parametrize("rounding, grad_rounding", [("nearest_even", "toward_zero"), ("stochastic", "stochastic")])
def test_qmatmul_with_linear_index_counters_is_qmatmul_without(block, rounding, grad_rounding):
    """With each operand's row-major linear index as its counter (qmatmul's counter when nothing is padded),
    and the same call's seeds, the counted product is qmatmul bit for bit: forward and both gradients."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 64, 96, generator=generator), torch.randn(2, 96, 64, generator=generator)
    grad = torch.randn(2, 64, 64, generator=generator)
    counters = tuple(torch.arange(shape.numel()).view(shape) for shape in (a.shape, b.shape, grad.shape))
    expected = _forward_backward(a, b, grad, lambda x, y: qmatmul(x, y, _precision(rounding, grad_rounding, block)))
    seeds = _precision(rounding, grad_rounding, block).next_call_seeds()
    counted = _forward_backward(
        a,
        b,
        grad,
        lambda x, y: qmatmul(x, y, _precision(rounding, grad_rounding, block), counters=counters, seeds=seeds),
    )
    for name, actual, reference in zip(("out", "grad_a", "grad_b"), counted, expected):
        assert torch.equal(actual, reference), name
    if rounding == "stochastic":  # and the counters matter: shifted counters give other bits
        shifted = tuple(counter + 1 for counter in counters)
        moved = _forward_backward(
            a,
            b,
            grad,
            lambda x, y: qmatmul(x, y, _precision(rounding, grad_rounding, block), counters=shifted, seeds=seeds),
        )
        assert not torch.equal(moved[0], expected[0]) and not torch.equal(moved[1], expected[1])


def test_counters_are_packed_indices_and_score_coordinates():
    rows = torch.tensor([[4, 0], [7, 2]])
    tokens = token_counter(rows, heads=3, head_dim=2)
    assert tokens.shape == (2, 3, 2, 2)
    assert tokens[1, 2, 0, 1].item() == (7 * 3 + 2) * 2 + 1  # element [7, 2, 1] of a packed (tokens, 3, 2) tensor
    scores = score_counter(rows, heads=3, keys=5)
    assert scores.shape == (2, 3, 2, 5)
    assert scores[1, 2, 0, 4].item() == (4 << 32) + 7 * 3 + 2


def test_rounds_stochastically_looks_at_every_mx_operand():
    assert rounds_stochastically(_policy())
    assert rounds_stochastically(_policy("stochastic", "nearest_even"))
    assert not rounds_stochastically(_policy("nearest_even", "nearest_even"))
    assert not rounds_stochastically(AttentionPolicy(qk=None, pv=None))


LENGTHS = [31, 0, 1, 33, 5, 40]


def _attention(module: JaggedAttention, policy, causal: bool, activation: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(sum(LENGTHS), 1, 32, generator=generator) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    module.policy = policy
    out = module(q, k, v, _offsets(LENGTHS), _offsets(LENGTHS), causal=causal, activation=activation)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


@pytest.mark.parametrize("causal, activation", [(True, "softmax"), (False, "silu")])
def test_reference_stochastic_rounding_does_not_depend_on_buckets_or_chunks(causal, activation):
    """Every sequence in its own bucket and chunk, or all in one: the same quantized operands, so the same
    results up to float32 accumulation order (padding widths change the matmul shapes); the next call's
    seeds change them."""
    policy = _policy("stochastic", "stochastic")
    one_bucket = _attention(JaggedAttention(backend="reference", min_bucket_length=128), policy, causal, activation)
    policy.qk.calls = policy.pv.calls = 0
    split = _attention(
        JaggedAttention(backend="reference", min_bucket_length=1, max_scores_per_chunk=1), policy, causal, activation
    )
    assert policy.qk.calls == policy.pv.calls == 1, "one set of seeds per call, however many chunks"
    next_call = _attention(JaggedAttention(backend="reference", min_bucket_length=128), policy, causal, activation)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), one_bucket, split, next_call):
        difference = (a - b).norm() / a.norm()
        assert difference <= 1e-6, f"{name}: {difference:.2e}"
        assert (a - c).norm() / a.norm() > 1e-3, f"{name}: the next call's seeds must change the result"


def test_deterministic_policies_still_take_qmatmul(monkeypatch):
    import mxlab.nn.qmatmul as qmatmul_module

    counted_calls = []
    plain_qmatmul = qmatmul_module.qmatmul

    def recording(a, b, precision, **counted):
        counted_calls.append(counted)
        return plain_qmatmul(a, b, precision, **counted)

    monkeypatch.setattr(qmatmul_module, "qmatmul", recording)
    policy = _policy("nearest_even", "nearest_even")
    _attention(JaggedAttention(backend="reference"), policy, False, "softmax")
    assert policy.qk.calls >= 1  # qmatmul drew its seeds
    assert counted_calls and not any(
        call.get("counters") is not None for call in counted_calls
    )  # no product was given counters
