"""Quantized building blocks: QLinear, qmatmul, and jagged attention."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"QLinear": "mxlab.nn.linear", "qmatmul": "mxlab.nn.qmatmul", "JaggedAttention": "mxlab.nn.attention"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mxlab.nn' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
