"""Small stand-ins for mxlab.data / mxlab.models / mxlab.recipe with the documented interfaces.

They let the runner's own logic (pairing, checkpoints, resume, divergence) be tested in
isolation and fast; the end-to-end tests use the real modules.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class StandinBatch:
    dense: torch.Tensor
    click: torch.Tensor
    conversion: torch.Tensor
    user_id: torch.Tensor
    true_ctr: torch.Tensor | None = None
    true_cvr: torch.Tensor | None = None

    def to(self, device: Any) -> StandinBatch:
        return self


@dataclass
class StandinInfo:
    n_dense: int = 6


class StandinSource:
    """Fixed random examples; train order permuted by (seed, epoch); records every order it served."""

    def __init__(self, n_train: int = 96, n_eval: int = 64) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.info = StandinInfo()
        self.n_train, self.n_eval = n_train, n_eval
        total = n_train + n_eval
        self.dense = torch.randn(total, self.info.n_dense, generator=generator)
        logits = self.dense[:, 0] - 0.5 * self.dense[:, 1]
        self.click = (torch.rand(total, generator=generator) < torch.sigmoid(logits)).float()
        self.conversion = self.click * (torch.rand(total, generator=generator) < 0.4).float()
        self.user_id = torch.arange(total) % 7
        self.served: list[tuple[int, int, list[int]]] = []

    def _batch(self, index: torch.Tensor) -> StandinBatch:
        return StandinBatch(self.dense[index], self.click[index], self.conversion[index], self.user_id[index])

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[StandinBatch]:
        order = torch.randperm(self.n_train, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for start in range(0, self.n_train - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            self.served.append((seed, epoch, index.tolist()))
            yield self._batch(index)

    def eval_batches(self, batch_size: int) -> Iterator[StandinBatch]:
        for start in range(self.n_train, self.n_train + self.n_eval, batch_size):
            yield self._batch(torch.arange(start, min(start + batch_size, self.n_train + self.n_eval)))


@dataclass
class StandinOutput:
    ctr_logit: torch.Tensor
    cvr_logit: torch.Tensor


class InfiniteGradient(torch.autograd.Function):
    """Identity forward; an infinite gradient backward (a planted gradient overflow)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class StandinModel(nn.Module):
    def __init__(self, n_dense: int, hidden: int) -> None:
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(n_dense, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.ctr = nn.Linear(hidden, 1)
        self.cvr = nn.Linear(hidden, 1)
        self.poison_at_step: int | None = None
        self.overflow_from_step: int | None = None
        self.calls = 0

    def forward(self, batch: StandinBatch) -> StandinOutput:
        hidden = self.tower(batch.dense)
        ctr = self.ctr(hidden).squeeze(-1)
        if self.training:
            self.calls += 1
            if self.poison_at_step is not None and self.calls >= self.poison_at_step:
                ctr = ctr * float("nan")
            if self.overflow_from_step is not None and self.calls >= self.overflow_from_step:
                ctr = InfiniteGradient.apply(ctr)
        return StandinOutput(ctr, self.cvr(hidden).squeeze(-1))


def esmm_loss(output: StandinOutput, batch: StandinBatch) -> dict[str, torch.Tensor]:
    bce = nn.functional.binary_cross_entropy_with_logits
    ctr = bce(output.ctr_logit, batch.click)
    p_ctcvr = (torch.sigmoid(output.ctr_logit) * torch.sigmoid(output.cvr_logit)).clamp(1e-7, 1 - 1e-7)
    ctcvr = -(batch.conversion * p_ctcvr.log() + (1 - batch.conversion) * (1 - p_ctcvr).log()).mean()
    return {"loss": ctr + ctcvr, "ctr": ctr, "ctcvr": ctcvr}


def build_model(model_config: dict, info: StandinInfo) -> StandinModel:
    return StandinModel(info.n_dense, int(model_config.get("dim", 8)))


@dataclass
class StandinRecipe:
    name: str
    noise: float = 0.0
    poison_at_step: int | None = None
    overflow_from_step: int | None = None
    loss_scaling: dict | None = None


@dataclass
class StandinPlan:
    recipe: str

    def table(self) -> str:
        return f"plan of {self.recipe}"

    def to_dict(self) -> dict:
        return {"recipe": self.recipe}


def load_recipe(path: Any, search_dirs: Any = ()) -> StandinRecipe:
    from pathlib import Path

    import tomllib

    raw = tomllib.loads(Path(path).read_text())
    unknown = set(raw) - {"name", "noise", "poison_at_step", "overflow_from_step", "loss_scaling"}
    if unknown:
        raise ValueError(f"unknown recipe key {sorted(unknown)[0]!r}")
    return StandinRecipe(**raw)


def apply_recipe(model: StandinModel, recipe: StandinRecipe, seed: int = 0) -> StandinPlan:
    if recipe.noise:
        with torch.no_grad():  # an arm-specific perturbation so arms differ, deterministic
            for parameter in model.parameters():
                parameter.add_(recipe.noise)
    model.poison_at_step = recipe.poison_at_step
    model.overflow_from_step = recipe.overflow_from_step
    return StandinPlan(recipe.name)


def quantizable_modules(model: nn.Module, recipe: Any = None) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def single_layer_recipe(recipe: StandinRecipe, name: str, invert: bool = False) -> StandinRecipe:
    return StandinRecipe(
        name=f"{recipe.name}:{'allbut' if invert else 'only'}:{name}", noise=recipe.noise / (2 if invert else 4)
    )


def install(monkeypatch: Any, source: StandinSource) -> None:
    """Route the runner's lazy imports of mxlab.data, mxlab.models and mxlab.recipe to these stand-ins.
    The real mxlab.recipe.library stays importable (the spec resolves recipe files through it)."""
    import sys

    import mxlab.recipe.library  # noqa: F401  (cached in sys.modules before its package is replaced)
    import mxlab.recipe.shipped  # noqa: F401  (the shipped recipes, where a spec's arms are looked up last)
    import mxlab.report  # noqa: F401  (the analysis and report, bound to the real mxlab.data before it is replaced)
    from mxlab.data import SOURCE_REGISTRY

    for name in SOURCE_REGISTRY:  # the registered sources' modules, cached before their package is replaced
        SOURCE_REGISTRY.resolve(name)

    data = types.ModuleType("mxlab.data")
    data.make_source = lambda data_config, max_history: source
    from mxlab.models import DEFAULT_BUILDER, builder_name, check_outputs, loss_components

    models = types.ModuleType("mxlab.models")
    models.build_model, models.esmm_loss = build_model, esmm_loss
    # the plug-in seam of the real package, over the stand-ins (build_model looked up when called, so a test
    # may replace it)
    models.build = lambda table, info, tasks: sys.modules["mxlab.models"].build_model(table, info)
    models.loss_for = lambda tasks: sys.modules["mxlab.models"].esmm_loss
    models.check_outputs, models.loss_components = check_outputs, loss_components
    models.DEFAULT_BUILDER, models.builder_name = DEFAULT_BUILDER, builder_name
    recipe = types.ModuleType("mxlab.recipe")
    recipe.load_recipe, recipe.apply_recipe = load_recipe, apply_recipe
    recipe.quantizable_modules, recipe.single_layer_recipe = quantizable_modules, single_layer_recipe
    recipe.unavailable_reason = lambda recipe, device=None: None  # stand-in recipes need no backend
    for name, module in (("mxlab.data", data), ("mxlab.models", models), ("mxlab.recipe", recipe)):
        monkeypatch.setitem(sys.modules, name, module)
