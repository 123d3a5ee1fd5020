"""Which emulated GEMMs of mxlab.nn.qmatmul run in the fused MX GEMM kernel (mxlab.kernels.gemm).

The fused kernel quantizes both operands in registers from the high-precision tensors and multiplies them
with float32 accumulation; its operands are the reference's quantized operands bit for bit, so a GEMM gives
the same result either way up to the order of float32 accumulation. It runs a GEMM when both operands are
MX (1-D blocks of 32 or (32, 32) tiles, any format, scale mode and rounding), the Hadamard transform is off
or of block 32, no stochastic-rounding counters are given, no GEMM observer is installed, and the tensors
are on CUDA. `MXLAB_BACKEND=reference` turns it off; `MXLAB_BACKEND=triton` with `TRITON_INTERPRET=1` also
runs it on CPU tensors (how the CPU tests check it).
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Optional

import torch

_kernels: Optional[ModuleType] = None
_triton_missing = False


def _import_kernels() -> Optional[ModuleType]:
    global _kernels, _triton_missing
    if _kernels is None and not _triton_missing:
        try:
            _kernels = importlib.import_module("mxlab.kernels.gemm")
        except ModuleNotFoundError as error:
            if not (error.name and error.name.split(".")[0] == "triton"):
                raise
            _triton_missing = True
    return _kernels


def fused_gemm_kernels(a: torch.Tensor, b: torch.Tensor, quant: Any) -> Optional[ModuleType]:
    """mxlab.kernels.gemm when it runs the GEMM of `quant` (a GemmQuant) on these operands, else None."""
    forced = os.environ.get("MXLAB_BACKEND", "")
    if forced == "reference":
        return None
    if a.device.type != "cuda" and not (forced == "triton" and os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    if not (quant.a.block_scaled and quant.b.block_scaled):
        return None
    kernels = _import_kernels()
    if kernels is None or kernels.unsupported_reason(a, b, quant.a, quant.b, quant.hadamard) is not None:
        return None
    return kernels
