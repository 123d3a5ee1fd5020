"""The optimizer of a run and its learning rate per step."""

from __future__ import annotations

from typing import Any

import torch

from mxlab.experiment.spec import TrainConfig


def make_optimizer(train: TrainConfig, parameters: Any) -> torch.optim.Optimizer:
    """The optimizer named by train.optimizer (adam, adamw, sgd, adagrad) at train.lr / weight_decay.

    On CUDA parameters adam, adamw and sgd use torch's fused kernels, which skip a step with a
    non-finite gradient on the device (no host read of the loss scaler's overflow flag).
    """
    parameters = list(parameters)
    options = {"lr": train.lr, "weight_decay": train.weight_decay}
    fused = {"fused": True} if parameters and all(parameter.is_cuda for parameter in parameters) else {}
    if train.optimizer == "adam":
        return torch.optim.Adam(parameters, **options, **fused)
    if train.optimizer == "adamw":
        return torch.optim.AdamW(parameters, **options, **fused)
    if train.optimizer == "sgd":
        return torch.optim.SGD(parameters, **options, **fused)
    if train.optimizer == "adagrad":
        return torch.optim.Adagrad(parameters, **options)
    raise ValueError(f"unknown optimizer {train.optimizer!r}")


def learning_rate(train: TrainConfig, step: int, last_step: int) -> float:
    """The rate of the run's step `step` (1-based) when its last step is `last_step`: train.lr, and over the
    last train.lr_decay_steps steps a linear decay to lr / lr_decay_steps at the last step (a step past an
    estimated last step keeps that rate). Refuses a step below 1."""
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    if not train.lr_decay_steps:
        return train.lr
    return train.lr * min(1.0, max(1, last_step - step + 1) / train.lr_decay_steps)
