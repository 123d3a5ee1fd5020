"""Triton kernels with the same contract as mxlab.numerics.reference, bit for bit (imported as mxlab.kernels).

Importing this package imports Triton; mxlab.numerics.quant imports it only when the Triton backend runs.
Under TRITON_INTERPRET=1 (set before the import) the kernels also run on CPU tensors.
"""
from mxlab.kernels.mx_quant import (
    TileConfig,
    fake_quantize,
    fake_quantize_rowcol,
    quantize,
    quantize_rowcol,
    unsupported_reason,
)

__all__ = ["TileConfig", "fake_quantize", "fake_quantize_rowcol", "quantize", "quantize_rowcol", "unsupported_reason"]
