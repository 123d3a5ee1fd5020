"""Triton kernels with the same contract as mxlab.numerics.reference, bit for bit (imported as mxlab.kernels).

`cast/`: the MX casts; `attention/`: jagged flash attention with MX operands; `_mx_device`: in-kernel
fake quantization of register tiles for fused kernels; `rotary`, `rms_norm`: the model's rotary
embeddings and QK-norm in one pass each (model kernels, no MX numerics). Importing this package imports Triton;
mxlab.numerics.quant imports it only when the Triton backend runs. Under TRITON_INTERPRET=1 (set before
the import) the kernels also run on CPU tensors.
"""
from mxlab.kernels import cast
from mxlab.kernels.cast import *  # noqa: F401,F403  (the public cast API)

__all__ = list(cast.__all__)
