"""A study of a torchrec model through the plug-in path: torchrec's DLRM_DCN as a model builder.

In a spec: `[model] builder = "experiments.examples.torchrec_dcn:build_dlrm_dcn"` (run from the repository root, so
the module imports), with any of the keyword arguments below in `[model]`. Each sparse field of the source and the
user history become one feature of an EmbeddingBagCollection; the over-arch ends in one output per declared head.
Needs torchrec (docs/applying.md says how to install it on the CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from mxlab.data import DataInfo, JaggedBatch


class TorchrecDCN(nn.Module):
    """torchrec's DLRM_DCN over a JaggedBatch; returns {head: (B,) logit}."""

    def __init__(self, info: DataInfo, heads: tuple[str, ...], dim: int, dense_arch: list[int], over_arch: list[int],
                 cross_layers: int, cross_rank: int) -> None:  # fmt: skip
        super().__init__()
        import torchrec
        from torchrec.models.dlrm import DLRM_DCN

        sizes = {f"f{i}": n for i, n in enumerate(info.field_cardinalities)} | {"history": max(info.n_items, 1)}
        tables = [
            torchrec.EmbeddingBagConfig(name=f"t_{key}", embedding_dim=dim, num_embeddings=n, feature_names=[key])
            for key, n in sizes.items()
        ]
        self.keys = list(sizes)
        self.heads = heads
        self.dlrm = DLRM_DCN(
            embedding_bag_collection=torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
            dense_in_features=info.n_dense,
            dense_arch_layer_sizes=[*dense_arch, dim],
            over_arch_layer_sizes=[*over_arch, len(heads)],
            dcn_num_layers=cross_layers,
            dcn_low_rank_dim=cross_rank,
        )

    def forward(self, batch: JaggedBatch) -> dict[str, torch.Tensor]:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        rows = batch.sparse.shape[0]
        fields = batch.sparse.shape[1]
        lengths = torch.cat([torch.ones(rows * fields, dtype=torch.int64, device=batch.sparse.device),
                             batch.history_lengths()])  # fmt: skip
        values = torch.cat([batch.sparse.t().reshape(-1), batch.history_items])
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=values, lengths=lengths)
        logits = self.dlrm(batch.dense, sparse).float()
        return {head: logits[:, index] for index, head in enumerate(self.heads)}


def build_dlrm_dcn(
    info: DataInfo,
    heads: tuple[str, ...],
    /,
    dim: int = 16,
    dense_arch: tuple[int, ...] = (32,),
    over_arch: tuple[int, ...] = (32,),
    cross_layers: int = 2,
    cross_rank: int = 16,
    max_history: int = 16,
) -> nn.Module:
    """torchrec's DLRM_DCN for `info` with one output per head (max_history: the history the source keeps)."""
    return TorchrecDCN(info, tuple(heads), dim, list(dense_arch), list(over_arch), cross_layers, cross_rank)
