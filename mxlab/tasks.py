"""The declared tasks of a study ([tasks]): the model's heads and how the evaluated tasks follow from them.

- ``relation = "esmm"`` (the default): heads ``ctr`` and ``cvr``; tasks ``ctr``, ``cvr`` (on clicked
  impressions) and ``ctcvr`` (p_ctr x p_cvr), trained with ESMM's loss (mxlab.models.losses.esmm_loss);
- ``relation = "independent"``: any number of binary heads, each its own task with its own label
  (``ctr`` is labelled by the click; any other head H by ``batch.labels[H]``), trained with the sum of
  their cross-entropies. ``heads = ["ctr"]`` is a single CTR task.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ESMM_HEADS: tuple[str, ...] = ("ctr", "cvr")
ESMM_TASKS: tuple[str, ...] = ("ctr", "cvr", "ctcvr")
RELATIONS: tuple[str, ...] = ("esmm", "independent")
RESERVED: tuple[str, ...] = ("cvr", "ctcvr")  # ESMM's derived tasks: no independent head takes these names
TASK_KEYS: tuple[str, ...] = ("heads", "relation")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class TaskSet:
    """The validated [tasks] table: the model's heads (one logit each) and their relation."""

    heads: tuple[str, ...] = ESMM_HEADS
    relation: str = "esmm"

    @property
    def tasks(self) -> tuple[str, ...]:
        """The evaluated tasks: ctr, cvr, ctcvr under ESMM, else the heads."""
        return ESMM_TASKS if self.relation == "esmm" else self.heads

    @property
    def is_default(self) -> bool:
        """True for today's ESMM pair (the default a spec without [tasks] gets)."""
        return self == TaskSet()

    def to_dict(self) -> dict[str, Any]:
        return {"heads": list(self.heads), "relation": self.relation}


def task_set(table: Any) -> TaskSet:
    """Return the TaskSet of a [tasks] table (None or {} = ESMM's ctr + cvr). Refuses an unknown key or
    relation, an empty or repeated head list, a head name that is not lower_snake_case, ESMM with heads
    other than ctr, cvr, and an independent head named cvr or ctcvr, naming the value and what is accepted."""
    if table is None:
        return TaskSet()
    if isinstance(table, TaskSet):
        return table
    if not isinstance(table, Mapping):
        raise ValueError(f"[tasks] must be a table, got {table!r}")
    unknown = sorted(set(table) - set(TASK_KEYS))
    if unknown:
        raise ValueError(f"unknown [tasks] key(s) {unknown}; accepted: {', '.join(TASK_KEYS)}")
    relation = table.get("relation", "esmm")
    if relation not in RELATIONS:
        raise ValueError(f"tasks.relation={relation!r}; accepted: {', '.join(RELATIONS)}")
    heads = table.get("heads", list(ESMM_HEADS) if relation == "esmm" else None)
    if isinstance(heads, str) or not isinstance(heads, (list, tuple)) or not heads:
        raise ValueError(f"tasks.heads={heads!r}; accepted: a non-empty list of head names")
    bad = [head for head in heads if not isinstance(head, str) or not _NAME.match(head)]
    if bad or len(set(heads)) != len(heads):
        raise ValueError(f"tasks.heads={list(heads)!r}; accepted: distinct lower_snake_case names")
    if relation == "esmm" and tuple(heads) != ESMM_HEADS:
        raise ValueError(f"tasks.heads={list(heads)!r} with relation 'esmm'; accepted: {list(ESMM_HEADS)}")
    reserved = [head for head in heads if head in RESERVED]
    if relation == "independent" and reserved:
        raise ValueError(
            f"tasks.heads names {reserved}, ESMM's derived tasks; accepted: other names (or relation 'esmm')"
        )
    return TaskSet(tuple(heads), relation)
