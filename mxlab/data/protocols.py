"""The contract of a data source (docs/INTERFACES.md, "Plug-ins"), and the check a built source passes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from mxlab.data.batch import DataInfo, JaggedBatch


@runtime_checkable
class Source(Protocol):
    """What the experiment layer reads of a data source.

    ``info``: a DataInfo (sizes the model needs; ``has_truth``, ``has_conversion``, ``base_rates`` where known);
    ``n_train``, ``n_eval``: example counts; ``train_batches(batch_size, seed, epoch)``: the training examples
    in an order fixed by (seed, epoch); ``eval_batches(batch_size)``: the eval set, always in the same order.
    Each batch is a JaggedBatch: ``click``, ``conversion`` and ``user_id`` (per-example ids, the unit of the
    eval variance) always; ``true_ctr``/``true_cvr`` where the truth is known; ``labels[H]`` for each
    independent head H other than ctr (mxlab.tasks).
    """

    info: DataInfo
    n_train: int
    n_eval: int

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]: ...

    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]: ...


SOURCE_FIELDS: tuple[str, ...] = ("info", "n_train", "n_eval", "train_batches", "eval_batches")


def check_source(source: Any, name: str) -> None:
    """Refuses (ValueError) a built source that lacks a field of :class:`Source` or whose info is not a DataInfo,
    naming the source, the missing fields and the required ones."""
    missing = [field for field in SOURCE_FIELDS if not hasattr(source, field)]
    if missing:
        raise ValueError(
            f"data source {name!r} built a {type(source).__name__} without {missing}; "
            f"a source needs {', '.join(SOURCE_FIELDS)} (mxlab.data.protocols.Source)"
        )
    if not isinstance(source.info, DataInfo):
        raise ValueError(f"data source {name!r}: info is {type(source.info).__name__}; expected mxlab.data.DataInfo")
