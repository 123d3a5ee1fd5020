"""GEMM sites without a module (mxlab.recipe.sites): each kind against a hand emulation (fake-quantized operands, then
the high-precision product), forward and backward; the plan's coverage against a hand count; bad input."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mxlab.nn.attention import JaggedAttention
from mxlab.numerics.quant import fake_quantize
from mxlab.recipe import apply_recipe, load_recipe


def fq(x, axis):
    return fake_quantize(x.detach().float(), "e4m3", axis=axis, scale_mode="rceil", pad=True)


def hand(a, b, g):
    """(a @ b, grad of a, grad of b) with every operand quantized along the contraction of its GEMM (mxfp8-rceil)."""
    return fq(a, -1) @ fq(b, -2), fq(g, -1) @ fq(b, -1).transpose(-1, -2), fq(a, -2).transpose(-1, -2) @ fq(g, -2)


class Holder(nn.Module):
    def __init__(self, fn, **parameters):
        super().__init__()
        self.fn = fn
        for name, value in parameters.items():
            setattr(self, name, nn.Parameter(value))

    def forward(self, *args):
        return self.fn(self, *args)


def _run(module, *inputs, grad):
    apply_recipe(module, "mxfp8-rceil")
    inputs = [x.clone().requires_grad_() for x in inputs]
    out = module(*inputs)
    out.backward(grad)
    return out, inputs


def test_mm_with_a_parameter_on_either_side_equals_the_hand_emulation():
    torch.manual_seed(0)
    x, w, g = torch.randn(48, 64), torch.randn(64, 40), torch.randn(48, 40)
    module = Holder(lambda m, x: torch.mm(x, m.w), w=w)
    out, (xi,) = _run(module, x, grad=g)
    y, gx, gw = hand(x, w, g)
    assert torch.equal(out, y) and torch.equal(xi.grad, gx) and torch.equal(module.w.grad, gw)
    left = Holder(lambda m, x: m.w @ x, w=w.t().contiguous())  # W @ x: the weight is the left operand
    out, (xi,) = _run(left, x.t().contiguous(), grad=g.t().contiguous())
    y, gw, gx = hand(w.t(), x.t(), g.t())
    assert torch.equal(out, y) and torch.equal(xi.grad, gx) and torch.equal(left.w.grad, gw)


def test_functional_linear_on_a_parameter_equals_qlinear_and_the_hand_emulation():
    torch.manual_seed(1)
    x, w, b, g = torch.randn(3, 16, 64), torch.randn(48, 64), torch.randn(48), torch.randn(3, 16, 48)
    module = Holder(lambda m, x: F.linear(x, m.w, m.b), w=w, b=b)
    out, (xi,) = _run(module, x, grad=g)
    y, gx, gw = hand(x.reshape(-1, 64), w.t(), g.reshape(-1, 48))
    assert torch.equal(out, (y + b).reshape(3, 16, 48))
    assert torch.equal(xi.grad, gx.reshape(x.shape)) and torch.equal(module.w.grad, gw.t())
    assert torch.allclose(module.b.grad, g.sum((0, 1)))


def test_products_of_two_activations_bmm_and_einsum_equal_the_hand_emulation():
    torch.manual_seed(2)
    a, b, g = torch.randn(4, 24, 64), torch.randn(4, 64, 24), torch.randn(4, 24, 24)
    module = Holder(lambda m, a, b: torch.bmm(a, b))
    out, (ai, bi) = _run(module, a, b, grad=g)
    y, ga, gb = hand(a, b, g)
    assert torch.equal(out, y) and torch.equal(ai.grad, ga) and torch.equal(bi.grad, gb)
    q, k, g = torch.randn(2, 24, 2, 32), torch.randn(2, 40, 2, 32), torch.randn(2, 2, 24, 40)
    module = Holder(lambda m, q, k: torch.einsum("bnhd,bmhd->bhnm", q, k))
    out, (qi, ki) = _run(module, q, k, grad=g)
    y, gq, gk = hand(q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), g)
    assert torch.equal(out, y) and torch.equal(qi.grad, gq.permute(0, 2, 1, 3))
    assert torch.equal(ki.grad, gk.permute(0, 3, 1, 2))


def test_addmm_with_a_parameter_adds_the_bias_in_the_accumulator():
    torch.manual_seed(3)
    x, w, b, g = torch.randn(32, 64), torch.randn(64, 32), torch.randn(32), torch.randn(32, 32)
    module = Holder(lambda m, x: torch.addmm(m.b, x, m.w), w=w, b=b)
    out, (xi,) = _run(module, x, grad=g)
    y, gx, gw = hand(x, w, g)
    assert torch.equal(out, y + b) and torch.equal(xi.grad, gx) and torch.equal(module.w.grad, gw)


@pytest.mark.parametrize("masking", ["is_causal", "bool_mask"])
def test_scaled_dot_product_attention_equals_jagged_attention_under_the_attention_table(masking):
    """QK^T and PV under [attention], P by the one-pass contract: the same as JaggedAttention's reference
    (itself checked against fake_quantize in tests/nn/test_attention.py), forward and backward."""
    torch.manual_seed(4)
    batch, heads, length, dim = 2, 2, 40, 32
    q, k, v = (torch.randn(batch, heads, length, dim) for _ in range(3))
    g = torch.randn(batch, heads, length, dim)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if masking == "is_causal":
        module = Holder(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    else:
        module = Holder(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=causal))
    out, (qi, ki, vi) = _run(module, q, k, v, grad=g)
    jagged = JaggedAttention(backend="reference")
    holder = nn.Sequential(jagged)
    apply_recipe(holder, "mxfp8-rceil")
    offsets = torch.arange(0, (batch + 1) * length, length)

    def packed(x):
        return x.detach().transpose(1, 2).reshape(batch * length, heads, dim).requires_grad_()

    qj, kj, vj = packed(q), packed(k), packed(v)
    ref = jagged(qj, kj, vj, offsets, offsets, causal=True)
    ref.backward(packed(g).detach())
    torch.testing.assert_close(out, ref.reshape(batch, length, heads, dim).transpose(1, 2), rtol=1e-6, atol=1e-6)
    for mine, theirs in ((qi, qj), (ki, kj), (vi, vj)):
        torch.testing.assert_close(mine.grad, theirs.grad.reshape(batch, length, heads, dim).transpose(1, 2))


class HSTUBlock(nn.Module):
    """An HSTU block in the public reference's style: `_uvqk` a Parameter applied with torch.mm, attention by
    einsum with SiLU, gating by u, an output linear layer."""

    def __init__(self, dim=64, heads=2, head_dim=32):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self._uvqk = nn.Parameter(torch.randn(dim, 4 * heads * head_dim) * dim**-0.5)
        self._o = nn.Linear(heads * head_dim, dim)

    def forward(self, x):
        batch, n, _ = x.shape
        uvqk = F.silu(torch.mm(x.reshape(batch * n, -1), self._uvqk)).reshape(batch, n, -1)
        u, v, q, k = uvqk.split(self.heads * self.head_dim, dim=-1)
        q, k, v = (t.reshape(batch, n, self.heads, self.head_dim) for t in (q, k, v))
        attention = F.silu(torch.einsum("bnhd,bmhd->bhnm", q, k)) / n
        out = torch.einsum("bhnm,bmhd->bnhd", attention, v).reshape(batch, n, -1)
        return x + self._o(u * out)


def test_the_hstu_block_coverage_against_a_hand_count():
    torch.manual_seed(5)
    block, x = HSTUBlock(), torch.randn(2, 40, 64)
    recipe = load_recipe("mxfp8-rceil").table
    recipe["policies"]["high"] = {"all": "bf16"}
    recipe["rules"] = [{"match": "einsum*", "policy": "high"}]
    from mxlab.recipe import parse_recipe

    plan = apply_recipe(block, parse_recipe(recipe))
    share = plan.coverage(x)
    tokens = 2 * 40
    uvqk, attention, out = 2 * tokens * 64 * 256, 2 * 2 * 2 * 40 * 40 * 32, 2 * tokens * 64 * 64
    assert share == pytest.approx((uvqk + out) / (uvqk + out + 2 * attention))
    assert plan.flops["_uvqk"] == [uvqk, True] and plan.flops["einsum.1"] == [attention, False]
    table = plan.table()
    assert "coverage: 80.0% of forward GEMM FLOPs under MX" in table and "rule einsum*" in table
    assert plan.quantized_modules == ["_o", "_uvqk"] and plan.high_precision_modules == ["einsum", "einsum.1"]


def test_a_rule_naming_no_site_is_one_error_listing_the_sites():
    recipe = load_recipe("mxfp8-rceil").table
    recipe["rules"] = [{"match": "blocks.9.*", "policy": "mx"}]
    from mxlab.recipe import parse_recipe

    with pytest.raises(ValueError, match=r"matches no module or GEMM site.*Reachable sites: _o, _uvqk"):
        apply_recipe(HSTUBlock(), parse_recipe(recipe))


def test_an_attention_table_with_no_attention_warns_and_an_op_it_cannot_take_is_named():
    model = nn.Sequential(nn.Linear(64, 32))
    plan = apply_recipe(model, "mxfp8-rceil")
    with pytest.warns(UserWarning, match=r"\[attention\] table but the model runs no attention"):
        plan.coverage(torch.randn(4, 64))
    module = Holder(lambda m, x: torch.mv(m.w, x), w=torch.randn(32, 64))
    apply_recipe(module, "mxfp8-rceil")
    with pytest.raises(ValueError, match=r"GEMM site 'mv' \(mv\): an op the emulation does not take"):
        module(torch.randn(64))
    module = Holder(lambda m, x: torch.mv(m.w, x), w=torch.randn(32, 64))
    plan = apply_recipe(module, "mxfp8-rceil", unsupported="high_precision")
    with pytest.warns(UserWarning, match="runs in high precision"):
        plan.coverage(torch.randn(64))
    assert plan.high_precision_modules == ["mv"] and "an op the emulation does not take" in plan.table()


class LowRankCross(nn.Module):
    """DCN-v2's low-rank cross layers: functional GEMMs on Parameters in a loop, and elementwise ops between them."""

    def __init__(self, width=96, rank=32, layers=2):
        super().__init__()
        self.V = nn.ParameterList([nn.Parameter(torch.randn(rank, width) / width**0.5) for _ in range(layers)])
        self.W = nn.ParameterList([nn.Parameter(torch.randn(width, rank) / rank**0.5) for _ in range(layers)])
        self.bias = nn.ParameterList([nn.Parameter(torch.full((width,), 0.1)) for _ in range(layers)])

    def forward(self, x):
        x0 = xl = x
        for layer in range(len(self.V)):
            xl = x0 * (F.linear(F.linear(xl, self.V[layer]), self.W[layer]) + self.bias[layer]) + xl
        return xl


class CrossModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense, self.cross, self.over = nn.Linear(16, 32), LowRankCross(), nn.Linear(96, 1)

    def forward(self, x, sparse):
        combined = torch.cat((self.dense(x).unsqueeze(1), sparse), dim=1)
        return self.over(self.cross(combined.reshape(x.shape[0], -1)))


def test_a_cross_network_compiles_to_eager_bits():
    """Regression: the elementwise ops between GEMM sites ran a graph compiled for another op (`+` as `*`)."""
    torch.manual_seed(0)
    model = CrossModel()
    apply_recipe(model, "mxfp8-rceil")
    inputs = (torch.randn(32, 16), torch.randn(32, 2, 32))
    eager = model(*inputs)
    eager_grads = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, backend="aot_eager")(*inputs)
    grads = torch.autograd.grad(compiled.square().sum(), list(model.parameters()))
    assert torch.equal(compiled, eager)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))


def test_inductor_code_run_under_the_sites_mode_keeps_eager_bits():
    """Regression: a model compiled whole runs Inductor's code under the sites mode, which took the code's
    `addmm(bias, a, b, out=buf)` for a model GEMM, quantized it again and left `buf` unwritten (the backward runs
    outside the mode)."""
    torch.manual_seed(0)
    model = CrossModel()
    apply_recipe(model, "mxfp8-rceil")
    inputs = (torch.randn(32, 16), torch.randn(32, 2, 32))
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(model)(*inputs), model(*inputs))


_SKIP_PROBE = """
import sys
import torch
import torch._C._dynamo.eval_frame as frames

skipped = []
original = frames.set_code_exec_strategy
frames.set_code_exec_strategy = lambda code, strategy: (skipped.append(code), original(code, strategy))[1]
{first}
import torch._dynamo  # noqa: F401
{second}
from mxlab.recipe.sites import GemmSites
print(GemmSites.__torch_function__.__code__ in skipped, "torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("dynamo_first", [False, True])
def test_the_sites_mode_frame_is_skipped_by_dynamo_whichever_is_imported_first(dynamo_first):
    """The mode's own frame is never compiled on its own (a graph compiled for one op ran for another): its code is
    marked to skip once Dynamo is imported, also when mxlab was imported before Dynamo (lazily, by an import hook)."""
    import subprocess
    import sys

    first, second = ("", "import mxlab.recipe.sites") if dynamo_first else ("import mxlab.recipe.sites", "")
    if not dynamo_first:
        first += "\nassert 'torch._dynamo' not in sys.modules, 'importing mxlab.recipe imported Dynamo'"
    probe = _SKIP_PROBE.format(first=first, second=second)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
