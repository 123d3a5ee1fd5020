import pytest
import torch
import torch.nn.functional as F

from mxlab.nn.attention import JaggedAttention
from mxlab.nn.rotary import rotary_embedding, rotary_table, segment_positions


def _offsets(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64)


def _naive(q, k, v, q_lengths, k_lengths, causal, activation):
    """Loop over examples with torch's own attention; empty key sets give zeros."""
    outputs, qs, ks = [], 0, 0
    for lq, lk in zip(q_lengths, k_lengths):
        qi, ki, vi = (t.transpose(0, 1) for t in (q[qs : qs + lq], k[ks : ks + lk], v[ks : ks + lk]))
        if lq and not lk:
            outputs.append(torch.zeros(lq, q.shape[1], q.shape[2], dtype=q.dtype))
        elif lq:
            if activation == "softmax":
                o = F.scaled_dot_product_attention(qi[None], ki[None], vi[None], is_causal=causal)[0]
            else:
                s = qi @ ki.transpose(-1, -2) * q.shape[-1] ** -0.5
                p = F.silu(s)
                if causal:
                    p = p.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(), 0.0)
                o = p @ vi / lk
            outputs.append(o.transpose(0, 1))
        qs, ks = qs + lq, ks + lk
    return torch.cat(outputs) if outputs else q.new_zeros(q.shape)


CASES = [
    # (q_lengths, k_lengths, causal)
    ([3, 0, 5, 1, 7], [3, 0, 5, 1, 7], True),
    ([4, 2, 6, 0], [4, 2, 6, 0], False),
    ([2, 2, 2, 2], [9, 0, 1, 70], False),  # PMA-like: short queries, long keys, one empty history
]


@pytest.mark.parametrize("activation", ["softmax", "silu"])
@pytest.mark.parametrize("q_lengths,k_lengths,causal", CASES)
def test_reference_matches_per_example_attention(q_lengths, k_lengths, causal, activation):
    torch.manual_seed(0)
    heads, dim = 2, 8
    q = torch.randn(sum(q_lengths), heads, dim, dtype=torch.float64)
    k = torch.randn(sum(k_lengths), heads, dim, dtype=torch.float64)
    v = torch.randn(sum(k_lengths), heads, dim, dtype=torch.float64)
    attention = JaggedAttention(backend="reference", min_bucket_length=2)  # several buckets
    out = attention(q, k, v, _offsets(q_lengths), _offsets(k_lengths), causal=causal, activation=activation)
    expected = _naive(q, k, v, q_lengths, k_lengths, causal, activation)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)  # statistics in float32


def test_empty_histories_give_exact_zeros_and_chunking_does_not_change_results():
    torch.manual_seed(1)
    q_lengths, k_lengths = [1, 1, 1], [0, 5, 0]
    q, k, v = torch.randn(3, 1, 4), torch.randn(5, 1, 4), torch.randn(5, 1, 4)
    small_chunks = JaggedAttention(backend="reference", max_scores_per_chunk=1)
    out = small_chunks(q, k, v, _offsets(q_lengths), _offsets(k_lengths))
    assert torch.equal(out[0], torch.zeros(1, 4)) and torch.equal(out[2], torch.zeros(1, 4))
    whole = JaggedAttention(backend="reference")(q, k, v, _offsets(q_lengths), _offsets(k_lengths))
    torch.testing.assert_close(out, whole)
    none_at_all = JaggedAttention()(q, k[:0], v[:0], _offsets(q_lengths), _offsets([0, 0, 0]))
    assert torch.equal(none_at_all, torch.zeros_like(q))


def test_no_leakage_between_sequences_or_from_padding():
    torch.manual_seed(2)
    lengths = [3, 6, 2]
    q, k, v = (torch.randn(11, 2, 4) for _ in range(3))
    attention = JaggedAttention(backend="reference")
    base = attention(q, k, v, _offsets(lengths), _offsets(lengths))
    k2, v2 = k.clone(), v.clone()
    k2[3:9] += 10 * torch.randn(6, 2, 4)  # change only the second sequence
    v2[3:9] += 10 * torch.randn(6, 2, 4)
    changed = attention(q, k2, v2, _offsets(lengths), _offsets(lengths))
    torch.testing.assert_close(changed[:3], base[:3], rtol=0, atol=0)
    torch.testing.assert_close(changed[9:], base[9:], rtol=0, atol=0)
    assert not torch.allclose(changed[3:9], base[3:9])
    # gradients stay inside each example
    k3 = k.clone().requires_grad_(True)
    attention(q, k3, v, _offsets(lengths), _offsets(lengths))[:3].sum().backward()
    assert k3.grad[3:].abs().max() == 0 and k3.grad[:3].abs().max() > 0


