"""The Triton kernel modules (mxlab.kernels.NAME) that mxlab.nn runs on CUDA, imported on first use."""
from __future__ import annotations

import importlib
from typing import Any


def triton_module(name: str) -> Any:
    """mxlab.kernels.NAME, or None when Triton is not installed (other import errors propagate)."""
    try:
        return importlib.import_module(f"mxlab.kernels.{name}")
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "triton":
            return None
        raise
