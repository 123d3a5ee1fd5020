"""Jagged flash attention in Triton, forward and backward, with exact MX emulation of QK^T and PV.

`jagged_attention(q, k, v, q_offsets, k_offsets, causal=..., activation=..., policy=..., seeds=...)`
computes what `mxlab.nn.attention.JaggedAttention` computes (same layout, same masks, same
normalisation, same quantized operands) without padding and without a materialized score
matrix. Queries are ``(total_q, heads, head_dim)``, keys and values ``(total_k, heads,
head_dim)``, example ``i`` owns ``q[q_offsets[i]:q_offsets[i+1]]`` and
``k[k_offsets[i]:k_offsets[i+1]]``; self-attention passes the same offsets twice,
cross-attention and pooled (PMA) attention pass short query runs against long key runs.

Semantics (equal to the reference, `JaggedAttention` with ``backend="reference"``):

- ``S = Q K^T`` accumulated in float32 and rounded to the input dtype, then ``s = S * head_dim**-0.5``
  in float32; softmax over the example's own (and, causal, earlier) keys with float32 statistics,
  or ``silu(s) / n_keys`` with ``n_keys`` the example's number of keys (masked entries are 0).
- An example without keys gets exact zeros; an example without queries contributes nothing
  (its keys and values get zero gradients).
- MX mode (``policy`` with ``qk`` and ``pv`` MatmulPrecisions, as `mxlab.recipe` builds them):
  every operand of the six products is fake-quantized inside the kernel, in blocks of 32 that
  restart at each example's first key / first query, exactly as `qmatmul` quantizes them in the
  reference's padded layout:

  | product | operand blocks run along |
  |---|---|
  | S = Q K^T | Q: head dim (qk.fwd.a), K: head dim (qk.fwd.b) |
  | O = P V | P (softmax: relative to the running maximum, see below): keys (pv.fwd.a), V: keys (pv.fwd.b) |
  | dP = dO V^T | dO: head dim (pv.grad_a.a), V: head dim (pv.grad_a.b) |
  | dV = P^T dO | P (normalized): queries (pv.grad_b.a), dO: queries (pv.grad_b.b) |
  | dQ = dS K | dS: keys (qk.grad_a.a), K: keys (qk.grad_a.b) |
  | dK = dS^T Q | Q: queries (qk.grad_b.a), dS: queries (qk.grad_b.b) |

  Every operand takes the recipe's scale mode and rounding. Stochastic rounding draws its bits from
  layout-independent counters (docs/numerics.md, "Jagged attention"), the same ones the reference
  path uses: Q, K, V, dO elements count by their linear index in the packed (tokens, heads,
  head_dim) tensor, P and dS elements by (key index within the sequence) * 2^32 + query row *
  heads + head; each operand's seed is its seed slot (mxlab.numerics.seeding.SEED_SLOTS) of the product's
  seeds for the call, which the caller draws (`seeds=`; mxlab.nn.attention draws `next_call_seeds()` once
  per product per call). e4m3/e5m2 operands with nearest-even rounding convert with
  the GPU's FP8 instructions on sm_90+ (`mxlab.kernels._mx_device`), bit-identical to the integer steps.

  MX softmax runs in one pass over the keys, as hardware MX attention kernels do (the contract in
  docs/numerics.md, "Jagged attention"): in blocks of 32 keys from each sequence's first key, block t's
  P~ = exp(s - m_t), with m_t the running row maximum up to and including block t, is quantized along the
  keys and multiplied by quant(V); the float32 accumulator is rescaled by exp(m_(t-1) - m_t) as the
  maximum moves and divided by the softmax sum at the end (the sum of the unquantized P~). The forward
  key tile is therefore 32 (`tiles.mx_tiles_problem`). The backward recomputes the normalized P from the
  saved statistics (its dV operand), and the softmax row term is rowsum(dO * O) with O the output as
  returned, in both modes (in MX mode summed in the launch that quantizes dO). dS is the gradient of the
  rounded S, i.e. rounded to the input dtype after the scale. Q, K, V and dO are fake-quantized into
  bfloat16 copies, one per orientation needed, each orientation in its own launch: along the head dim by the
  cast kernels' row fake-quantize, along the tokens by `_prequantize` (blocks of 32 tokens from each
  sequence's first token; with dO it also sums the row term). The copies live only inside
  the forward or the backward that reads them: the backward keeps exactly what BF16 mode keeps (Q, K, V,
  the output, the softmax statistics) and quantizes Q, K and V again (the same seeds, the same bits).
  P and dS are quantized inside the attention kernels. Quantized values are exact in bfloat16, so every
  product is an exact bfloat16 tensor-core product with float32 accumulation: the kernel and the reference
  differ only in the order of float32 accumulation (tiles, the softmax sum, the row term) and the rounding
  of the running rescale factors.
- Inputs are bfloat16 or float16; float32 too in MX mode (then S and the gradients are not rounded,
  as in the reference).
- BF16 mode (``policy=None``): the usual flash-attention algorithm: softmax P is rounded to the
  input dtype before normalisation (the reference rounds it after), and the backward's row
  term is ``rowsum(dO * O)``; SiLU is exact as above.

Modules: `device` (device helpers and the pre-quantization kernel), `kernels` (the three attention kernels),
`tiles` (tile sizes, tile tables), `codes` (operand codes, seed keys, what the kernels refuse), `launch` (the
smaller launches), `autograd` (the autograd function), `api` (the entry points).

Host side: the kernels' tile tables (`tiles._tiles`) are cached on the offsets tensors themselves
(a Python attribute), valid while neither the offsets nor the tensor that orders the tiles is
changed in place; layers that share offsets, and the backward, compute them once. Changing
the offsets in place between a forward and its backward is refused (RuntimeError), as autograd
refuses it for saved tensors.

Refused (`unsupported_reason` says why; the caller falls back to the reference): (32, 32) blocks,
per-tensor FP8 or high-precision operands inside an MX policy, per-layer gradient scaling,
head dims that are not a power of two in [16, 256] (MX: >= 32). An installed GEMM observer
(`mxlab.recipe.diagnostics`) sees no kernel products: a sampled step runs the same kernel as every
other step, so sampling neither changes the training numerics nor needs the reference's memory.
"""

from mxlab.kernels.attention.api import (
    AttentionLaunch,
    check_jagged_offsets,
    jagged_attention,
    jagged_attention_checked,
)
from mxlab.kernels.attention.codes import unsupported_reason
from mxlab.kernels.attention.tiles import (
    DEFAULT_MX_TILES,
    DEFAULT_TILES,
    INTERPRETER_TILES,
    TileSizes,
    default_tiles,
    mx_tiles_problem,
)

__all__ = [
    "AttentionLaunch",
    "DEFAULT_MX_TILES",
    "DEFAULT_TILES",
    "INTERPRETER_TILES",
    "TileSizes",
    "check_jagged_offsets",
    "default_tiles",
    "jagged_attention",
    "jagged_attention_checked",
    "mx_tiles_problem",
    "unsupported_reason",
]
