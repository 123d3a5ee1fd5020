"""A small data source and model for the runner's own tests, reached by a spec as plug-ins.

`[data] source = SOURCE` and `[model] builder = BUILDER`: fixed random dense-only examples with click and
conversion labels, and an MLP of one hidden layer and one output layer, small enough that the real recipes' MX
emulation on the CPU is fast. The runner's logic (pairing, checkpoints, resume, divergence, faults) is tested
on them with the real recipes: `write_recipes` puts renamed copies of shipped recipes beside a spec.

Planted faults are the builder's keywords `nan_loss_from_step` (a NaN CTR logit) and `inf_grad_from_step`
(an infinite gradient through it), counted in training forwards. They fire only in a model a recipe quantized
(a QLinear with a precision), so the BF16 arm of the same spec trains clean: that is what makes them arm-specific.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mxlab.data import DataInfo, JaggedBatch
from mxlab.nn.linear import QLinear
from mxlab.recipe import find_recipe

SOURCE = "tests.experiment.standins:StandinSource"
BUILDER = "tests.experiment.standins:build_standin"
N_DENSE = 6

# name -> (the shipped recipe it copies, its [loss_scaling] table in place of the shipped one's, or "")
RECIPES = {
    "base": ("bf16", ""),
    "noisy": ("mxfp8-rceil", ""),
    "poisoned": ("mxfp8-rceil", ""),
    # its loss scale halves on every overflow: 4 -> 2 -> 1 -> 0.5
    "collapsing": ("mxfp8-rceil", 'policy = "dynamic"\ninit_scale = 4.0\nbackoff_factor = 0.5\n'),
}


def spec_text(name: str, seeds: list[int]) -> str:
    """A spec over the stand-in source and model with arms base (BF16) and noisy (MXFP8), 12 steps per run; the
    high-precision GEMMs in float32 (no autocast: faster on the CPU)."""
    return f"""
name = "{name}"
seeds = {seeds}
baseline = "base"
arms = ["base", "noisy"]

[data]
source = "{SOURCE}"

[model]
builder = "{BUILDER}"
dim = 8
max_history = 4

[train]
batch_size = 16
lr = 0.05
epochs = 2
checkpoint_every = 4
log_every = 3
cpu_threads = 1
precision = "fp32"
"""


def recipe_text(name: str) -> str:
    """The text of the recipe `name` of RECIPES: its shipped recipe's, renamed, with its own [loss_scaling]
    table where it has one."""
    like, loss_scaling = RECIPES[name]
    text = re.sub(r'^name = ".*"$', f'name = "{name}"', find_recipe(like).read_text(), count=1, flags=re.M)
    if loss_scaling:
        text = text[: text.index("[loss_scaling]")] + "[loss_scaling]\n" + loss_scaling
    return text


def write_recipes(folder: Path, *names: str) -> None:
    """Write `folder`/recipes/NAME.toml for each of `names` (keys of RECIPES)."""
    (folder / "recipes").mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / "recipes" / f"{name}.toml").write_text(recipe_text(name))


class StandinSource:
    """Fixed random examples (the [data] keys `train_examples`, `eval_examples`); the train order is a
    permutation fixed by (seed, epoch), partial batches dropped; the eval set in a fixed order."""

    def __init__(self, table: dict, max_history: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.info = DataInfo(N_DENSE, (1,), 1, 1, False, "standin", has_history=False)
        self.n_train, self.n_eval = int(table.get("train_examples", 96)), int(table.get("eval_examples", 64))
        total = self.n_train + self.n_eval
        self.dense = torch.randn(total, N_DENSE, generator=generator)
        logits = self.dense[:, 0] - 0.5 * self.dense[:, 1]
        self.click = (torch.rand(total, generator=generator) < torch.sigmoid(logits)).float()
        self.conversion = self.click * (torch.rand(total, generator=generator) < 0.4).float()

    def _batch(self, index: torch.Tensor) -> JaggedBatch:
        rows = index.numel()
        return JaggedBatch(
            dense=self.dense[index],
            sparse=torch.zeros(rows, 1, dtype=torch.int64),
            history_items=torch.zeros(0, dtype=torch.int64),
            history_actions=torch.zeros(0, dtype=torch.int64),
            history_offsets=torch.zeros(rows + 1, dtype=torch.int64),
            click=self.click[index],
            conversion=self.conversion[index],
            user_id=index % 7,
        )

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]:
        order = torch.randperm(self.n_train, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for start in range(0, self.n_train - batch_size + 1, batch_size):
            yield self._batch(order[start : start + batch_size])

    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]:
        end = self.n_train + self.n_eval
        for start in range(self.n_train, end, batch_size):
            yield self._batch(torch.arange(start, min(start + batch_size, end)))


class InfiniteGradient(torch.autograd.Function):
    """Identity forward; an infinite gradient backward (a planted gradient overflow)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class StandinModel(nn.Module):
    """One hidden layer over the dense features and one linear output of a logit per head; returns
    {head: (B,) logit}."""

    def __init__(self, heads: tuple[str, ...], dim: int, nan_loss_from_step: int, inf_grad_from_step: int) -> None:
        super().__init__()
        self.heads = heads
        self.tower = nn.Sequential(nn.Linear(N_DENSE, dim), nn.ReLU())
        self.out = nn.Linear(dim, len(heads))
        self.nan_loss_from_step, self.inf_grad_from_step = nan_loss_from_step, inf_grad_from_step
        self.steps = 0  # training forwards so far

    def quantized(self) -> bool:
        """True when a recipe gave one of the model's layers a quantized precision."""
        return any(isinstance(module, QLinear) and module.precision is not None for module in self.modules())

    def forward(self, batch: JaggedBatch) -> dict[str, torch.Tensor]:
        logits = dict(zip(self.heads, self.out(self.tower(batch.dense)).unbind(-1)))
        if self.training and (self.nan_loss_from_step or self.inf_grad_from_step) and self.quantized():
            self.steps += 1
            if self.nan_loss_from_step and self.steps >= self.nan_loss_from_step:
                logits["ctr"] = logits["ctr"] * float("nan")
            if self.inf_grad_from_step and self.steps >= self.inf_grad_from_step:
                logits["ctr"] = InfiniteGradient.apply(logits["ctr"])
        return logits


def build_standin(
    info: DataInfo,
    heads: tuple[str, ...],
    /,
    *,
    dim: int = 8,
    max_history: int = 4,
    nan_loss_from_step: int = 0,
    inf_grad_from_step: int = 0,
) -> StandinModel:
    """The stand-in model (mxlab.models.protocols.ModelBuilder) with hidden width `dim`; `max_history` is the
    source's (the model reads no history); the fault keywords are the module docstring's (0: none)."""
    return StandinModel(tuple(heads), dim, nan_loss_from_step, inf_grad_from_step)
