"""Triton kernels (imported as mxlab.kernels); the MX ones follow mxlab.numerics.reference bit for bit.

`cast/`: the MX casts; `attention/`: jagged flash attention with MX operands; `_mx_device`: in-kernel
fake quantization of register tiles for fused kernels. `rotary`, `norms`: the model's rotary
embeddings, QK-norm (RMSNorm) and LayerNorm in one pass each (no MX numerics; they agree with PyTorch's
formulas to float32 rounding). Importing this package imports Triton; mxlab.numerics.quant imports it
only when the Triton backend runs. Under TRITON_INTERPRET=1 (set before the import) the kernels also
run on CPU tensors.
"""

from mxlab.kernels import cast
from mxlab.kernels.cast import *  # noqa: F401,F403  (the public cast API)

__all__ = list(cast.__all__)
