"""The logits a model returns, by head, and the label of each head in a batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mxlab.data.batch import JaggedBatch
from mxlab.tasks import TaskSet


def head_logits(output: Any, heads: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Return {head: (B,) logit} of a model's output: a mapping by head, an object with a HEAD_logit attribute
    per head (the GEM-like model's ModelOutput), or for one head a (B,) tensor. Refuses (ValueError) an output
    whose heads differ from `heads`, naming both."""
    if isinstance(output, Mapping):
        if sorted(output) != sorted(heads):
            raise ValueError(f"the model returns the heads {sorted(output)}; the [tasks] declare {list(heads)}")
        return {head: output[head] for head in heads}
    if isinstance(output, torch.Tensor):
        if len(heads) == 1 and output.dim() == 1:
            return {heads[0]: output}
        raise ValueError(
            f"the model returns one tensor of shape {tuple(output.shape)}; the [tasks] declare {list(heads)}: "
            "expected a mapping {head: (B,) logit}"
        )
    missing = [head for head in heads if not hasattr(output, f"{head}_logit")]
    if missing:
        raise ValueError(
            f"the model returns {type(output).__name__} without logits for the heads {missing}; the [tasks] "
            f"declare {list(heads)}: expected a mapping {{head: (B,) logit}} or attributes HEAD_logit"
        )
    return {head: getattr(output, f"{head}_logit") for head in heads}


def check_outputs(model: torch.nn.Module, batch: JaggedBatch, tasks: TaskSet) -> None:
    """Run `model` on `batch` without gradients and refuse (ValueError) outputs that are not one (B,) logit per
    declared head, and a batch without the label of an independent head, naming the heads, shapes and what was
    expected."""
    if tasks.relation != "esmm":
        for head in tasks.heads:
            head_label(batch, head)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = head_logits(model(batch), tasks.heads)
    finally:
        model.train(was_training)
    rows = int(batch.click.shape[0])
    wrong = {head: tuple(logit.shape) for head, logit in logits.items() if tuple(logit.shape) != (rows,)}
    if wrong:
        raise ValueError(
            f"the model's logits have the shapes {wrong}; expected ({rows},) per head for a batch of {rows}"
        )


def head_label(batch: JaggedBatch, head: str) -> torch.Tensor:
    """The 0/1 label of an independent head: `batch.labels[head]`, or the click for a head named ctr that the
    batch does not label otherwise. Refuses (ValueError) a head the batch has no label for, naming it and the
    labels it has."""
    labels = batch.labels or {}
    if head in labels:
        return labels[head]
    if head == "ctr":
        return batch.click
    raise ValueError(f"the batch has no label for the head {head!r}; it labels: {['ctr', *labels]}")
