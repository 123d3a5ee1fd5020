"""Jagged batches, data-source descriptions, and the small helpers every source shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace

import torch


@dataclass
class JaggedBatch:
    """One batch of examples with jagged user histories (see docs/INTERFACES.md).

    The history of example ``i`` is ``history_items[history_offsets[i]:history_offsets[i+1]]``
    (oldest first), with one action type per item. ``true_ctr``/``true_cvr`` are the true
    probabilities where the source knows them (synthetic data), else None. ``has_conversion``
    is False for sources without a conversion label (Criteo): ``conversion`` is then all zeros
    and `mxlab.models.esmm_loss` leaves the CTCVR term out of the loss. ``labels``: the 0/1 labels of
    independent tasks by head name (mxlab.tasks), (B,) each, where the source has such tasks, else None.
    """

    dense: torch.Tensor
    sparse: torch.Tensor
    history_items: torch.Tensor
    history_actions: torch.Tensor
    history_offsets: torch.Tensor
    click: torch.Tensor
    conversion: torch.Tensor
    user_id: torch.Tensor
    true_ctr: torch.Tensor | None = None
    true_cvr: torch.Tensor | None = None
    has_conversion: bool = True
    labels: dict[str, torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        """Number of examples."""
        return int(self.click.shape[0])

    def __len__(self) -> int:
        return self.batch_size

    def history_lengths(self) -> torch.Tensor:
        """Return the history length of each example, (B,) int64."""
        return self.history_offsets[1:] - self.history_offsets[:-1]

    def to(self, device: torch.device | str) -> JaggedBatch:
        """Return a copy with every tensor on `device`."""
        moved = {}
        for field in fields(self):
            value = getattr(self, field.name)
            moved[field.name] = value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        if self.labels is not None:
            moved["labels"] = {name: label.to(device, non_blocking=True) for name, label in self.labels.items()}
        return JaggedBatch(**moved)

    def take(self, index: torch.Tensor) -> JaggedBatch:
        """Return the examples at `index` (1-D int64), in that order, histories included."""
        index = index.to(torch.int64)
        lengths = self.history_lengths()[index]
        device = self.history_offsets.device
        index = index.to(device)
        offsets = torch.zeros(index.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        total = int(offsets[-1])
        source_start = self.history_offsets[:-1][index]
        shift = torch.repeat_interleave(source_start - offsets[:-1], lengths, output_size=total)
        history_index = torch.arange(total, dtype=torch.int64, device=device) + shift
        rows = lambda tensor: None if tensor is None else tensor.index_select(0, index)  # noqa: E731
        return replace(
            self,
            dense=rows(self.dense),
            sparse=rows(self.sparse),
            history_items=self.history_items.index_select(0, history_index),
            history_actions=self.history_actions.index_select(0, history_index),
            history_offsets=offsets,
            click=rows(self.click),
            conversion=rows(self.conversion),
            user_id=rows(self.user_id),
            true_ctr=rows(self.true_ctr),
            true_cvr=rows(self.true_cvr),
            labels=None if self.labels is None else {name: rows(label) for name, label in self.labels.items()},
        )

    def slice(self, start: int, stop: int) -> JaggedBatch:
        """Return examples start..stop-1 as views (no copy of the histories)."""
        if not 0 <= start <= stop <= self.batch_size:
            raise ValueError(f"slice {start}:{stop} is outside a batch of {self.batch_size}")
        first, last = int(self.history_offsets[start]), int(self.history_offsets[stop])
        rows = lambda tensor: None if tensor is None else tensor[start:stop]  # noqa: E731
        return replace(
            self,
            dense=rows(self.dense),
            sparse=rows(self.sparse),
            history_items=self.history_items[first:last],
            history_actions=self.history_actions[first:last],
            history_offsets=self.history_offsets[start : stop + 1] - first,
            click=rows(self.click),
            conversion=rows(self.conversion),
            user_id=rows(self.user_id),
            true_ctr=rows(self.true_ctr),
            true_cvr=rows(self.true_cvr),
            labels=None if self.labels is None else {name: rows(label) for name, label in self.labels.items()},
        )

    @staticmethod
    def concat(batches: list[JaggedBatch]) -> JaggedBatch:
        """Return the examples of `batches` one after another. Refuses an empty list."""
        if not batches:
            raise ValueError("cannot concatenate an empty list of batches")
        if len(batches) == 1:
            return batches[0]
        offsets = [batches[0].history_offsets]
        for batch in batches[1:]:
            offsets.append(batch.history_offsets[1:] + offsets[-1][-1])

        def cat(name: str) -> torch.Tensor | None:
            values = [getattr(batch, name) for batch in batches]
            if any(value is None for value in values):
                return None
            return torch.cat(values)

        return JaggedBatch(
            dense=cat("dense"),
            sparse=cat("sparse"),
            history_items=cat("history_items"),
            history_actions=cat("history_actions"),
            history_offsets=torch.cat(offsets),
            click=cat("click"),
            conversion=cat("conversion"),
            user_id=cat("user_id"),
            true_ctr=cat("true_ctr"),
            true_cvr=cat("true_cvr"),
            has_conversion=batches[0].has_conversion,
            labels=None
            if batches[0].labels is None
            else {name: torch.cat([batch.labels[name] for batch in batches]) for name in batches[0].labels},
        )


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about a source.

    ``field_cardinalities`` gives the table size of each sparse field; ``n_items`` and
    ``n_actions`` the sizes of the history item and action vocabularies. Extensions to the
    documented interface (with defaults): ``candidate_field`` is the index of the sparse field
    whose ids live in the history item space (the candidate ad/movie), or None;
    ``field_names``; ``has_conversion`` (False: conversion labels are absent, CVR metrics
    meaningless); ``has_history`` (False: every history is empty); ``base_rates``: (CTR, CVR given a
    click) of the training data where the source knows them (the output biases start there), else None;
    ``item_fields``: per sparse field name, that field's value for every history item id (an item's side
    feature, such as the synthetic world's topic of each item), which a model may add to each history token.
    """

    n_dense: int
    field_cardinalities: tuple[int, ...]
    n_items: int
    n_actions: int
    has_truth: bool
    name: str
    candidate_field: int | None = None
    field_names: tuple[str, ...] = ()
    has_conversion: bool = True
    has_history: bool = True
    base_rates: tuple[float, float] | None = None
    item_fields: tuple[tuple[str, tuple[int, ...]], ...] = ()


