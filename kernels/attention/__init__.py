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
  | O = P V | P (normalized probabilities): keys (pv.fwd.a), V: keys (pv.fwd.b) |
  | dP = dO V^T | dO: head dim (pv.grad_a.a), V: head dim (pv.grad_a.b) |
  | dV = P^T dO | P: queries (pv.grad_b.a), dO: queries (pv.grad_b.b) |
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

  dS is the gradient of the rounded S, i.e. rounded to the input dtype after the scale. Q, K,
  V and dO are fake-quantized into bfloat16 copies, one per orientation needed, both
  orientations of a tensor from one read (`_prequantize`, blocks of 32 tokens from each
  sequence's first token). The copies live only inside the forward or the backward that reads
  them: the backward keeps what BF16 mode keeps (Q, K, V, the output, the softmax statistics)
  plus the float32 ``P @ quant(V)``, and quantizes Q, K and V again (the same seeds, the same
  bits). P and dS are quantized inside the attention kernels. The softmax P
  that is quantized is the normalized one, so the MX softmax forward takes two passes over the
  keys (statistics, then P and PV). The backward's row term ``sum_j P_ij dP_ij`` is
  ``sum_d quant(dO)_id (P @ quant(V))_id`` (both along the head dim, summed in the launch that
  quantizes dO), with ``P @ quant(V)`` accumulated in the forward from P split into two
  bfloat16 parts (relative error below 2^-16: the one approximation beyond accumulation order). Quantized
  values are exact in bfloat16, so every product is an exact bfloat16 tensor-core product with
  float32 accumulation: otherwise the kernel and the reference differ only in the order of
  float32 accumulation (tiles, the softmax denominator's sum).
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
from mxlab.kernels.attention.api import AttentionLaunch, check_jagged_offsets, jagged_attention, jagged_attention_checked
from mxlab.kernels.attention.codes import unsupported_reason
from mxlab.kernels.attention.tiles import DEFAULT_MX_TILES, DEFAULT_TILES, INTERPRETER_TILES, TileSizes, default_tiles

__all__ = [
    "AttentionLaunch", "DEFAULT_MX_TILES", "DEFAULT_TILES", "INTERPRETER_TILES", "TileSizes", "check_jagged_offsets",
    "default_tiles", "jagged_attention", "jagged_attention_checked", "unsupported_reason",
]