@pytest.mark.parametrize(
    "q_lengths,k_lengths,causal", [([2, 3, 1], [5, 0, 4], False), ([130, 0, 7, 200], [130, 0, 7, 200], True)]
)
def test_flex_backend_matches_reference_on_cpu(q_lengths, k_lengths, causal):
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(3)
    q = torch.randn(sum(q_lengths), 2, 16)
    k, v = torch.randn(sum(k_lengths), 2, 16), torch.randn(sum(k_lengths), 2, 16)
    args = (q, k, v, _offsets(q_lengths), _offsets(k_lengths))
    flex = JaggedAttention(backend="flex", min_bucket_length=256)(*args, causal=causal)
    reference = JaggedAttention(backend="reference")(*args, causal=causal)
    torch.testing.assert_close(flex, reference, rtol=1e-5, atol=1e-5)


def test_length_block_mask_visits_exactly_the_tiles_with_real_pairs():
    from torch.nn.attention.flex_attention import create_block_mask

    from mxlab.nn.flex import length_block_mask

    q_lengths, k_lengths = torch.tensor([130, 0, 7, 300]), torch.tensor([260, 5, 0, 300])
    for causal in (False, True):

        def mask_mod(b, h, q_idx, kv_idx):
            keep = (kv_idx < k_lengths[b]) & (q_idx < q_lengths[b])
            return keep & (kv_idx <= q_idx) if causal else keep

        ours = length_block_mask(q_lengths, k_lengths, 300, 300, causal, mask_mod).to_dense()
        dense = create_block_mask(mask_mod, 4, None, 300, 300, device="cpu").to_dense()
        assert torch.equal(ours, dense)


class _RecordingPrecision(str):
    def next_call_seeds(self):
        return (0,) * 12


class _RecordingPolicy:
    qk = _RecordingPrecision("precision-for-qk")
    pv = _RecordingPrecision("precision-for-pv")


def test_policy_routes_both_products_through_qmatmul(monkeypatch):
    """QK^T goes through qmatmul; MX softmax's PV through qmatmul of the normalized P (the gradient path) and
    forward_product of P relative to the running maximum, per block of 32 keys (the value); padding is
    exactly 0 in both. (Inputs that need gradients: without them the gradient path is skipped.)"""
    import mxlab.nn.qmatmul as qmatmul_module

    seen, seen_forward = [], []

    def fake_qmatmul(a, b, precision, **counted):
        seen.append((precision, a.shape, b.shape, a.detach().clone()))
        return torch.matmul(a, b)

    def fake_forward_product(a, b, precision, *, seeds, counters):
        seen_forward.append((precision, a.clone()))
        return torch.matmul(a.float(), b.float())

    monkeypatch.setattr(qmatmul_module, "qmatmul", fake_qmatmul)
    monkeypatch.setattr(qmatmul_module, "forward_product", fake_forward_product)
    torch.manual_seed(4)
    lengths = [2, 3]
    q, k, v = (torch.randn(5, 1, 4, requires_grad=True) for _ in range(3))
    attention = JaggedAttention()
    expected = attention(q, k, v, _offsets(lengths), _offsets(lengths))
    attention.policy = _RecordingPolicy()
    out = attention(q, k, v, _offsets(lengths), _offsets(lengths))
    torch.testing.assert_close(out, expected)  # unquantized, the one-pass form is the softmax
    assert [precision for precision, *_ in seen] == ["precision-for-qk", "precision-for-pv"]
    assert [precision for precision, _ in seen_forward] == ["precision-for-pv"]
    p = seen[1][3]  # (n, heads, Lq, Lk): example 0 has 2 queries and keys; its padding row and column are exactly 0
    assert p.shape[-2:] == (3, 3)
    assert torch.equal(p[0, :, :, 2], torch.zeros_like(p[0, :, :, 2])) and torch.equal(
        p[0, :, 2, :], torch.zeros_like(p[0, :, 2, :])
    )
    assert (p[0, :, :2, :2] > 0).all()
    blocks = seen_forward[0][1]  # (n, heads, key blocks, Lq, 32): keys padded to one block of 32
    assert blocks.shape[-3:] == (1, 3, 32)
    assert torch.equal(blocks[0, :, 0, :, 2:], torch.zeros_like(blocks[0, :, 0, :, 2:]))
    assert torch.equal(blocks[0, :, 0, 2, :], torch.zeros_like(blocks[0, :, 0, 2, :]))


