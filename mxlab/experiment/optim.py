"""The optimizer of a run (dense parameters and embedding tables apart, clipping) and its rate per step."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mxlab.experiment.rowwise_adagrad import RowWiseAdagrad
from mxlab.experiment.spec import TrainConfig
from mxlab.experiment.training_recipe import warmup_steps


def _dense_optimizer(train: TrainConfig, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    parameters = [parameter for group in groups for parameter in group["params"]]
    fused = {"fused": True} if parameters and all(parameter.is_cuda for parameter in parameters) else {}
    if train.optimizer == "adam":
        return torch.optim.Adam(groups, lr=train.lr, **fused)
    if train.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=train.lr, **fused)
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=train.lr, **fused)
    if train.optimizer == "adagrad":
        return torch.optim.Adagrad(groups, lr=train.lr)
    raise ValueError(f"unknown optimizer {train.optimizer!r}")


class SplitOptimizer:
    """The dense optimizer and the embedding tables' RowWiseAdagrad behind one optimizer's interface
    (param_groups, zero_grad, step, state_dict), with global-norm gradient clipping in `step`.

    `step` computes the global L2 norm of every gradient (after a loss scaler unscaled them), keeps it
    on the device as `grad_norm` (no host read), scales the gradients down to `clip` when above it,
    then steps both optimizers. A loss scaler that skips on the device (`_step_supports_amp_scaling`,
    the dense optimizer's fused kernels) hands `found_inf` to both. Every param group carries
    `base_lr`, the rate the schedule (`lr_factor`) multiplies.
    """

    def __init__(self, dense: torch.optim.Optimizer, embeddings: RowWiseAdagrad | None, clip: float) -> None:
        self.dense, self.embeddings, self.clip = dense, embeddings, clip
        self._step_supports_amp_scaling = bool(getattr(dense, "_step_supports_amp_scaling", False))
        self.grad_norm: torch.Tensor | None = None
        for group in self.param_groups:
            group.setdefault("base_lr", group["lr"])

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.dense.param_groups + (self.embeddings.param_groups if self.embeddings is not None else [])

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grad_norm = None
        self.dense.zero_grad(set_to_none=set_to_none)
        if self.embeddings is not None:
            self.embeddings.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        found_inf = getattr(self, "found_inf", None)  # set by a loss scaler that skips on the device
        parameters = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not parameters:
            return
        self.grad_norm = nn.utils.get_total_norm([p.grad for p in parameters], foreach=True)
        if self.clip != float("inf"):
            nn.utils.clip_grads_with_norm_(parameters, self.clip, self.grad_norm, foreach=True)
        if found_inf is not None and self._step_supports_amp_scaling:
            self.dense.grad_scale, self.dense.found_inf = None, found_inf
            try:
                self.dense.step()
            finally:
                del self.dense.grad_scale, self.dense.found_inf
        else:
            self.dense.step()
        if self.embeddings is not None:
            self.embeddings.step(found_inf=found_inf)

    def state_dict(self) -> dict[str, Any]:
        return {
            "dense": self.dense.state_dict(),
            "embeddings": self.embeddings.state_dict() if self.embeddings is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`; refuses a state of another layout (e.g. one optimizer over every parameter,
        as checkpoints written before the split hold)."""
        if not isinstance(state, dict) or set(state) != {"dense", "embeddings"}:
            raise ValueError(
                "the optimizer state is not a split optimizer's ({dense, embeddings}); it was written by a "
                "version before the training recipe's optimizer split: restart that run (remove its checkpoint.pt)"
            )
        if (state["embeddings"] is None) != (self.embeddings is None):
            raise ValueError("the optimizer state's embedding optimizer does not match train.embedding_optimizer")
        self.dense.load_state_dict(state["dense"])
        if self.embeddings is not None:
            self.embeddings.load_state_dict(state["embeddings"])


def make_optimizer(train: TrainConfig, model: nn.Module) -> SplitOptimizer:
    """The run's SplitOptimizer: train.optimizer (adam, adamw, sgd, adagrad; fused on CUDA for the first
    three) at train.lr over the dense parameters, weight_decay on those of 2+ dims only (GEMM weights,
    not biases or norms); the nn.Embedding and nn.EmbeddingBag tables under RowWiseAdagrad at train.embedding_lr
    (embedding_optimizer "rowwise-adagrad") or in the dense optimizer without decay ("dense");
    gradients clipped at train.clip_grad_norm."""
    tables = {id(module.weight) for module in model.modules() if isinstance(module, (nn.Embedding, nn.EmbeddingBag))}
    decay, no_decay, embeddings = [], [], []
    for parameter in model.parameters():
        if id(parameter) in tables:
            (embeddings if train.embedding_optimizer == "rowwise-adagrad" else no_decay).append(parameter)
        else:
            (decay if parameter.dim() >= 2 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    dense = _dense_optimizer(train, [group for group in groups if group["params"]] or groups[:1])
    sparse = RowWiseAdagrad(embeddings, lr=train.embedding_lr) if embeddings else None
    return SplitOptimizer(dense, sparse, train.clip_grad_norm)


def lr_factor(train: TrainConfig, step: int, last_step: int) -> float:
    """The schedule's factor of step `step` (1-based) of a run whose last step is `last_step`: a linear
    warm-up over the first `warmup_steps` steps (step / W), then 1, and over the last
    train.lr_decay_steps steps a linear decay to 1 / lr_decay_steps at the last step (a step past an
    estimated last step keeps that factor). Refuses a step below 1."""
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    warm = warmup_steps(train, last_step)
    factor = min(1.0, step / warm) if warm else 1.0
    if train.lr_decay_steps:
        factor *= min(1.0, max(1, last_step - step + 1) / train.lr_decay_steps)
    return factor


def learning_rate(train: TrainConfig, step: int, last_step: int) -> float:
    """The dense parameters' rate at step `step`: train.lr x `lr_factor`. Refuses a step below 1."""
    return train.lr * lr_factor(train, step, last_step)
