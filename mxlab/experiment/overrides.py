"""`--set key=value` overrides of an experiment spec's raw table (mxlab.experiment.spec applies them)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse one `--set key=value` into (dotted key parts, value).

    The value is read as a TOML value (`2`, `1e-3`, `[0, 1]`, `true`, `"x"`); a bare word that is
    not valid TOML (`movielens-100k`) is taken as a string. Refuses text without `=` or an empty key.
    """
    if "=" not in text:
        raise ValueError(f"--set expects key=value (e.g. train.epochs=2), got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not part for part in parts):
        raise ValueError(f"--set has an empty key in {text!r}; expected a dotted key like train.epochs")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of the raw spec table with each `key=value` override set (tables created as needed).

    Refuses an override that descends into a value that is not a table.
    """
    result = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        table = result
        for depth, part in enumerate(parts[:-1]):
            child = table.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {text!r}: {'.'.join(parts[: depth + 1])} is not a table")
            table = child
        table[parts[-1]] = value
    return result


__all__ = ["apply_overrides", "parse_override"]
