"""The MX cast kernels replaced by stand-ins for a while, where `mxlab.kernels.cast.launch` launches them: the
benches that compile launches without a GPU (`bench sass`) or skip them (`bench host`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

CAST_KERNELS = ("_mx_kernel", "_mx_column_tile_kernel")


@contextlib.contextmanager
def cast_kernels_replaced(stand_in: Callable[[Any], Any], **attributes: Any) -> Iterator[Any]:
    """Inside: each cast kernel that mxlab.kernels.cast.launch launches is `stand_in(kernel)` and the launch
    module's other `attributes` are set as given; yields the module. Everything is restored on exit, also after
    an error. Refuses (RuntimeError) where Triton is not installed."""
    try:
        from mxlab.kernels.cast import launch as module
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "triton":
            raise RuntimeError("the MX cast kernels need Triton, which is not installed") from error
        raise
    replaced = {name: stand_in(getattr(module, name)) for name in CAST_KERNELS} | attributes
    saved = {name: getattr(module, name) for name in replaced}
    try:
        for name, value in replaced.items():
            setattr(module, name, value)
        yield module
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
