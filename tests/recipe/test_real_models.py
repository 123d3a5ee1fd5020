"""Recipes on real models: an HSTU block, nn.TransformerEncoderLayer, nn.MultiheadAttention, a plain SDPA block,
torchrec DLRM and DLRM_DCN (EmbeddingBagCollection, KeyedJaggedTensor). Each: apply mxfp8-rceil and mxfp4-all,
train a few steps against the unquantized model (loss close, not equal), print the plan's coverage; and the trained
model compiled (aot_eager) gives eager mode's bits (COMPILED_BY_DEFAULT: which pairs compile in the default run)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mxlab.recipe import apply_recipe
from tests.recipe.test_sites import HSTUBlock

RECIPES = ["mxfp8-rceil", "mxfp4-all"]


class SDPABlock(nn.Module):
    def __init__(self, dim=64, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        batch, n, dim = x.shape
        q, k, v = self.qkv(x).view(batch, n, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape))


class MHABlock(nn.Module):
    def __init__(self, dim=64, heads=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def _dense(name):
    torch.manual_seed(0)
    model = {
        "hstu": HSTUBlock,
        "sdpa": SDPABlock,
        "mha": MHABlock,
        "encoder": lambda: nn.TransformerEncoderLayer(64, 2, 128, dropout=0.0, batch_first=True),
    }[name]()
    return model, (torch.randn(2, 40, 64),), lambda out: out.square().mean()


def _torchrec(name):
    torchrec = pytest.importorskip("torchrec", reason="torchrec not installed (pip install mxlab[torchrec])")
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.manual_seed(0)
    tables = [
        torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=32, num_embeddings=100, feature_names=[f"f{i}"])
        for i in range(2)
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    common = dict(embedding_bag_collection=ebc, dense_in_features=16, dense_arch_layer_sizes=[64, 32])
    if name == "dlrm":
        model = DLRM(**common, over_arch_layer_sizes=[64, 1])
    else:
        model = DLRM_DCN(**common, over_arch_layer_sizes=[64, 1], dcn_num_layers=2, dcn_low_rank_dim=32)
    batch = 32
    lengths = torch.randint(1, 3, (2 * batch,))
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.randint(0, 100, (int(lengths.sum()),)), lengths=lengths
    )
    labels = torch.rand(batch, 1)
    return model, (torch.randn(batch, 16), sparse), lambda out: F.binary_cross_entropy_with_logits(out, labels)


def _model(name):
    return _torchrec(name) if name in ("dlrm", "dlrm_dcn") else _dense(name)


def _train(model, inputs, loss_fn, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(*inputs))
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


MODELS = ["hstu", "sdpa", "mha", "encoder", "dlrm", "dlrm_dcn"]
# The compile check per model: each model with one recipe by default, both recipes on a dense and a torchrec model
# (the recipes differ only in format and scale rule, which tests/nn/test_compile.py compiles for every value); the
# other recipe of each model is compiled in the slow run (`make test-all`).
COMPILED_BY_DEFAULT = {
    ("hstu", "mxfp4-all"),
    ("sdpa", "mxfp8-rceil"),
    ("mha", "mxfp8-rceil"),
    ("encoder", "mxfp4-all"),
    ("dlrm", "mxfp4-all"),
    ("dlrm_dcn", "mxfp8-rceil"),
}


def _trained(name, recipe):
    """The model `name` with `recipe` applied, trained a few steps next to its unquantized copy; its inputs and
    loss."""
    plain, inputs, loss_fn = _model(name)
    model = copy.deepcopy(plain)
    plan = apply_recipe(model, recipe)
    share = plan.coverage(inputs)
    print(f"\n{name} {recipe}: coverage {share:.1%}\n{plan.table()}")
    assert share > 0.99 if name not in ("dlrm", "dlrm_dcn") else share > 0.6
    assert "high precision" not in " ".join(plan.high_precision_modules)
    reference, quantized = _train(plain, inputs, loss_fn), _train(model, inputs, loss_fn)
    assert quantized != reference
    assert all(abs(q - r) <= 0.25 * abs(r) + 0.05 for q, r in zip(quantized, reference))
    return model, inputs, loss_fn


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", MODELS)
def test_a_real_model_applies_trains_and_reports_coverage(name, recipe):
    _trained(name, recipe)


@pytest.mark.parametrize(
    "name, recipe",
    [
        pytest.param(name, recipe, marks=() if (name, recipe) in COMPILED_BY_DEFAULT else pytest.mark.slow)
        for name in MODELS
        for recipe in RECIPES
    ],
)
def test_a_trained_real_model_compiles_to_eager_bits(name, recipe):
    model, inputs, loss_fn = _trained(name, recipe)
    eager_out = model(*inputs)
    eager_loss = loss_fn(eager_out)
    eager_grads = torch.autograd.grad(eager_loss, [p for p in model.parameters() if p.requires_grad])
    compiled = torch.compile(model, backend="aot_eager")
    out = compiled(*inputs)
    grads = torch.autograd.grad(loss_fn(out), [p for p in model.parameters() if p.requires_grad])
    assert torch.equal(out, eager_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))


def test_dlrm_dcn_coverage_against_a_hand_count():
    model, inputs, _ = _torchrec("dlrm_dcn")
    plan = apply_recipe(model, "mxfp8-rceil")
    share = plan.coverage(inputs)
    batch, features = 32, 3  # the dense output and two embeddings, 32 wide each
    dense = 2 * batch * (16 * 64 + 64 * 32)
    width = features * 32
    cross = 2 * 2 * batch * (width * 32 + 32 * width)  # V then W of each of the two low-rank layers
    over = 2 * batch * (width * 64 + 64 * 1)
    assert sum(flops for flops, _ in plan.flops.values()) == dense + cross + over
    assert share == pytest.approx(1.0)
    assert plan.flops["inter_arch.crossnet.V_kernels.0"] == [2 * batch * width * 32, True]