class DataSource(ABC):
    """A source of train and eval batches (see docs/INTERFACES.md). A built-in source class also says how its
    [data] table is read: `config_class` (the dataclass of its keys), `table_only_keys` (keys resolved into
    the config's fields), `tasks` (the tasks it labels) and `knows_truth` (true probabilities are known)."""

    info: DataInfo
    n_train: int
    n_eval: int
    config_class: type | None = None
    table_only_keys: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ("ctr", "cvr", "ctcvr")
    knows_truth: bool = False

    @classmethod
    def resolve_table(cls, table: dict) -> dict:
        """The [data] table with its table-only keys resolved (a synthetic preset); the table itself by default."""
        return table

    @abstractmethod
    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]:
        """Yield the training examples of `epoch` in an order fixed by (seed, epoch)."""

    @abstractmethod
    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]:
        """Yield the evaluation examples, always in the same order."""

    def describe(self) -> dict:
        """Return a short JSON-able description (name, sizes, info)."""
        return {"name": self.info.name, "n_train": self.n_train, "n_eval": self.n_eval, "info": asdict(self.info)}


def check_batch_arguments(batch_size: int, seed: int = 0, epoch: int = 0) -> None:
    """Refuse a non-positive batch size or a negative seed or epoch (ValueError)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer; got {epoch!r}")


def rebatch(chunks: Iterable[JaggedBatch], batch_size: int) -> Iterator[JaggedBatch]:
    """Cut a stream of chunks into batches of `batch_size` examples (the last may be smaller)."""
    pending: list[JaggedBatch] = []
    pending_examples = 0
    for chunk in chunks:
        pending.append(chunk)
        pending_examples += chunk.batch_size
        if pending_examples < batch_size:
            continue
        merged = JaggedBatch.concat(pending)
        start = 0
        while merged.batch_size - start >= batch_size:
            yield merged.slice(start, start + batch_size)
            start += batch_size
        rest = merged.batch_size - start
        pending = [merged.slice(start, merged.batch_size)] if rest else []
        pending_examples = rest
    if pending_examples:
        yield JaggedBatch.concat(pending)


def prefetched(items: Iterable[JaggedBatch], depth: int = 2) -> Iterator[JaggedBatch]:
    """Yield `items` in order while a daemon thread produces up to `depth` of them ahead.

    Generation (numpy, torch gathers) releases the GIL, so it overlaps with training. An
    exception in the producer is raised here; abandoning the iterator stops the producer.
    """
    import queue
    import threading

    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    finished = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        buffer.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            buffer.put(finished)
        except BaseException as error:  # handed to the consumer
            buffer.put(error)

    worker = threading.Thread(target=produce, name="mxlab-data-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = buffer.get()
            if item is finished:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