def test_bad_arguments_are_refused():
    q = torch.randn(3, 1, 4)
    attention = JaggedAttention()
    with pytest.raises(ValueError, match="activation 'relu'"):
        attention(q, q, q, _offsets([3]), _offsets([3]), activation="relu")
    with pytest.raises(ValueError, match="causal"):
        attention(q, q[:2], q[:2], _offsets([3]), _offsets([2]), causal=True)
    with pytest.raises(ValueError, match="k_offsets"):
        attention(q, q, q, _offsets([3]), _offsets([2]))
    with pytest.raises(ValueError, match="backend"):
        JaggedAttention(backend="cudnn")


def test_rotary_is_relative_and_positions_restart_per_sequence():
    offsets = _offsets([2, 0, 3])
    assert segment_positions(offsets).tolist() == [0, 1, 0, 1, 2]
    torch.manual_seed(5)
    q, k = torch.randn(1, 1, 8), torch.randn(1, 1, 8)

    def score(pq, pk):
        return (
            rotary_embedding(q, rotary_table(torch.tensor([pq]), 8))
            * rotary_embedding(k, rotary_table(torch.tensor([pk]), 8))
        ).sum()

    torch.testing.assert_close(score(3, 1), score(10, 8))
    assert not torch.allclose(score(3, 1), score(3, 2))
    with pytest.raises(ValueError, match="even head_dim"):
        rotary_table(torch.tensor([0]), 7)
    with pytest.raises(ValueError, match=r"rotary table \(1, 4\) does not match x \(1, 1, 6\)"):
        rotary_embedding(torch.randn(1, 1, 6), rotary_table(torch.tensor([0]), 8))


def test_triton_backend_dispatch(monkeypatch):
    import types

    import mxlab.nn.attention as attention_module

    calls = []
    fake = types.ModuleType("mxlab.kernels.attention")
    fake.unsupported_reason = lambda q, policy, activation: None if q.dtype == torch.bfloat16 else f"dtype {q.dtype}"
    fake.check_jagged_offsets = lambda qo, ko, total_q, total_k, device, causal: calls.append(
        ("checked", total_q, total_k)
    )
    fake.jagged_attention_checked = lambda q, k, v, qo, ko, *, causal, activation, policy, seeds: (
        calls.append((causal, activation, policy)) or q * 2
    )
    monkeypatch.setattr(attention_module, "_triton_kernel", lambda: fake)
    q = torch.randn(3, 1, 32, dtype=torch.bfloat16)
    attention = JaggedAttention(backend="triton")
    attention.policy = _RecordingPolicy()
    out = attention(q, q, q, _offsets([3]), _offsets([3]), causal=True, activation="silu")
    assert torch.equal(out, q * 2) and calls == [("checked", 3, 3), (True, "silu", attention.policy)]
    with pytest.raises(ValueError, match="cannot run these inputs: dtype torch.float32"):
        attention(q.float(), q.float(), q.float(), _offsets([3]), _offsets([3]))
    # "auto" never takes the kernel for CPU tensors
    auto = JaggedAttention()
    auto(q, q, q, _offsets([3]), _offsets([3]))
    assert len(calls) == 2


def _mx_attention_policy():
    from mxlab.nn.qmatmul import OperandQuant
    from mxlab.recipe import AttentionPolicy, AttentionRecipe

    quant = OperandQuant("e4m3", 32, "floor", "nearest_even")
    recipe = AttentionRecipe(quant, quant, quant, quant)
    return AttentionPolicy(qk=recipe.product_precision("qk", "test", 1), pv=recipe.product_precision("pv", "test", 2))


