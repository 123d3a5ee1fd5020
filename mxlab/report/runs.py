"""Readers for the per-run files a report shows: metrics.jsonl, numerics.jsonl, plan.txt."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

NUMERICS_KEYS = ("step", "module", "gemm", "sqnr_db", "saturated_frac", "flushed_frac", "subnormal_frac")
TRAINING_KEYS = ("step", "loss")


def read_jsonl(path: Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The records of a JSON-lines file ([] when it does not exist). NaN/Infinity literals are read as floats.

    Refuses a line that is not a JSON object or lacks a required key, naming the file and line."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        missing = [k for k in required if k not in record]
        if missing:
            raise ValueError(f"{path}:{number}: lacks {missing}; required: {list(required)}")
        records.append(record)
    return records


def read_training_log(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of a run, in step order (see docs/INTERFACES.md)."""
    return sorted(read_jsonl(run_dir / "metrics.jsonl", TRAINING_KEYS), key=lambda r: r["step"])


def read_numerics(run_dir: Path) -> list[dict[str, Any]]:
    """numerics.jsonl of a run ([] when diagnostics were off)."""
    return read_jsonl(run_dir / "numerics.jsonl", NUMERICS_KEYS)


def read_plan(run_dir: Path) -> str | None:
    """plan.txt of a run, or None when the run has none."""
    path = run_dir / "plan.txt"
    return path.read_text() if path.is_file() else None


def finite_or_none(value: Any) -> float | None:
    """A float, or None for a missing or non-finite value."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
