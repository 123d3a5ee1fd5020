"""The training recipe every arm shares ([train] keys; docs/running.md, "The training recipe").

The optimizer split, the rate's warm-up, gradient clipping, the output biases' start and the loss-spike
line are the same for every arm of a study: a recipe (mxlab.recipe) changes the numerics of the GEMMs
around them, never them. The [train] keys that set them are checked here; spec.TrainConfig
declares them among its fields, so they are written in the [train] table like any other key.

Defaults (a spec changes each): dense parameters under AdamW (weight decay on the GEMM weights only),
embedding tables under row-wise Adagrad at `embedding_lr`, a linear warm-up over the first
`warmup_share` of the steps, the gradients' global norm clipped at `clip_grad_norm`, the two output
biases at the logits of the source's base rates. The recipe before these defaults:
`optimizer = "adam"`, `weight_decay = 0`, `embedding_optimizer = "dense"`, `warmup_share = 0`,
`clip_grad_norm = inf`, `output_bias = "model"`.

The keys: `embedding_optimizer`: "rowwise-adagrad" (each embedding table a RowWiseAdagrad at
`embedding_lr`; rows absent from a batch do not move) or "dense" (the tables in the dense optimizer,
as before). `warmup_share`: the share of the first steps over which the rate rises linearly to its
value, in [0, 1); in the fork design a share of the warm-up run's steps. `clip_grad_norm`: the largest
global L2 norm of all gradients (> 0; inf = no clipping, the norm is still recorded). `output_bias`:
"base-rates" (the CTR and CVR logits start at the data source's base rates, DataInfo.base_rates) or
"model" (the [model] table's initial_ctr / initial_cvr). `spike_factor`: a step whose loss exceeds the
previous log interval's mean loss by this factor is a loss spike (health records).
"""

from __future__ import annotations

import math
from typing import Any

import torch

EMBEDDING_OPTIMIZERS = ("rowwise-adagrad", "dense")
OUTPUT_BIASES = ("base-rates", "model")


def check_training_recipe(config: Any, where: str) -> None:
    """Refuse (ValueError naming the value and what is accepted) a warm-up share outside [0, 1), a
    clipping norm <= 0 or NaN, an unknown embedding optimizer or output-bias rule, an embedding rate <= 0
    and a spike factor <= 1."""
    if not 0.0 <= config.warmup_share < 1.0:
        raise ValueError(
            f"{where}.warmup_share must be in [0, 1) (the share of the steps the rate warms up over; 0 = none), "
            f"got {config.warmup_share}"
        )
    if math.isnan(config.clip_grad_norm) or config.clip_grad_norm <= 0:
        raise ValueError(
            f"{where}.clip_grad_norm must be > 0 (the largest global gradient norm; inf = no clipping), "
            f"got {config.clip_grad_norm}"
        )
    if config.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
        raise ValueError(
            f"{where}.embedding_optimizer {config.embedding_optimizer!r} is not one of: "
            f"{', '.join(EMBEDDING_OPTIMIZERS)}"
        )
    if config.output_bias not in OUTPUT_BIASES:
        raise ValueError(f"{where}.output_bias {config.output_bias!r} is not one of: {', '.join(OUTPUT_BIASES)}")
    if not config.embedding_lr > 0:
        raise ValueError(f"{where}.embedding_lr must be > 0, got {config.embedding_lr}")
    if not config.spike_factor > 1:
        raise ValueError(
            f"{where}.spike_factor must be > 1 (a loss this many times the last mean), got {config.spike_factor}"
        )


def warmup_steps(train: Any, last_step: int) -> int:
    """The steps of the rate's linear warm-up: warmup_share of the run's steps from scratch, of the fork
    warm-up's steps (train.fork_steps) in the fork design, at least 1 when the share is > 0."""
    share = train.warmup_share
    if not share:
        return 0
    steps = train.fork_steps if train.fork_from else last_step
    return max(1, round(share * steps))


def set_output_biases(model: torch.nn.Module, info: Any, rule: str) -> tuple[float, float] | None:
    """Set the biases of `model.towers["ctr"/"cvr"].out` to the logits of `info.base_rates` (CTR, CVR given
    a click) under rule "base-rates"; return the rates set, None where nothing was set (rule "model", a
    source without base rates, a model without such towers)."""
    rates = getattr(info, "base_rates", None)
    towers = getattr(model, "towers", None)
    if rule != "base-rates" or rates is None or towers is None:
        return None
    with torch.no_grad():
        for name, rate in zip(("ctr", "cvr"), rates):
            if name not in towers:  # a model with other heads (mxlab.tasks)
                continue
            rate = min(max(float(rate), 1e-6), 1 - 1e-6)
            towers[name].out.bias.fill_(math.log(rate / (1.0 - rate)))
    return tuple(float(rate) for rate in rates)
