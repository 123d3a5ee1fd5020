"""How deltas, intervals and verdict words are written in a report."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mxlab.analysis import Comparison

VERDICT_MARKS = {
    "regression": "**▼ regression**",
    "improvement": "▲ improvement",
    "non-inferior": "✔ non-inferior",
    "equivalent": "✔ equivalent",
    "inconclusive": "inconclusive",
    None: "",
}


def format_value(metric: str, value: float | None, signed: bool = True) -> str:
    """A delta or interval end: percent with 3 significant digits for NE metrics and calibration shifts,
    5 decimals otherwise."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if metric.endswith("ne") or metric.endswith(".calibration"):
        return f"{value:{'+' if signed else ''}.3g}%"
    return f"{value:{'+' if signed else ''}.5f}"


def format_interval(c: Comparison | dict[str, Any]) -> str:
    """'delta [low, high]'."""
    get = c.get if isinstance(c, dict) else lambda k: getattr(c, k)
    m = get("metric")
    return f"{format_value(m, get('delta'))} [{format_value(m, get('low'))}, {format_value(m, get('high'))}]"


def mean_sd(values: list[float], digits: int = 4) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


# ----------------------------------------------------------------------------- file writing