def test_mx_softmax_follows_the_one_pass_contract_forward_and_backward():
    """docs/numerics.md, "Jagged attention": P relative to the running row maximum of each block of 32 keys,
    quantized along the keys, the blocks' products rescaled to the final maximum and divided by the sum;
    the backward's row term is rowsum(dO * out). Written out here for one sequence (3 queries, 70 keys, the
    largest scores in the last block, so the running maximum moves) with fake_quantize alone."""
    from mxlab.numerics.quant import fake_quantize

    generator = torch.Generator().manual_seed(5)
    dim = 32
    q = torch.randn(3, 1, dim, generator=generator).bfloat16().requires_grad_()
    k = torch.randn(70, 1, dim, generator=generator)
    k[64:] *= 3.0
    k = k.bfloat16().requires_grad_()
    v = torch.randn(70, 1, dim, generator=generator).bfloat16().requires_grad_()
    grad = torch.randn(3, 1, dim, generator=generator).bfloat16()
    attention = JaggedAttention(backend="reference")
    attention.policy = _mx_attention_policy()
    out = attention(q, k, v, _offsets([3]), _offsets([70]))
    (dq,) = torch.autograd.grad(out, (q,), grad)

    def quant(x, axis):
        return fake_quantize(x.float(), "e4m3", axis=axis, pad=True)

    qf, kf, vf, g = q[:, 0].detach().float(), k[:, 0].detach().float(), v[:, 0].detach().float(), grad[:, 0].float()
    s = (quant(qf, -1) @ quant(kf, -1).T).bfloat16().float() * dim**-0.5
    m, l = s.amax(-1, keepdim=True), torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True)
    v_keys, acc, running = quant(vf, 0), torch.zeros(3, dim), torch.full((3, 1), -float("inf"))
    for start in range(0, 70, 32):
        block = s[:, start : start + 32]
        new = torch.maximum(running, block.amax(-1, keepdim=True))
        acc = acc * torch.exp(running - new) + quant(torch.exp(block - new), -1) @ v_keys[start : start + 32]
        running = new
    expected = (acc / l).bfloat16()
    assert torch.equal(running, m)
    torch.testing.assert_close(out[:, 0], expected, rtol=2.0**-7, atol=0.0)  # float32 order: at most one bf16 ulp

    p = torch.exp(s - m) / l
    dp = quant(g, -1) @ quant(vf, -1).T
    ds = (p * (dp - (g * out[:, 0].detach().float()).sum(-1, keepdim=True)) * dim**-0.5).bfloat16().float()
    expected_dq = (quant(ds, -1) @ quant(kf, 0)).bfloat16()
    close = (dq[:, 0].float() - expected_dq.float()).abs() <= 2.0**-7 * expected_dq.float().abs() + 1e-6
    assert close.float().mean() >= 0.9  # a flipped rounding of dS moves a few elements by more than an ulp
    p_row_term = (p * dp).sum(-1, keepdim=True)  # plain softmax autograd's row term gives another dQ
    other_ds = (p * (dp - p_row_term) * dim**-0.5).bfloat16().float()
    other_dq = (quant(other_ds, -1) @ quant(kf, 0)).bfloat16()
    assert (
        (other_dq.float() - expected_dq.float()).abs() > 2.0**-7 * expected_dq.float().abs() + 1e-6
    ).float().mean() > 0.5


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_mx_softmax_without_gradients_gives_the_bits_of_a_differentiable_call(rounding, monkeypatch):
    """Under no_grad the one-pass output skips its gradient path (qmatmul of the normalized P, whose forward
    value the contract replaces): the same output bits as a call that records gradients, and one qmatmul of
    P and V fewer."""
    import mxlab.nn.qmatmul as qmatmul_module
    from mxlab.nn.qmatmul import OperandQuant
    from mxlab.recipe import AttentionPolicy, AttentionRecipe

    quant = OperandQuant("e4m3", 32, "rceil", rounding)
    recipe = AttentionRecipe(quant, quant, quant, quant)
    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(71, 2, 32, generator=generator).bfloat16().requires_grad_() for _ in range(3))
    outputs, products = [], []
    counted = qmatmul_module.qmatmul

    def counting(*args, **kwargs):
        products[-1] += 1
        return counted(*args, **kwargs)

    monkeypatch.setattr(qmatmul_module, "qmatmul", counting)
    for grad_enabled in (True, False):
        attention = JaggedAttention(backend="reference")  # a fresh policy: the same seeds for both calls
        attention.policy = AttentionPolicy(
            qk=recipe.product_precision("qk", "test", 1), pv=recipe.product_precision("pv", "test", 2)
        )
        products.append(0)
        with torch.set_grad_enabled(grad_enabled):
            outputs.append(attention(q, k, v, _offsets([38, 33]), _offsets([38, 33]), causal=True))
    assert torch.equal(outputs[0], outputs[1])
    assert products == [products[1] + 1, products[1]] and products[1] >= 1


def test_a_policy_with_a_high_precision_pv_product_keeps_the_plain_softmax(monkeypatch):
    """No quantized P, no one-pass contract: PV is the softmax times V (the recipe's pv precision is None)."""
    import mxlab.nn.attention as attention_module
    from mxlab.recipe import AttentionPolicy

    def refuse(*args, **kwargs):
        raise AssertionError("the one-pass contract ran without a quantized P")

    monkeypatch.setattr(attention_module, "_one_pass_softmax_output", refuse)
    policy = _mx_attention_policy()
    torch.manual_seed(6)
    q, k, v = (torch.randn(40, 2, 32, requires_grad=True) for _ in range(3))
    attention = JaggedAttention(backend="reference")
    attention.policy = AttentionPolicy(qk=policy.qk, pv=None)
    out = attention(q, k, v, _offsets([7, 33]), _offsets([7, 33]), causal=True)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
