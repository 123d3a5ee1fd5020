"""The MX cast kernels (Triton), bit-identical to mxlab.numerics.reference.

Device code: `bits` (bit helpers, random bits, Hadamard transform, scales), `elements` (element
quantization), `emit` (quantize-and-store per tile path), `kernels` (the two cast kernels). Host code:
`launch` (launch shapes, views, the launch), `api` (the public casts). docs/numerics.md ("The cast
kernels") gives the algorithm and why each path is exact.
"""

from mxlab.kernels.cast.api import (
    fake_quantize,
    fake_quantize_rowcol,
    hadamard_fake_quantize,
    hadamard_quantize,
    quantize,
    quantize_rowcol,
)
from mxlab.kernels.cast.launch import CastLaunch, TileConfig, hardware_fp8_applies, unsupported_reason

__all__ = [
    "CastLaunch",
    "TileConfig",
    "fake_quantize",
    "fake_quantize_rowcol",
    "hadamard_fake_quantize",
    "hadamard_quantize",
    "hardware_fp8_applies",
    "quantize",
    "quantize_rowcol",
    "unsupported_reason",
]
