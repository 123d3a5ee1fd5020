"""Model FLOPs of the GEM-like model for one batch: what MFU is measured against.

Counting rules (model work, not hardware work):

- every ``nn.Linear`` applied to M rows is a GEMM of ``2 * M * in_features * out_features``
  FLOPs forward, over the rows the model really feeds it (history tokens, B x queries, B rows);
- attention counts only the useful pairs (query, key) inside each example: ``QK^T`` and ``PV``
  are ``2 * head_dim`` FLOPs per pair and head each, so ``4 * dim`` per pair over all heads.
  Self-attention over a history of L tokens has L^2 pairs (L (L + 1) / 2 when causal), PMA
  ``pma_seeds * L``, the token cross-attention ``n_tokens * L``; an empty history has none, and
  no padding is ever counted;
- the training step is 3x the forward (backward = two GEMMs per forward GEMM: input and
  weight gradients). Recomputation inside an attention kernel's backward is hardware work, not
  model work, and is not counted;
- norms, activations, rotary positions, softmax, embedding lookups, bias adds and the loss are
  not counted (they are memory-bound work, a few percent of the FLOPs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mxlab.data.batch import DataInfo
from mxlab.models.gem import ModelConfig, non_sequence_tokens, validate_model_config

BACKWARD_FACTOR = 3  # forward + backward = 3 x forward


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs of one batch by part (``parts``: name -> FLOPs; ``.attention`` parts are the
    attention products, the others GEMMs of nn.Linear modules)."""

    parts: dict[str, float] = field(default_factory=dict)

    @property
    def gemm(self) -> float:
        """Forward FLOPs of the nn.Linear GEMMs."""
        return sum(value for name, value in self.parts.items() if not name.endswith(".attention"))

    @property
    def attention(self) -> float:
        """Forward FLOPs of the attention products (useful pairs only)."""
        return sum(value for name, value in self.parts.items() if name.endswith(".attention"))

    @property
    def forward(self) -> float:
        return self.gemm + self.attention

    @property
    def train_step(self) -> float:
        """FLOPs of one training step: forward + backward = BACKWARD_FACTOR x forward."""
        return BACKWARD_FACTOR * self.forward


def model_flops(
    model_config: ModelConfig | dict[str, Any], info: DataInfo, history_lengths: Sequence[int] | torch.Tensor
) -> FlopCount:
    """The forward FLOPs (`FlopCount`) of the GEM-like model of `model_config` on `info`'s features
    for a batch whose examples have `history_lengths` (one per example; the batch size is its length).

    Refuses (ValueError) what `validate_model_config` refuses and negative lengths.
    """
    config = model_config if isinstance(model_config, ModelConfig) else validate_model_config(dict(model_config))
    lengths = torch.as_tensor(history_lengths, dtype=torch.float64).reshape(-1)
    if bool((lengths < 0).any()):
        raise ValueError("history_lengths must be >= 0")
    batch, tokens, pairs_sum = float(lengths.numel()), float(lengths.sum()), float((lengths * lengths).sum())
    dim, seeds, width, rank = config.dim, config.pma_seeds, config.interaction_dim, config.cross_rank
    queries = non_sequence_tokens(info, config)
    self_pairs = (pairs_sum + tokens) / 2 if config.causal else pairs_sum

    def linear(rows: float, fan_in: int, fan_out: int) -> float:
        return 2.0 * rows * fan_in * fan_out

    def cross_attention(rows: float) -> float:  # q, kv, out projections
        return linear(rows, dim, dim) + linear(tokens, dim, 2 * dim) + linear(rows, dim, dim)

    hidden = config.mlp_ratio * dim
    parts = {
        "dense_proj": linear(batch, info.n_dense, dim) if info.n_dense else 0.0,
        "history": config.layers
        * (
            linear(tokens, dim, 3 * dim)
            + linear(tokens, dim, dim)
            + linear(tokens, dim, hidden)
            + linear(tokens, hidden, dim)
        ),
        "history.attention": config.layers * 4.0 * dim * self_pairs,
        "pma": cross_attention(batch * seeds),
        "pma.attention": 4.0 * dim * seeds * tokens,
        "cross": cross_attention(batch * queries),
        "cross.attention": 4.0 * dim * queries * tokens,
        "interaction": linear(batch, (2 * queries + seeds) * dim, width)
        + config.cross_layers * (linear(batch, width, rank) + linear(batch, rank, width)),
    }
    tower = 0.0
    fan_in = width
    for fan_out in config.tower_dims:
        tower += linear(batch, fan_in, fan_out)
        fan_in = fan_out
    parts["towers"] = 2 * (tower + linear(batch, fan_in, 1))
    return FlopCount(parts)


__all__ = ["BACKWARD_FACTOR", "FlopCount", "model_flops"]
