"""MovieLens-100K (source = "movielens-100k"): real ratings as clicks and conversions.

The files come from the `recbole==1.2.1` wheel on PyPI, which ships the dataset in RecBole's
atomic format under ``recbole/dataset_example/ml-100k/``: tab-separated, one header line of
``name:type`` columns:

- ``ml-100k.inter``: ``user_id:token item_id:token rating:float timestamp:float`` (100000 rows)
- ``ml-100k.user``: ``user_id:token age:token gender:token occupation:token zip_code:token`` (943)
- ``ml-100k.item``: ``item_id:token movie_title:token_seq release_year:token class:token_seq``
  (1682; ``class`` is a space-separated list of genres)

`fetch_movielens` (``mxlab data fetch movielens-100k``) downloads the wheel without its
dependencies (``pip download --no-deps``), extracts the three files into the cache folder,
checks their row counts and sha256 (against the known ones) and writes ``manifest.json``.

Examples. One example per rating. click = rating >= 4; conversion = rating == 5 (so it
implies a click). Ratings are ordered by (timestamp, user, item); the earliest
``1 - eval_fraction`` of them are the training period and the rest the eval period (a split
by time). The history of an example is the same user's ratings with a strictly earlier
timestamp (at most the latest ``max_history``, oldest first): item ids and, as the action
type, the rating 1..5. No history holds a rating from the example's own second or later, so
nothing from the future leaks in. ``train_examples``/``eval_examples``, when given, keep the
latest training examples and the earliest eval examples (the ones next to the split).

Features: sparse fields (movie id [history item space], user age bucket, gender, occupation,
release-year bucket [0 = unknown year], first genre); dense (age / 100, (release year - 1900) / 100,
log(1 + history length) / 7).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mxlab.data.batch import DataInfo, DataSource, JaggedBatch, check_batch_arguments

RECBOLE_REQUIREMENT = "recbole==1.2.1"
WHEEL_DATA_FOLDER = "recbole/dataset_example/ml-100k/"
FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
EXPECTED_ROWS = {"ml-100k.inter": 100_000, "ml-100k.user": 943, "ml-100k.item": 1682}
HEADERS = {
    "ml-100k.inter": ("user_id:token", "item_id:token", "rating:float", "timestamp:float"),
    "ml-100k.user": ("user_id:token", "age:token", "gender:token", "occupation:token", "zip_code:token"),
    "ml-100k.item": ("item_id:token", "movie_title:token_seq", "release_year:token", "class:token_seq"),
}
KNOWN_SHA256 = {  # the files of the recbole 1.2.1 wheel
    "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
    "ml-100k.user": "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
    "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
}
FETCH_COMMAND = "mxlab data fetch movielens-100k"
FIELD_NAMES = ("movie_id", "age_bucket", "gender", "occupation", "release_year_bucket", "genre")
N_ACTIONS = 6  # rating 1..5; 0 unused
AGE_BUCKETS = (18, 25, 35, 45, 50, 56)  # the classic MovieLens age groups, as upper-open edges
YEAR_BUCKET_EDGES = (1930, 1950, 1960, 1970, 1980, 1985, 1990, 1993, 1995, 1996, 1997)


def default_cache_dir() -> Path:
    """Return $MXLAB_CACHE/movielens-100k, or ~/.cache/mxlab/movielens-100k."""
    root = os.environ.get("MXLAB_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "mxlab") / "movielens-100k"


@dataclass(frozen=True)
class MovieLensConfig:
    """Knobs of the MovieLens-100K source (the [data] table with source = "movielens-100k")."""

    source: str = "movielens-100k"
    train_examples: int | None = None
    eval_examples: int | None = None
    cache_dir: str | None = None
    eval_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"movielens-100k eval_fraction must be in (0, 1); got {self.eval_fraction}")
        for name in ("train_examples", "eval_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"movielens-100k {name} must be >= 1; got {value}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_table(path: Path) -> list[list[str]]:
    """Return the data rows of an atomic file after checking its header; refuses a bad header
    or a row with the wrong number of columns (naming the file and line)."""
    if not path.exists():
        raise FileNotFoundError(
            f"MovieLens-100K file {path} is missing; run `{FETCH_COMMAND} --cache-dir {path.parent}`"
        )
    expected = HEADERS[path.name]
    with open(path, encoding="utf-8", errors="replace") as handle:
        header = tuple(handle.readline().rstrip("\n").split("\t"))
        if header != expected:
            raise ValueError(f"{path}: header {header} is not the RecBole atomic header {expected}")
        rows = []
        for line_number, line in enumerate(handle, start=2):
            columns = line.rstrip("\n").split("\t")
            if len(columns) != len(expected):
                raise ValueError(
                    f"{path}, line {line_number}: expected {len(expected)} tab-separated columns, got {len(columns)}"
                )
            rows.append(columns)
    return rows


def verify_movielens(cache_dir: Path, expected_rows: dict[str, int] | None = None) -> dict[str, dict]:
    """Return {file: {rows, sha256}} for the three files in `cache_dir`.

    Refuses (ValueError) a header or row count that differs from `expected_rows` (default: the
    real dataset's 100000 / 943 / 1682); a missing file raises FileNotFoundError with the fetch
    command.
    """
    expected_rows = EXPECTED_ROWS if expected_rows is None else expected_rows
    summary = {}
    for name in FILES:
        path = Path(cache_dir) / name
        rows = len(_read_table(path))
        if name in expected_rows and rows != expected_rows[name]:
            raise ValueError(f"{path}: {rows} rows, expected {expected_rows[name]}")
        summary[name] = {"rows": rows, "sha256": _sha256(path)}
    return summary


def extract_movielens(
    wheel: Path,
    cache_dir: Path,
    expected_rows: dict[str, int] | None = None,
    expected_sha256: dict[str, str] | None = None,
) -> dict[str, dict]:
    """Extract the three ml-100k files from a recbole wheel into `cache_dir`, verify them (row
    counts; sha256 when `expected_sha256` is given) and write manifest.json; return the
    manifest's file table. Refuses (ValueError) a wheel without them or a file that differs."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in FILES:
            member = WHEEL_DATA_FOLDER + name
            if member not in names:
                raise ValueError(f"{wheel} does not contain {member}")
            temporary = cache_dir / (name + ".partial")
            with archive.open(member) as source, open(temporary, "wb") as target:
                shutil.copyfileobj(source, target)
            temporary.replace(cache_dir / name)
    summary = verify_movielens(cache_dir, expected_rows)
    for name, digest in (expected_sha256 or {}).items():
        if summary[name]["sha256"] != digest:
            raise ValueError(f"{cache_dir / name}: sha256 {summary[name]['sha256']} differs from the known {digest}")
    manifest = {"source": RECBOLE_REQUIREMENT, "wheel": Path(wheel).name, "files": summary}
    temporary = cache_dir / "manifest.json.partial"
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    temporary.replace(cache_dir / "manifest.json")
    return summary


def fetch_movielens(cache_dir: str | Path | None = None) -> Path:
    """Download the recbole wheel with pip (no dependencies), extract and verify MovieLens-100K;
    return the cache folder. Refuses (RuntimeError) when pip fails, with pip's message."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    with tempfile.TemporaryDirectory(prefix="mxlab-recbole-") as download_dir:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", RECBOLE_REQUIREMENT, "-d", download_dir]
        completed = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(Path(download_dir).glob("recbole-*.whl"))
        if completed.returncode != 0 or not wheels:
            raise RuntimeError(f"`{' '.join(command)}` failed:\n{completed.stderr.strip() or completed.stdout.strip()}")
        extract_movielens(wheels[0], cache_dir, expected_sha256=KNOWN_SHA256)
    return cache_dir


def _bucket(values: np.ndarray, edges: tuple[int, ...]) -> np.ndarray:
    return np.searchsorted(np.asarray(edges), values, side="right")


class MovieLensSource(DataSource):
    """MovieLens-100K examples in memory (100k ratings); see the module docstring."""

    config_class = MovieLensConfig

    def __init__(self, config: MovieLensConfig, max_history: int) -> None:
        cache_dir = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
        if not (cache_dir / FILES[0]).exists():
            raise FileNotFoundError(
                f"MovieLens-100K is not in {cache_dir}; fetch it with `{FETCH_COMMAND}"
                + (f" --cache-dir {cache_dir}`" if config.cache_dir else "`")
            )
        self.config = config
        self.max_history = int(max_history)
        inter = _read_table(cache_dir / "ml-100k.inter")
        users = _read_table(cache_dir / "ml-100k.user")
        items = _read_table(cache_dir / "ml-100k.item")
        try:
            user = np.array([int(row[0]) for row in inter], dtype=np.int64)
            item = np.array([int(row[1]) for row in inter], dtype=np.int64)
            rating = np.array([float(row[2]) for row in inter])
            timestamp = np.array([float(row[3]) for row in inter])
        except ValueError as error:
            raise ValueError(f"{cache_dir / 'ml-100k.inter'}: unparsable value ({error})") from None
        if inter and not np.isin(rating, [1, 2, 3, 4, 5]).all():
            raise ValueError(f"{cache_dir / 'ml-100k.inter'}: ratings must be 1..5")
        try:
            n_users = int(max([user.max(initial=0)] + [int(row[0]) for row in users])) + 1
            n_items = int(max([item.max(initial=0)] + [int(row[0]) for row in items])) + 1
            age, gender, occupation = np.zeros(n_users), np.zeros(n_users, np.int64), np.zeros(n_users, np.int64)
            genders = {value: index + 1 for index, value in enumerate(sorted({row[2] for row in users}))}
            occupations = {value: index + 1 for index, value in enumerate(sorted({row[3] for row in users}))}
            for row in users:
                age[int(row[0])] = float(row[1])
                gender[int(row[0])] = genders[row[2]]
                occupation[int(row[0])] = occupations[row[3]]
            year, genre = np.zeros(n_items), np.zeros(n_items, np.int64)
            genres = {
                value: index + 1
                for index, value in enumerate(sorted({row[3].split(" ")[0] for row in items if row[3]}))
            }
            for row in items:
                year[int(row[0])] = float(row[2]) if row[2].strip().isdigit() else 0.0  # one row says 'unkonwn'
                genre[int(row[0])] = genres[row[3].split(" ")[0]] if row[3] else 0
        except (ValueError, KeyError) as error:
            raise ValueError(f"{cache_dir}: unparsable user or item row ({error})") from None

        order = np.lexsort((item, user, timestamp))
        user, item, rating, timestamp = user[order], item[order], rating[order], timestamp[order]
        n = user.size
        n_train_all = int(round(n * (1.0 - config.eval_fraction)))
        train_index = np.arange(n_train_all)
        eval_index = np.arange(n_train_all, n)
        if config.train_examples is not None:
            if config.train_examples > train_index.size:
                raise ValueError(
                    f"movielens-100k train_examples = {config.train_examples} "
                    f"but the training period has {train_index.size}"
                )
            train_index = train_index[train_index.size - config.train_examples :]
        if config.eval_examples is not None:
            if config.eval_examples > eval_index.size:
                raise ValueError(
                    f"movielens-100k eval_examples = {config.eval_examples} but the eval period has {eval_index.size}"
                )
            eval_index = eval_index[: config.eval_examples]

        # History: per user, the ratings with a strictly earlier timestamp (latest max_history).
        by_user = np.lexsort((timestamp, user))  # stable within (user, time)
        time_rank = np.unique(timestamp, return_inverse=True)[1].astype(np.int64)
        key = user * (n + 1) + time_rank  # exact: orders by user, then time
        user_start = np.searchsorted(user[by_user], user, side="left")
        history_end = np.searchsorted(key[by_user], key, side="left")  # strictly earlier timestamps
        history_start = np.maximum(user_start, history_end - self.max_history)
        lengths = history_end - history_start

        self._by_user_items = torch.from_numpy(item[by_user])
        self._by_user_ratings = torch.from_numpy(rating[by_user].astype(np.int64))
        self._history_start = history_start
        self._lengths = lengths
        self._user, self._item, self._rating = user, item, rating
        age_values = age[user]
        year_values = year[item]
        self._sparse = np.stack(
            [
                item,
                _bucket(age_values, AGE_BUCKETS),
                gender[user],
                occupation[user],
                _bucket(year_values, YEAR_BUCKET_EDGES),
                genre[item],
            ],
            axis=1,
        ).astype(np.int64)
        self._dense = np.stack(
            [
                age_values / 100.0,
                np.where(year_values > 0, (year_values - 1900.0) / 100.0, 0.0),
                np.log1p(lengths) / 7.0,
            ],
            axis=1,
        ).astype(np.float32)
        self._train_index, self._eval_index = train_index, eval_index
        self.n_train, self.n_eval = int(train_index.size), int(eval_index.size)
        train_rating = self._rating[train_index]
        clicks = max(1, int((train_rating >= 4).sum()))
        base_rates = (clicks / max(1, train_rating.size), float((train_rating == 5).sum()) / clicks)
        self.info = DataInfo(
            n_dense=3,
            field_cardinalities=(
                n_items,
                len(AGE_BUCKETS) + 1,
                len(genders) + 1,
                len(occupations) + 1,
                len(YEAR_BUCKET_EDGES) + 1,
                len(genres) + 1,
            ),
            n_items=n_items,
            n_actions=N_ACTIONS,
            has_truth=False,
            name="movielens-100k",
            candidate_field=0,
            field_names=FIELD_NAMES,
            base_rates=base_rates,
        )

    def _examples(self, index: np.ndarray) -> JaggedBatch:
        lengths = torch.from_numpy(self._lengths[index])
        offsets = torch.zeros(index.size + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        total = int(offsets[-1])
        starts = torch.from_numpy(self._history_start[index])
        positions = torch.repeat_interleave(starts - offsets[:-1], lengths, output_size=total) + torch.arange(total)
        rating = self._rating[index]
        click = rating >= 4
        return JaggedBatch(
            dense=torch.from_numpy(self._dense[index]),
            sparse=torch.from_numpy(self._sparse[index]),
            history_items=self._by_user_items[positions],
            history_actions=self._by_user_ratings[positions],
            history_offsets=offsets,
            click=torch.from_numpy(click.astype(np.float32)),
            conversion=torch.from_numpy((rating == 5).astype(np.float32)),
            user_id=torch.from_numpy(self._user[index]),
        )

    def _batches(self, index: np.ndarray, batch_size: int) -> Iterator[JaggedBatch]:
        for start in range(0, index.size, batch_size):
            yield self._examples(index[start : start + batch_size])

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]:
        """Yield the training examples shuffled by (seed, epoch). Refuses bad batch arguments."""
        check_batch_arguments(batch_size, seed, epoch)
        order = np.random.default_rng([seed, epoch]).permutation(self._train_index)
        return self._batches(order, batch_size)

    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]:
        """Yield the eval-period examples in time order."""
        check_batch_arguments(batch_size)
        return self._batches(self._eval_index, batch_size)


__all__ = [
    "MovieLensConfig",
    "MovieLensSource",
    "default_cache_dir",
    "extract_movielens",
    "fetch_movielens",
    "verify_movielens",
]
