"""The shared training recipe on a small model: the optimizer split, warm-up, clipping, base-rate biases,
health records, and the refusals of bad [train] values."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mxlab.data import make_source
from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.optim import lr_factor, make_optimizer
from mxlab.experiment.rowwise_adagrad import RowWiseAdagrad
from mxlab.experiment.spec import TrainConfig
from mxlab.experiment.training_recipe import set_output_biases
from mxlab.models import build_model
from tests.experiment.test_end_to_end import QUICKSTART

DATA = {"source": "synthetic", "train_examples": 512, "eval_examples": 256, "n_items": 40, "n_topics": 4}
MODEL = {"size": "tiny", "dim": 8, "max_history": 8, "interaction_dim": 16, "tower_dims": [8], "cross_rank": 4}


@pytest.fixture(scope="module")
def source():
    return make_source({**DATA, "base_ctr": 0.01, "base_cvr": 0.05}, 8)


def _model(source):
    torch.manual_seed(0)
    return build_model(MODEL, source.info)


def _loss_step(model, source, optimizer):
    from mxlab.models import esmm_loss

    batch = next(iter(source.train_batches(64, 0, 0)))
    optimizer.zero_grad()
    esmm_loss(model(batch), batch)["loss"].backward()
    return batch


def test_embedding_tables_take_rowwise_adagrad_and_the_rest_adamw(source):
    model = _model(source)
    optimizer = make_optimizer(TrainConfig(), model)
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    assert isinstance(optimizer.embeddings, RowWiseAdagrad) and isinstance(optimizer.dense, torch.optim.AdamW)
    assert {id(p) for g in optimizer.embeddings.param_groups for p in g["params"]} == tables
    dense = [p for g in optimizer.dense.param_groups for p in g["params"]]
    assert len(dense) + len(tables) == len(list(model.parameters())) and not tables & {id(p) for p in dense}
    decayed, plain = optimizer.dense.param_groups
    assert decayed["weight_decay"] == 0.01 and all(p.dim() >= 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])
    assert optimizer.embeddings.param_groups[0]["base_lr"] == TrainConfig().embedding_lr
    legacy = make_optimizer(TrainConfig(embedding_optimizer="dense", optimizer="adam"), model)
    assert legacy.embeddings is None and isinstance(legacy.dense, torch.optim.Adam)


def test_rowwise_adagrad_moves_only_the_rows_of_the_batch_by_the_rowwise_rule(source):
    model = _model(source)
    optimizer = make_optimizer(TrainConfig(clip_grad_norm=math.inf), model)
    table = model.embeddings.items.weight
    before = table.detach().clone()
    batch = _loss_step(model, source, optimizer)
    grad = table.grad.detach().clone()
    optimizer.step()
    touched = torch.zeros(table.shape[0], dtype=torch.bool)
    touched[batch.history_items] = True
    touched[batch.sparse[:, 0]] = True
    assert torch.equal(table[~touched], before[~touched]) and not torch.equal(table[touched], before[touched])
    state = optimizer.embeddings.state[table]["sum"]
    assert state.shape == (table.shape[0],)
    expected = before - 0.01 * grad / (grad.square().mean(1).sqrt() + 1e-8)[:, None]
    torch.testing.assert_close(table.detach(), expected)
    nan = torch.full_like(grad, math.nan)
    table.grad = nan
    snapshot = table.detach().clone()
    optimizer.embeddings.step(found_inf=torch.ones(()))  # a loss scaler's skip: nothing moves
    assert torch.equal(table.detach(), snapshot) and torch.isfinite(optimizer.embeddings.state[table]["sum"]).all()


def test_global_norm_clipping_records_the_norm_before_it(source):
    model = _model(source)
    optimizer = make_optimizer(TrainConfig(clip_grad_norm=1e-3), model)
    _loss_step(model, source, optimizer)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert norm > 1e-3
    optimizer.step()
    torch.testing.assert_close(optimizer.grad_norm, norm)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    torch.testing.assert_close(clipped, torch.tensor(1e-3), rtol=1e-4, atol=0)
    optimizer.zero_grad()
    assert optimizer.grad_norm is None


def test_linear_warmup_over_a_share_of_the_steps():
    train = TrainConfig(warmup_share=0.25, max_steps=8)
    assert [lr_factor(train, step, 8) for step in range(1, 9)] == [0.5, 1, 1, 1, 1, 1, 1, 1]
    with_decay = dataclasses.replace(train, lr_decay_steps=4)
    assert [lr_factor(with_decay, step, 8) for step in (1, 2, 5, 8)] == [0.5, 1.0, 1.0, 0.25]
    fork = dataclasses.replace(train, fork_from="bf16", fork_steps=40)  # a share of the warm-up's steps
    assert [lr_factor(fork, step, 48) for step in (1, 5, 10, 11, 41)] == [0.1, 0.5, 1.0, 1.0, 1.0]
    assert lr_factor(TrainConfig(warmup_share=0.0), 1, 8) == 1.0


def test_output_biases_start_at_the_sources_base_rates(source):
    model = _model(source)
    assert set_output_biases(model, source.info, "base-rates") == (0.01, 0.05)
    assert model.towers["ctr"].out.bias.item() == pytest.approx(math.log(0.01 / 0.99))
    assert model.towers["cvr"].out.bias.item() == pytest.approx(math.log(0.05 / 0.95))
    kept = _model(source)
    assert set_output_biases(kept, source.info, "model") is None
    assert kept.towers["ctr"].out.bias.item() == pytest.approx(math.log(0.04 / 0.96))  # [model] initial_ctr


def test_a_run_records_health_and_trains_with_the_recipe(tmp_path):
    from mxlab.experiment.runner import run_study
    from tests.experiment.test_end_to_end import MICRO

    spec = load_spec(QUICKSTART, MICRO + ['arms=["bf16"]', "train.clip_grad_norm=0.05", "train.max_steps=6"])
    assert not run_study(
        spec, tmp_path, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
    ).failed
    import json

    run = tmp_path / "runs/bf16/seed0"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["grad_norm"] > 0 and r["grad_norm_max"] >= r["grad_norm"] for r in records)
    assert sum(r["clipped"] for r in records) >= 1 and all(isinstance(r["loss_spikes"], list) for r in records)
    health = json.loads((run / "done.json").read_text())["health"]
    assert health["clipped_steps"] == sum(r["clipped"] for r in records) and health["grad_norm_max"] > 0
    config = json.loads((run / "config.json").read_text())["train"]
    assert config["embedding_optimizer"] == "rowwise-adagrad" and config["optimizer"] == "adamw"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.warmup_share=1.0", r"train\.warmup_share must be in \[0, 1\) .*got 1\.0"),
        ("train.warmup_share=-0.1", r"train\.warmup_share must be in \[0, 1\) .*got -0\.1"),
        ("train.clip_grad_norm=0", r"train\.clip_grad_norm must be > 0 .*inf = no clipping.*got 0\.0"),
        ("train.clip_grad_norm=-1.5", r"train\.clip_grad_norm must be > 0 .*got -1\.5"),
        ('train.embedding_optimizer="sparse"', r"embedding_optimizer 'sparse' is not one of: rowwise-adagrad, dense"),
        ('train.output_bias="zero"', r"output_bias 'zero' is not one of: base-rates, model"),
    ],
)
def test_bad_training_recipe_values_are_refused_naming_value_and_accepted(override, message):
    with pytest.raises(ValueError, match=message):
        load_spec(QUICKSTART, [override])


def test_clipping_can_be_turned_off_with_inf():
    assert load_spec(QUICKSTART, ["train.clip_grad_norm=inf"]).train.clip_grad_norm == math.inf


def test_health_records_the_largest_heldout_ne_rise_of_every_task():
    """One rise per held-out NE the run is evaluated on: ESMM's ctr/ctcvr or a declared head's."""
    from mxlab.experiment.health import summarize

    records = [
        {"heldout": {"ctr.ne": 0.90, "ctcvr.ne": 0.95, "ctr.auc": 0.7}},
        {"heldout": {"ctr.ne": 0.92, "ctcvr.ne": 0.93}},
        {"heldout": {"ctr.ne": 0.91, "ctcvr.ne": 0.96}},
    ]
    rises = summarize(records)["heldout_ne_largest_rise"]
    assert rises == pytest.approx({"ctcvr.ne": 0.03, "ctr.ne": 0.02})
    heads = summarize([{"heldout": {"like.ne": 0.5}}, {"heldout": {"like.ne": 0.4}}])["heldout_ne_largest_rise"]
    assert heads == pytest.approx({"like.ne": -0.1})
    assert summarize([{"grad_norm": 1.0}])["heldout_ne_largest_rise"] is None
