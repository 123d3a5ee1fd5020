"""A recipe in a user's own model and loop: recipe names, meta tensors, lazy modules, loss scaling the user calls,
and PyTorch's fused TransformerEncoderLayer path kept from bypassing the emulated layers."""

import pytest
import torch
from torch import nn

from mxlab.nn.linear import QLinear
from mxlab.recipe import LossScaler, Plan, apply_recipe, load_recipe


def test_apply_recipe_takes_a_recipe_name():
    model = nn.Sequential(nn.Linear(64, 32))
    plan = apply_recipe(model, "mxfp8-rceil")
    assert plan.recipe == "mxfp8-rceil" and isinstance(model[0], QLinear)
    with pytest.raises(ValueError, match="no recipe 'no-such-recipe'"):
        apply_recipe(nn.Sequential(nn.Linear(64, 32)), "no-such-recipe")


def test_a_bare_linear_model_is_refused_with_the_way_round():
    layer = nn.Linear(64, 32)
    with pytest.raises(ValueError, match=r"the model itself is a Linear.*nn.Sequential\(layer\)"):
        apply_recipe(layer, "mxfp8-rceil")
    model = nn.Sequential(layer)
    apply_recipe(model, "mxfp8-rceil")
    assert isinstance(model[0], QLinear)


def test_a_forward_on_meta_tensors_gives_the_shapes():
    model = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 32)).to("meta")
    apply_recipe(model, "mxfp8-rceil")
    y = model(torch.empty(5, 7, 64, device="meta"))
    assert y.shape == (5, 7, 32) and y.device.type == "meta" and y.dtype == torch.float32


def test_a_lazy_linear_is_refused_by_name_until_materialised():
    model = nn.Sequential(nn.Linear(64, 32), nn.LazyLinear(16))
    with pytest.raises(ValueError, match=r"lazy module\(s\) 1 have no weights yet; run one forward"):
        apply_recipe(model, "mxfp8-rceil")
    assert type(model[0]) is nn.Linear  # refused before any swap
    model(torch.randn(2, 64))
    plan = apply_recipe(model, "mxfp8-rceil")
    assert plan.quantized_modules == ["0", "1"]


def test_the_plan_says_what_the_loop_calls_and_makes_the_scaler():
    model = nn.Sequential(nn.Linear(64, 32))
    plan = apply_recipe(model, "mxfp8-rceil")  # loss_scaling policy dynamic
    assert "scaler.scale(loss).backward(); scaler.step(optimizer)" in plan.table().splitlines()[0]
    scaler = plan.loss_scaler(model)
    assert isinstance(scaler, LossScaler) and scaler.policy == "dynamic"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model[0].weight.detach().clone()
    scaler.scale(model(torch.randn(32, 64)).square().mean()).backward()
    assert scaler.step(optimizer) and not torch.equal(before, model[0].weight)
    assert Plan("r", 0, [], {"policy": "none"}).loss_scaling_usage == "loss scaling none"


def _encoder(recipe: str | None):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 2, dim_feedforward=128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    plan = apply_recipe(model, recipe) if recipe else None
    return model, plan


def test_transformer_encoder_layers_run_emulated_in_eval_under_no_grad():
    x = torch.randn(3, 40, 64)
    plain, _ = _encoder(None)
    model, plan = _encoder("mxfp4-all")
    notes = {entry.module: entry.note for entry in plan.entries}
    assert "fast path of layers.0 disabled" in notes["layers.0.linear1"]
    linear1 = model.layers[0].linear1
    with torch.no_grad():
        train_mode = model(x)  # dropout 0: train mode computes what eval mode must
        model.eval(), plain.eval()
        calls = linear1.precision.calls
        emulated, unquantized = model(x), plain(x)
    assert linear1.precision.calls == calls + 1  # the emulated layer ran
    # the same up to nn.MultiheadAttention's own fast path (its projections are not emulated), far from plain
    torch.testing.assert_close(emulated, train_mode, rtol=1e-5, atol=1e-5)
    assert (emulated - unquantized).abs().max() > 1e-2
    apply_recipe(model, load_recipe("mxfp4-all"))  # applying again adds no second hook
    assert len(model.layers[0]._forward_pre_hooks) == 2  # the fast-path hook and the GEMM sites' frame, once each
