"""Criteo display-ads files (source = "criteo"), streamed.

Format: one example per line, tab-separated, 40 columns: the click label (0 or 1), 13 integer
count features (may be empty or negative) and 26 categorical features (8-digit hex hashes, may
be empty). This is the format of the Criteo Display Advertising Challenge `train.txt`.

What a JaggedBatch holds:

- dense: the 13 integers as ``sign(x) log(1 + |x|)``, 0 where empty.
- sparse: field ``f`` of a row holds 0 when empty, else ``1 + (int(hex) xor mix(f)) mod
  (hash_size - 1)``; ``hash_size`` is one table size for every field or a list of 26.
- history: empty for every example (offsets all zero; the model's attention gives zeros and
  the interaction block still sees the other tokens).
- click: the label; conversion: all zeros, with ``has_conversion = False`` so that
  `mxlab.models.esmm_loss` trains CTR only and reports skip the CVR/CTCVR metrics.
- user_id: the line number (Criteo has no user id; gAUC is meaningless here).

Split: the training examples are the first ``train_examples`` rows of ``path`` (all rows when
not given); the eval examples are the first ``eval_examples`` rows of ``eval_path`` when given,
else the ``eval_examples`` rows that follow the training rows in ``path``. The training order
for (seed, epoch) comes from a shuffle buffer of ``shuffle_buffer`` rows seeded by (seed,
epoch); nothing beyond that buffer is held in memory. A malformed row is a ValueError naming
the file and line number; rows are never skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mxlab.data.batch import DataInfo, DataSource, JaggedBatch, check_batch_arguments

N_INTEGER = 13
N_CATEGORICAL = 26
N_COLUMNS = 1 + N_INTEGER + N_CATEGORICAL


@dataclass(frozen=True)
class CriteoConfig:
    """Knobs of the Criteo source (the [data] table with source = "criteo")."""

    source: str = "criteo"
    path: str = ""
    eval_path: str | None = None
    train_examples: int | None = None
    eval_examples: int = 0
    hash_size: int | tuple[int, ...] = 20_011
    shuffle_buffer: int = 65_536

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("the criteo source needs `path` (a tab-separated Criteo-format file)")
        sizes = self.table_sizes()
        if len(sizes) != N_CATEGORICAL or min(sizes) < 2:
            raise ValueError(
                f"criteo hash_size must be an integer >= 2 or a list of {N_CATEGORICAL} of them; got {self.hash_size!r}"
            )
        if self.train_examples is not None and self.train_examples < 1:
            raise ValueError(f"criteo train_examples must be >= 1; got {self.train_examples}")
        if self.eval_examples < 0 or self.shuffle_buffer < 1:
            raise ValueError(
                "criteo eval_examples must be >= 0 and shuffle_buffer "
                f">= 1; got {self.eval_examples}, {self.shuffle_buffer}"
            )

    def table_sizes(self) -> tuple[int, ...]:
        """Return the hash table size of each of the 26 categorical fields."""
        if isinstance(self.hash_size, int):
            return (self.hash_size,) * N_CATEGORICAL
        return tuple(self.hash_size)


def _field_salt(field: int) -> int:
    z = (field + 1) * 0x9E3779B1 & 0xFFFFFFFF
    z ^= z >> 16
    z = z * 0x7FEB352D & 0xFFFFFFFF
    return z ^ (z >> 15)


_SALTS = tuple(_field_salt(field) for field in range(N_CATEGORICAL))


def parse_line(line: str, table_sizes: tuple[int, ...], where: str) -> tuple[int, list[float], list[int]]:
    """Return (label, 13 dense values, 26 hashed ids) of one Criteo row.

    Refuses (ValueError, naming `where`) a row without 40 columns, a label other than 0/1, a
    non-integer count or a non-hex categorical value.
    """
    columns = line.rstrip("\r\n").split("\t")
    if len(columns) != N_COLUMNS:
        raise ValueError(
            f"{where}: expected {N_COLUMNS} tab-separated columns (label, {N_INTEGER} "
            f"integers, {N_CATEGORICAL} categoricals), got {len(columns)}"
        )
    if columns[0] not in ("0", "1"):
        raise ValueError(f"{where}: label {columns[0]!r} is not 0 or 1")
    dense = []
    for position, text in enumerate(columns[1 : 1 + N_INTEGER], start=1):
        if text == "":
            dense.append(0.0)
            continue
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{where}: integer feature I{position} = {text!r} is not an integer") from None
        dense.append(math.copysign(math.log1p(abs(value)), value))
    ids = []
    for field, text in enumerate(columns[1 + N_INTEGER :]):
        if text == "":
            ids.append(0)
            continue
        try:
            value = int(text, 16)
        except ValueError:
            raise ValueError(f"{where}: categorical feature C{field + 1} = {text!r} is not hexadecimal") from None
        ids.append(1 + (value ^ _SALTS[field]) % (table_sizes[field] - 1))
    return int(columns[0]), dense, ids


def _count_rows(path: Path) -> int:
    with open(path, "rb") as handle:
        return (
            sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 22), b"")) if path.stat().st_size else 0
        )


class CriteoSource(DataSource):
    """Streaming Criteo-format examples; see the module docstring."""

    config_class = CriteoConfig
    tasks = ("ctr",)  # no conversion labels (DataInfo.has_conversion False)

    def __init__(self, config: CriteoConfig, max_history: int) -> None:
        self.config = config
        self.path = Path(config.path)
        self.eval_path = Path(config.eval_path) if config.eval_path else None
        for path in (self.path, self.eval_path):
            if path is not None and not path.is_file():
                raise FileNotFoundError(f"Criteo file {path} does not exist")
        self.table_sizes = config.table_sizes()
        rows = _count_rows(self.path)
        self.n_train = (
            config.train_examples
            if config.train_examples is not None
            else rows - (0 if self.eval_path else config.eval_examples)
        )
        self.n_eval = config.eval_examples
        eval_rows = _count_rows(self.eval_path) if self.eval_path else rows - self.n_train
        if self.n_train < 1 or self.n_train > rows - (0 if self.eval_path else self.n_eval):
            raise ValueError(
                f"{self.path} has {rows} rows: too few for train_examples = {self.n_train}"
                + ("" if self.eval_path else f" plus eval_examples = {self.n_eval}")
            )
        if self.n_eval > eval_rows:
            raise ValueError(
                f"{self.eval_path or self.path} has {eval_rows} rows for eval, fewer than eval_examples = {self.n_eval}"
            )
        self.info = DataInfo(
            n_dense=N_INTEGER,
            field_cardinalities=self.table_sizes,
            n_items=1,
            n_actions=1,
            has_truth=False,
            name="criteo",
            candidate_field=None,
            field_names=tuple(f"C{field + 1}" for field in range(N_CATEGORICAL)),
            has_conversion=False,
            has_history=False,
        )

    def _rows(self, path: Path, skip: int, count: int) -> Iterator[tuple[int, int, list[float], list[int]]]:
        """Yield (line number, label, dense, ids) for `count` rows after the first `skip`."""
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line_number, line in enumerate(handle, start=1):
                if line_number <= skip:
                    continue
                if line_number > skip + count:
                    return
                label, dense, ids = parse_line(line, self.table_sizes, f"{path}, line {line_number}")
                yield line_number, label, dense, ids

    def check_rows(self) -> None:
        """Read every train and eval row once; refuses (ValueError naming the file and line) the first bad one."""
        for _ in self._rows(self.path, 0, self.n_train):
            pass
        if self.eval_path is not None:
            for _ in self._rows(self.eval_path, 0, self.n_eval):
                pass
        else:
            for _ in self._rows(self.path, self.n_train, self.n_eval):
                pass

    @staticmethod
    def _batch(rows: list[tuple[int, int, list[float], list[int]]]) -> JaggedBatch:
        n = len(rows)
        return JaggedBatch(
            dense=torch.tensor([row[2] for row in rows], dtype=torch.float32).reshape(n, N_INTEGER),
            sparse=torch.tensor([row[3] for row in rows], dtype=torch.int64).reshape(n, N_CATEGORICAL),
            history_items=torch.zeros(0, dtype=torch.int64),
            history_actions=torch.zeros(0, dtype=torch.int64),
            history_offsets=torch.zeros(n + 1, dtype=torch.int64),
            click=torch.tensor([float(row[1]) for row in rows], dtype=torch.float32),
            conversion=torch.zeros(n, dtype=torch.float32),
            user_id=torch.tensor([row[0] for row in rows], dtype=torch.int64),
            has_conversion=False,
        )

    def _batches(self, rows: Iterator, batch_size: int) -> Iterator[JaggedBatch]:
        pending = []
        for row in rows:
            pending.append(row)
            if len(pending) == batch_size:
                yield self._batch(pending)
                pending = []
        if pending:
            yield self._batch(pending)

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]:
        """Yield the training rows through a shuffle buffer seeded by (seed, epoch)."""
        check_batch_arguments(batch_size, seed, epoch)
        rng = np.random.default_rng([seed, epoch])

        def shuffled() -> Iterator:
            buffer = []
            for row in self._rows(self.path, 0, self.n_train):
                if len(buffer) < self.config.shuffle_buffer:
                    buffer.append(row)
                    continue
                slot = int(rng.integers(len(buffer)))
                buffer[slot], row = row, buffer[slot]
                yield row
            for index in rng.permutation(len(buffer)):
                yield buffer[index]

        return self._batches(shuffled(), batch_size)

    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]:
        """Yield the eval rows in file order."""
        check_batch_arguments(batch_size)
        if self.eval_path is not None:
            return self._batches(self._rows(self.eval_path, 0, self.n_eval), batch_size)
        return self._batches(self._rows(self.path, self.n_train, self.n_eval), batch_size)


__all__ = ["CriteoConfig", "CriteoSource", "parse_line"]
