"""The side features of user histories. Each history token of a GEM model may add, per named sparse field, the
embedding of its item's value of that field (`[model] history_item_fields`; the source states the values in
`DataInfo.item_fields`), from the same rows of the fields table as the candidate's token of that field. And the
history's length may be one more non-sequence token (`[model] history_length_token`): the embedding of its
bucket, about four buckets per doubling of the length, as production models take a bucketized count feature.
Attention that averages over the history (softmax, SiLU over n_keys) does not see the length otherwise."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from mxlab.data.batch import DataInfo

LENGTH_BUCKETS_PER_DOUBLING = 4


def history_field_ids(
    names: Sequence[str], info: DataInfo, other_fields: list[int], offsets: list[int]
) -> torch.Tensor:
    """(len(names), n_items) rows of the fields table: per named field (`[model] history_item_fields`), each
    item's value of it, offset as that field's token. Refuses (ValueError) a name that is not an item field of
    the source (naming those that are) and the candidate field (its ids are the items themselves)."""
    known = dict(info.item_fields)
    rows = []
    for name in names:
        if name not in known:
            raise ValueError(
                f"model.history_item_fields: {name!r} is not an item field of source {info.name!r}; "
                f"accepted: {', '.join(known) or 'none (the source states no item side features)'}"
            )
        field = list(info.field_names).index(name)
        if field not in other_fields:
            raise ValueError(f"model.history_item_fields: {name!r} is the candidate field, whose ids are the items")
        if len(known[name]) != info.n_items:
            raise ValueError(
                f"model.history_item_fields: source {info.name!r} gives {len(known[name])} values of {name!r}, "
                f"not one per item ({info.n_items})"
            )
        rows.append(torch.tensor(known[name], dtype=torch.int64) + offsets[other_fields.index(field)])
    return torch.stack(rows) if rows else torch.zeros(0, max(1, info.n_items), dtype=torch.int64)


def history_length_boundaries(max_history: int) -> torch.Tensor:
    """The first history length of each bucket (int64, ascending, starting at 0): bucket k holds the lengths
    L with floor(4 log2(L + 1)) = k, merged where two k share a first length, up to `max_history`."""
    top = math.floor(LENGTH_BUCKETS_PER_DOUBLING * math.log2(max_history + 1))
    firsts = sorted({math.ceil(2 ** (k / LENGTH_BUCKETS_PER_DOUBLING)) - 1 for k in range(top + 1)})
    return torch.tensor([first for first in firsts if first <= max_history], dtype=torch.int64)


class HistoryLengthToken(nn.Module):
    """The history-length token: `forward(offsets)` is the (B, dim) embedding of each example's history-length
    bucket (`history_length_boundaries`; lengths beyond max_history share the last bucket), B = len(offsets) - 1."""

    def __init__(self, max_history: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("boundaries", history_length_boundaries(max_history), persistent=False)
        self.embedding = nn.Embedding(len(self.boundaries), dim)
        nn.init.normal_(self.embedding.weight, std=0.05)

    def forward(self, offsets: torch.Tensor) -> torch.Tensor:
        lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
        return self.embedding(torch.bucketize(lengths, self.boundaries, right=True) - 1)
