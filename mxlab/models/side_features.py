"""The side features of history items: each history token of a GEM model may add, per named sparse field, the
embedding of its item's value of that field (`[model] history_item_fields`; the source states the values in
`DataInfo.item_fields`), from the same rows of the fields table as the candidate's token of that field."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mxlab.data.batch import DataInfo


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
