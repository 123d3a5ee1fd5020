"""A DLRM / DCNv2-style model, built through the plug-in path (`[model] builder = "dcn"`).

Embedding tables for the sparse fields, a mean embedding bag over the user history's items, a bottom MLP
over the dense features; their concatenation x0 goes through a low-rank cross network (DCNv2:
x_{l+1} = x0 * (U_l V_l x_l + b_l) + x_l, with V_l: D -> rank and U_l: rank -> D), then an MLP over-arch,
then one linear output per declared head (`towers[HEAD].out`). Every GEMM is an `nn.Linear`, so a recipe
reaches the bottom MLP, the cross layers' two factors, the over-arch and the outputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from mxlab.data.batch import DataInfo, JaggedBatch
from mxlab.models.gem import LowRankCross
from mxlab.tables import table_to_dataclass

DCN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dim=16, cross_layers=2, cross_rank=16, over_arch=(64, 32), max_history=16),
    "h200": dict(dim=128, cross_layers=3, cross_rank=256, over_arch=(1024, 512, 256), max_history=1024),
}


@dataclass(frozen=True)
class DCNConfig:
    """The [model] table of the DCNv2-style model: `size` picks a preset, any other key overrides it.
    `dim`: the embedding width of every feature; `cross_layers`, `cross_rank`: the cross network;
    `over_arch`: the MLP widths after it; `max_history`: the longest history the embedding bag reads."""

    size: str = "tiny"
    dim: int = 16
    cross_layers: int = 2
    cross_rank: int = 16
    over_arch: tuple[int, ...] = (64, 32)
    max_history: int = 16

    def __post_init__(self) -> None:
        if self.size not in DCN_PRESETS:
            raise ValueError(f"unknown dcn size {self.size!r}; accepted: {', '.join(DCN_PRESETS)}")
        sizes = {"dim": self.dim, "cross_rank": self.cross_rank, "max_history": self.max_history}
        bad = {name: value for name, value in sizes.items() if value < 1}
        if bad or self.cross_layers < 0 or not self.over_arch or min(self.over_arch) < 1:
            raise ValueError(
                f"[model] of builder 'dcn': dim, cross_rank, max_history must be >= 1, cross_layers >= 0 and "
                f"over_arch a non-empty list of positive widths; got {asdict(self)}"
            )


def validate_dcn_config(keywords: dict[str, Any]) -> DCNConfig:
    """The resolved DCNConfig of the [model] keywords (the preset of `size`, then its keys). Refuses an unknown
    key, size or a value out of range, naming it and the accepted ones."""
    size = keywords.get("size", DCNConfig.size)
    if size not in DCN_PRESETS:
        raise ValueError(f"unknown dcn size {size!r}; accepted: {', '.join(DCN_PRESETS)}")
    return table_to_dataclass(DCNConfig, {**DCN_PRESETS[size], **keywords}, "model", where="[model] of builder 'dcn'")


class Tower(nn.Module):
    """One head's output: a linear map of the over-arch's last activations to one logit."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x).squeeze(-1)


class DCNModel(nn.Module):
    """The DCNv2-style model (module docstring); `model(batch)` returns {head: (B,) float32 logit}."""

    def __init__(self, info: DataInfo, heads: tuple[str, ...], config: DCNConfig) -> None:
        super().__init__()
        dim = config.dim
        self.bottom = nn.Sequential(nn.Linear(info.n_dense, dim), nn.ReLU())
        self.fields = nn.ModuleList(nn.Embedding(cardinality, dim) for cardinality in info.field_cardinalities)
        self.history = nn.EmbeddingBag(max(info.n_items, 1), dim, mode="mean") if info.has_history else None
        width = dim * (1 + len(info.field_cardinalities) + (1 if info.has_history else 0))
        self.cross = nn.ModuleList(LowRankCross(width, config.cross_rank) for _ in range(config.cross_layers))
        layers: list[nn.Module] = []
        for hidden in config.over_arch:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.over_arch = nn.Sequential(*layers)
        self.towers = nn.ModuleDict({head: Tower(width) for head in heads})

    def forward(self, batch: JaggedBatch) -> dict[str, torch.Tensor]:
        parts = [self.bottom(batch.dense)]
        parts += [table(batch.sparse[:, index]) for index, table in enumerate(self.fields)]
        if self.history is not None:
            items = batch.history_items.clamp(0, self.history.num_embeddings - 1)
            parts.append(self.history(items, batch.history_offsets[:-1]))
        x0 = torch.cat([part.to(parts[0].dtype) for part in parts], dim=-1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        hidden = self.over_arch(x)
        return {head: tower(hidden).float() for head, tower in self.towers.items()}


def build_dcn(info: DataInfo, outputs: tuple[str, ...], /, **keywords: Any) -> DCNModel:
    """The DCNv2-style model for `info` with one logit per head of `outputs`; refuses what validate_dcn_config
    refuses."""
    return DCNModel(info, tuple(outputs), validate_dcn_config(keywords))


build_dcn.validate = validate_dcn_config  # type: ignore[attr-defined]  (how validate_model_table checks a table)
