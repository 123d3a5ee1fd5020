"""mxlab: exact MX (OCP microscaling) emulation and precision experiments for CTR/CVR models.

The public API is imported lazily so that `import mxlab` stays cheap and the
layers below never import the layers above them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "quantize": "mxlab.numerics.quant",
    "dequantize": "mxlab.numerics.quant",
    "fake_quantize": "mxlab.numerics.quant",
    "MXTensor": "mxlab.numerics.quant",
    "FORMATS": "mxlab.numerics.formats",
    "get_format": "mxlab.numerics.formats",
    "load_recipe": "mxlab.recipe",
    "apply_recipe": "mxlab.recipe",
    "Recipe": "mxlab.recipe",
    "Plan": "mxlab.recipe",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mxlab' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
