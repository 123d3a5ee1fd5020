"""Model builders by name or import path, the heads a model returns, and the loss of the declared tasks."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from mxlab.data.batch import DataInfo, JaggedBatch
from mxlab.models.gem import validate_model_config
from mxlab.models.heads import check_outputs, head_logits
from mxlab.models.losses import esmm_loss, independent_loss
from mxlab.registry import Registry
from mxlab.tasks import TaskSet

DEFAULT_BUILDER = "gem"
MODEL_BUILDERS = Registry(
    "model builder", {DEFAULT_BUILDER: "mxlab.models:build_gem", "dcn": "mxlab.models.dcn:build_dcn"}
)


def builder_name(model_table: Mapping[str, Any]) -> str:
    """The builder a [model] table names (its `builder` key; the GEM-like model by default)."""
    return model_table.get("builder", DEFAULT_BUILDER)


def validate_model_table(model_table: Mapping[str, Any]) -> Any:
    """Return the checked [model] table: the GEM-like model's ModelConfig; for another builder, its table with the
    defaults its `validate` attribute fills in (a builder without one: the table as given). Refuses (ValueError)
    what those validators refuse and a builder that is not registered, does not import or is not callable,
    naming the value and the accepted builders."""
    if not isinstance(model_table, Mapping):
        raise ValueError(f"[model] must be a table, got {model_table!r}")
    name = builder_name(model_table)
    if name == DEFAULT_BUILDER:
        return validate_model_config({k: v for k, v in model_table.items() if k != "builder"})
    validate = getattr(MODEL_BUILDERS.resolve(name), "validate", None)
    if validate is None:
        return dict(model_table)
    config = validate({k: v for k, v in model_table.items() if k != "builder"})
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return {"builder": name, **{k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}}


def build(model_table: Mapping[str, Any], info: DataInfo, tasks: TaskSet) -> torch.nn.Module:
    """Return the model of a [model] table for `info` with one logit per head of `tasks`. Refuses what
    validate_model_table refuses and a builder that returns anything but a torch.nn.Module, naming the
    builder, what it returned and what was expected."""
    name = builder_name(model_table)
    keywords = {k: v for k, v in model_table.items() if k != "builder"}
    model = MODEL_BUILDERS.resolve(name)(info, tasks.heads, **keywords)
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model builder {name!r} returned {type(model).__name__}; expected a torch.nn.Module")
    return model


def loss_for(tasks: TaskSet) -> Callable[[Any, JaggedBatch], dict[str, torch.Tensor]]:
    """The training loss of `tasks` (mxlab.models.protocols.Loss): ESMM's, or the sum of the heads' cross-entropies."""
    if tasks.relation == "esmm":
        return esmm_loss
    return functools.partial(independent_loss, heads=tasks.heads)


def loss_components(tasks: TaskSet) -> tuple[str, ...]:
    """The names of the loss's components after "loss", in the order `loss_for(tasks)` returns them."""
    return ("ctr", "ctcvr") if tasks.relation == "esmm" else tasks.heads


__all__ = [
    "MODEL_BUILDERS",
    "build",
    "builder_name",
    "check_outputs",
    "head_logits",
    "loss_components",
    "loss_for",
    "validate_model_table",
]
