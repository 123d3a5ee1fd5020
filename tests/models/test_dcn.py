"""The DCNv2-style model: built through the builder registry, one logit per declared head, every GEMM reachable."""

from __future__ import annotations

import pytest
import torch

import mxlab
from mxlab.data import make_source
from mxlab.models import build, loss_for, validate_model_table
from mxlab.tasks import TaskSet

TABLE = {"source": "synthetic", "train_examples": 512, "eval_examples": 256, "n_users": 20, "n_items": 32}


def _source():
    return make_source(TABLE, 8)


def test_dcn_is_registered_and_returns_one_logit_per_head():
    source = _source()
    table = validate_model_table({"builder": "dcn", "cross_rank": 8, "max_history": 8})
    assert table == {
        "builder": "dcn",
        **{"size": "tiny", "dim": 16, "cross_layers": 2, "cross_rank": 8, "over_arch": [64, 32], "max_history": 8},
    }
    batch = next(iter(source.train_batches(64, 0, 0)))
    esmm = build(table, source.info, TaskSet())(batch)
    assert sorted(esmm) == ["ctr", "cvr"] and esmm["ctr"].shape == (64,) and esmm["ctr"].dtype == torch.float32
    three = build(table, source.info, TaskSet(("ctr", "a", "b"), "independent"))(batch)
    assert sorted(three) == ["a", "b", "ctr"]


def test_dcn_learns_and_a_recipe_reaches_every_gemm():
    source = _source()
    torch.manual_seed(0)
    model = build({"builder": "dcn", "over_arch": [32]}, source.info, TaskSet())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = list(source.train_batches(128, 0, 0))
    losses = []
    for batch in batches * 3:
        loss = loss_for(TaskSet())(model(batch), batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-4:]) < sum(losses[:4])
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    plan = mxlab.apply_recipe(model, mxlab.load_recipe("mxfp8-rceil"))
    assert sorted(plan.quantized_modules) == sorted(linear) and len(linear) == 8  # bottom, 2 x (down, up), arch, 2 outs
    loss_for(TaskSet())(model(batches[0]), batches[0])["loss"].backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_dcn_refuses_an_unknown_key_or_size():
    with pytest.raises(
        ValueError, match=r"unknown key 'model\.depth'; accepted keys in \[model\] of builder 'dcn': size, dim"
    ):
        validate_model_table({"builder": "dcn", "depth": 3})
    with pytest.raises(ValueError, match=r"unknown dcn size 'huge'; accepted: tiny, h200"):
        validate_model_table({"builder": "dcn", "size": "huge"})
    with pytest.raises(ValueError, match=r"unknown model builder 'dcm'; accepted: gem, dcn or an import path"):
        validate_model_table({"builder": "dcm"})
