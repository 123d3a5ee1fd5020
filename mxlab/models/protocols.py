"""The contracts of a model builder, a model and a loss (docs/INTERFACES.md, "Plug-ins")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from mxlab.data.batch import DataInfo, JaggedBatch


@runtime_checkable
class ModelBuilder(Protocol):
    """``builder(info, heads, **keywords)``: a torch.nn.Module for the source described by `info` with one
    output logit per head in `heads` (mxlab.tasks.TaskSet.heads; both passed by position); `keywords` are the
    [model] table's other keys."""

    def __call__(self, info: DataInfo, heads: tuple[str, ...], /, **keywords: Any) -> torch.nn.Module: ...


@runtime_checkable
class Model(Protocol):
    """``model(batch)``: one (B,) logit per declared head, as a mapping {head: logit} (the GEM-like model returns
    its ModelOutput(ctr_logit, cvr_logit), read by mxlab.models.plugins.head_logits)."""

    def __call__(self, batch: JaggedBatch) -> Mapping[str, torch.Tensor] | Any: ...


@runtime_checkable
class Loss(Protocol):
    """``loss(output, batch)``: float32 scalars {"loss": what is backpropagated, then one entry per component}."""

    def __call__(self, output: Any, batch: JaggedBatch) -> dict[str, torch.Tensor]: ...
