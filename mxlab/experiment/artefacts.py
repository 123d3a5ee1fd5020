"""Whether a run folder's records can be trusted: a run counts as done only when its done.json and, for a
finished run, its eval.npz read back whole. A truncated or corrupt record makes the run unfinished, so
`--resume` evaluates it again from its last checkpoint instead of reading garbage or looping."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

DONE = "done.json"
EVAL = "eval.npz"
DONE_STATUSES = ("finished", "diverged")  # a skipped or failed run is tried again


def eval_problem(path: Path) -> str | None:
    """Why the eval.npz at `path` cannot be read (missing, truncated, not an npz), or None when every array
    in it reads back."""
    path = Path(path)
    if not path.is_file():
        return f"{path} is missing"
    try:
        with np.load(path, allow_pickle=False) as npz:
            for key in npz.files:
                npz[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        return f"{path} cannot be read ({type(error).__name__}: {' '.join(str(error).split())[:120]})"
    return None


def read_done(run_dir: Path) -> dict[str, Any] | None:
    """The record in RUN/done.json, or None when it is missing or not a readable JSON object."""
    try:
        record = json.loads((Path(run_dir) / DONE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def run_problem(run_dir: Path) -> str | None:
    """Why a run with a done.json is not done (an unreadable done.json, a finished run's unreadable
    eval.npz), or None when it is done or has no done.json."""
    path = Path(run_dir) / DONE
    if not path.is_file():
        return None
    record = read_done(run_dir)
    if record is None:
        return f"{path} cannot be read"
    if record.get("status") == "finished":
        return eval_problem(Path(run_dir) / EVAL)
    return None


def run_is_complete(run_dir: Path) -> bool:
    """True when RUN/done.json reads back as finished (with an eval.npz that reads back) or diverged."""
    record = read_done(run_dir)
    if record is None or record.get("status") not in DONE_STATUSES:
        return False
    return record["status"] == "diverged" or eval_problem(Path(run_dir) / EVAL) is None
