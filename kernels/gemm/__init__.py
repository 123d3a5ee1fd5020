"""The fused MX GEMM (imported as mxlab.kernels.gemm): Q(a) @ Q(b) from the high-precision operands.

`mx_gemm` runs it, `unsupported_reason` says which calls it refuses, and `quantized_operand` stores the
prologue's quantized operand (the test variant). See kernels/gemm/mx_gemm.py.
"""
from mxlab.kernels.gemm.mx_gemm import mx_gemm, quantized_operand, unsupported_reason

__all__ = ["mx_gemm", "quantized_operand", "unsupported_reason"]
