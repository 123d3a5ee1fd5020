"""Attention over jagged (variable-length) sequences, with both products reachable by a recipe.

`JaggedAttention` takes queries and keys/values packed along the token axis, one run of
tokens per example, and never lets the tokens of one example see those of another.

Layout. ``q`` is ``(total_q, heads, head_dim)``, ``k`` and ``v`` are ``(total_k, heads,
head_dim)``; example ``i`` owns queries ``q[q_offsets[i]:q_offsets[i+1]]`` and keys
``k[k_offsets[i]:k_offsets[i+1]]``. Self-attention passes the same offsets twice;
cross-attention (a few queries per example against a long history) passes different ones.

Computation (the reference). Sequences are grouped into buckets by length (powers of two,
everything up to ``min_bucket_length`` in one bucket), so padding stays below 2x of the real
work; each bucket is gathered into a padded ``(n, heads, L, head_dim)`` layout in which padding
entries are exact zeros, and

- ``S = qmatmul(Q, K^T, policy.qk)`` then, in float32, ``S * head_dim**-0.5``;
- ``softmax``: ``P = softmax(S)`` over the example's own keys (statistics in float32; padding
  keys get probability exactly 0);
- ``silu``: ``P = silu(S) / n_keys`` with ``n_keys`` the example's number of keys (HSTU style
  normalisation by sequence length; padding keys get exactly 0);
- ``out = qmatmul(P, V, policy.pv)``: P is quantized inside the product, in blocks along the key
  axis; in the padded layout each example's key axis starts at its own first key, so a block
  never mixes two examples. MX softmax (softmax with a pv precision) follows the one-pass contract of
  hardware MX attention kernels instead (`_one_pass_softmax_output`; docs/numerics.md, "Jagged
  attention"): each block of 32 keys quantizes P relative to the running row maximum, and the
  backward's softmax row term is rowsum(dO * out).

Stochastic rounding (a policy with a stochastically rounded MX operand) does not use qmatmul's
counter (an element's index in the padded, bucketed tensor) but layout-independent ones
(`token_counter`, `score_counter`; docs/numerics.md, "Jagged attention"), through
`qmatmul(..., counters=, seeds=)`, with one `next_call_seeds()` per product per call for every bucket and chunk
(`call_seeds`): the bits depend neither on the buckets nor on the chunking, and the Triton kernel, handed the
same seeds, draws the same.

``causal=True`` lets query ``j`` of an example see its keys ``0..j`` only; it needs each example
to have as many queries as keys. An example with no keys (an empty history) gets an output of
exact zeros; an example with no queries contributes nothing.

With ``policy is None`` both products are plain ``torch.matmul`` (``qmatmul`` is not even
imported).

Backends (``backend="auto"``): on CUDA, the Triton kernel `mxlab.kernels.attention`
(no padding, no materialized score matrix, the same semantics with MX operands quantized
inside the kernel) whenever its `unsupported_reason` is None (BF16/FP16 inputs, or an MX policy
with 1-D blocks of 32, any scale mode and rounding, power-of-two head dims; an installed GEMM
observer sees no kernel products, see `mxlab.recipe.diagnostics`); otherwise,
with ``policy is None`` and softmax, FlexAttention per bucket (compiled, fused) with a
per-example length mask; everything else, and every CPU tensor, uses the reference. Under torch.compile all three
run outside the graph (a graph break, eager mode's bits): the reference reads its buckets and widths on the host,
which a graph would specialize on, recompiling for nearly every batch of new history lengths.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mxlab.nn.flex import flex_attention_fn, flex_available, length_block_mask
from mxlab.numerics.jagged_checks import ACTIVATIONS, check_attention_inputs, check_offsets_layout, check_offsets_values
from mxlab.numerics.quant import kernel_module

BACKENDS = ("auto", "reference", "flex", "triton")


def _triton_kernel() -> Any:
    """The package mxlab.kernels.attention, or None when Triton is not installed."""
    return kernel_module("attention")


def _triton_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Any, activation: str) -> str | None:
    """Why the Triton jagged-attention kernel cannot run these inputs, or None when it can."""
    kernel = _triton_kernel()
    if kernel is None:
        return "the Triton kernels (mxlab.kernels) are not available"
    if not (q.dtype == k.dtype == v.dtype):
        return f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[0] == 0 or k.shape[0] == 0:
        return "no queries or no keys in the batch"
    return kernel.unsupported_reason(q, policy, activation)


@torch._disable_dynamo  # torch.compiler.disable, importing torch._dynamo at the first call
def _kernel_attention(q, k, v, q_offsets, k_offsets, causal: bool, activation: str, policy: Any) -> torch.Tensor:
    """The Triton kernel's output. Outside any compiled graph: its offset checks and tile tables live on the offsets
    tensors (checked once per tensor and version, a host sync) and its seeds are drawn on the host per call."""
    kernel = _triton_kernel()
    kernel.check_jagged_offsets(q_offsets, k_offsets, q.shape[0], k.shape[0], q.device, causal)
    return kernel.jagged_attention_checked(
        q, k, v, q_offsets, k_offsets, causal=causal, activation=activation, policy=policy, seeds=call_seeds(policy)
    )


@torch._disable_dynamo  # torch.compiler.disable, importing torch._dynamo at the first call
def _eager_forward(module, q, k, v, q_offsets, k_offsets, causal: bool, activation: str) -> torch.Tensor:
    """`module.forward` (the reference or FlexAttention) run outside any compiled graph: it reads the offsets on the
    host and loops over length buckets, which a graph would specialize on (a recompile for every new set of bucket
    widths, i.e. nearly every batch of jagged histories); eager, it keeps eager mode's bits."""
    return module.forward(q, k, v, q_offsets, k_offsets, causal=causal, activation=activation)


def _check_offsets(name: str, offsets: torch.Tensor, total: int) -> None:
    check_offsets_layout(name, offsets)
    check_offsets_values(name, offsets, total)


def _bucket_ids(lengths: torch.Tensor, min_bucket_length: int) -> torch.Tensor:
    """Bucket index per example: 0 for lengths <= min_bucket_length, then one per power of two."""
    ratio = lengths.clamp(min=1).double() / float(min_bucket_length)
    return torch.ceil(torch.log2(ratio.clamp(min=1.0))).long()


def _gather_padded(
    x: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather rows x[start:start+len] of each example into (n, heads, width, dim), zeros in padding.

    Returns the padded tensor, the validity mask (n, width) and the flat source index (n, width).
    """
    position = torch.arange(width, device=x.device)
    valid = position[None, :] < lengths[:, None]
    index = torch.where(valid, starts[:, None] + position[None, :], torch.zeros_like(starts)[:, None])
    if x.shape[0] == 0:
        padded = x.new_zeros(lengths.shape[0], width, *x.shape[1:])
    else:
        # index_select, not x[index]: its backward is an index_add, several times faster on a CPU than the
        # accumulating index_put of advanced indexing (each source row is taken once; padding adds zeros)
        gathered = x.index_select(0, index.flatten()).view(*index.shape, *x.shape[1:])
        padded = gathered * valid[:, :, None, None].to(x.dtype)
    return padded.transpose(1, 2), valid, index


class JaggedAttention(nn.Module):
    """Multi-head attention over packed jagged sequences; no parameters.

    Attributes: ``policy`` (None = high precision; otherwise an object with attributes ``qk``
    and ``pv``, the precisions handed to ``mxlab.nn.qmatmul.qmatmul`` for the two products),
    ``backend`` ("auto": see the module docstring; "reference"; "flex": FlexAttention wherever
    it runs, for cross-checks; "triton": the Triton kernel, refused when it cannot run the
    inputs), ``min_bucket_length`` and ``max_scores_per_chunk`` (bounds on padding and on
    the size of one materialized score tensor in the reference).
    """

    def __init__(self, backend: str = "auto", min_bucket_length: int = 16, max_scores_per_chunk: int = 1 << 26) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; accepted: {', '.join(BACKENDS)}")
        if min_bucket_length < 1 or max_scores_per_chunk < 1:
            raise ValueError(
                f"min_bucket_length ({min_bucket_length}) and "
                f"max_scores_per_chunk ({max_scores_per_chunk}) must be positive"
            )
        self.backend = backend
        self.min_bucket_length = int(min_bucket_length)
        self.max_scores_per_chunk = int(max_scores_per_chunk)
        self.policy: Any = None

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}, policy={self.policy!r}"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_offsets: torch.Tensor,
        k_offsets: torch.Tensor,
        *,
        causal: bool = False,
        activation: str = "softmax",
    ) -> torch.Tensor:
        """Return the attention output, shape (total_q, heads, head_dim), dtype of q.

        Refuses (ValueError) an unknown activation, mismatched shapes or offsets, and
        ``causal=True`` when an example has a different number of queries and keys.
        """
        check_attention_inputs(q, k, v, activation)
        if self.backend == "triton" or (self.backend == "auto" and q.is_cuda):
            reason = _triton_unsupported(q, k, v, self.policy, activation)
            if reason is None and not (q_offsets.device == k_offsets.device == q.device):
                reason = f"offsets on {q_offsets.device}/{k_offsets.device}, tensors on {q.device}"
            if reason is None:
                return _kernel_attention(q, k, v, q_offsets, k_offsets, causal, activation, self.policy)
            if self.backend == "triton":
                raise ValueError(f"the Triton attention backend cannot run these inputs: {reason}")
        if torch.compiler.is_compiling():  # the buckets below are read on the host: eager, as the kernel runs
            return _eager_forward(self, q, k, v, q_offsets, k_offsets, causal, activation)
        _check_offsets("q_offsets", q_offsets, q.shape[0])
        _check_offsets("k_offsets", k_offsets, k.shape[0])
        if q_offsets.numel() != k_offsets.numel():
            raise ValueError(
                f"q_offsets ({q_offsets.numel()}) and k_offsets ({k_offsets.numel()}) describe different batch sizes"
            )
        q_lengths = q_offsets[1:] - q_offsets[:-1]
        k_lengths = k_offsets[1:] - k_offsets[:-1]
        if causal and bool((q_lengths != k_lengths).any()):
            raise ValueError("causal attention needs as many queries as keys in every example")

        use_flex = (
            activation == "softmax"
            and self.policy is None
            and (self.backend == "flex" or (self.backend == "auto" and q.is_cuda and flex_available()))
        )
        out = q.new_zeros(q.shape)
        if q.shape[0] == 0:
            return out
        # Stochastic rounding counts elements by where they are in the packed tensors (see
        # `token_counter`, `score_counter`), with one set of seeds per call, whatever the buckets and chunks.
        seeds = call_seeds(self.policy)
        if seeds is not None and q.shape[0] * q.shape[1] >= 1 << 32:
            raise ValueError(
                "stochastic rounding of the scores counts query rows "
                f"x heads in 32 bits; got {q.shape[0]} x {q.shape[1]}"
            )
        lengths = torch.maximum(q_lengths, k_lengths)
        buckets = _bucket_ids(lengths, self.min_bucket_length)
        active = q_lengths > 0
        destinations, results = [], []
        for bucket in torch.unique(buckets[active]).tolist():
            members = torch.nonzero(active & (buckets == bucket)).flatten()
            q_width = int(q_lengths[members].max())
            k_width = max(int(k_lengths[members].max()), 1)
            per_example = q.shape[1] * q_width * k_width
            chunk = max(1, self.max_scores_per_chunk // per_example)
            for start in range(0, members.numel(), chunk):
                index = members[start : start + chunk]
                qp, q_valid, q_index = _gather_padded(q, q_offsets[index], q_lengths[index], q_width)
                kp, k_valid, k_index = _gather_padded(k, k_offsets[index], k_lengths[index], k_width)
                vp, _, _ = _gather_padded(v, k_offsets[index], k_lengths[index], k_width)
                if use_flex:
                    op = self._flex_padded(qp, kp, vp, q_lengths[index], k_lengths[index], causal)
                else:
                    counted = None if seeds is None else _Counted(seeds, q_index, k_index, q.shape[1], q.shape[2])
                    op = self._reference_padded(
                        qp, kp, vp, q_valid, k_valid, k_lengths[index], causal, activation, counted
                    )
                results.append(op.transpose(1, 2)[q_valid])
                destinations.append(q_index[q_valid])
        if not results:
            return out
        return out.index_copy(0, torch.cat(destinations), torch.cat(results).to(q.dtype))

    def _reference_padded(
        self,
        qp: torch.Tensor,
        kp: torch.Tensor,
        vp: torch.Tensor,
        q_valid: torch.Tensor,
        k_valid: torch.Tensor,
        k_lengths: torch.Tensor,
        causal: bool,
        activation: str,
        counted: _Counted | None = None,
    ) -> torch.Tensor:
        """Padded (n, H, Lq, D) attention. P is exactly 0 in padding rows and columns, so padding
        never enters a quantization block's amax (also in the backward products, whose blocks run
        along the query axis); padding query outputs are discarded by the caller. `counted`: the
        call's seeds and the chunk's token rows, for policies with stochastic rounding."""
        qk_precision = self.policy.qk if self.policy is not None else None
        pv_precision = self.policy.pv if self.policy is not None else None
        scale = qp.shape[-1] ** -0.5
        qk_counted: dict[str, Any] = {}
        pv_counted: dict[str, Any] = {}
        if counted is not None:
            q_counter, k_counter, s_counter = (
                counted.token(counted.q_rows),
                counted.token(counted.k_rows),
                counted.scores(),
            )
            qk_counted = dict(counters=(q_counter, k_counter.transpose(-1, -2), s_counter), seeds=counted.seeds[0])
            pv_counted = dict(counters=(s_counter, k_counter, q_counter), seeds=counted.seeds[1])
        scores = self._product(qp, kp.transpose(-1, -2), qk_precision, **qk_counted).float() * scale
        allowed = k_valid[:, None, None, :] & q_valid[:, None, :, None]
        if causal:
            lq, lk = scores.shape[-2], scores.shape[-1]
            allowed = allowed & torch.ones(lq, lk, dtype=torch.bool, device=scores.device).tril()
        if activation == "softmax":
            masked = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
            row_max = masked.amax(dim=-1, keepdim=True).detach()
            weights = torch.exp(masked - row_max) * allowed
            denominator = weights.sum(dim=-1, keepdim=True)
            denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
            if pv_precision is not None:  # P is quantized: the one-pass contract
                return _one_pass_softmax_output(
                    masked.detach(), allowed, weights, denominator, vp, pv_precision, **pv_counted
                )
            probabilities = weights / denominator
        else:
            n_keys = k_lengths.clamp(min=1).to(torch.float32)[:, None, None, None]
            probabilities = torch.where(allowed, F.silu(scores), torch.zeros_like(scores)) / n_keys
        if self.policy is None:
            return torch.matmul(probabilities.to(vp.dtype), vp)
        return self._product(probabilities, vp.to(probabilities.dtype), pv_precision, **pv_counted)

    def _product(self, a: torch.Tensor, b: torch.Tensor, precision: Any, **counted: Any) -> torch.Tensor:
        """a @ b: plain matmul without a policy, else through qmatmul at `precision` (`counted`: its
        stochastic-rounding `counters` and `seeds`, for policies that round stochastically)."""
        if self.policy is None:
            return torch.matmul(a, b)
        from mxlab.nn.qmatmul import qmatmul

        return qmatmul(a, b, precision, **counted)

    def _flex_padded(
        self,
        qp: torch.Tensor,
        kp: torch.Tensor,
        vp: torch.Tensor,
        q_lengths: torch.Tensor,
        k_lengths: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        """Padded softmax attention through FlexAttention with a per-example length mask."""

        def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            keep = (kv_idx < k_lengths[b]) & (q_idx < q_lengths[b])
            if causal:
                keep = keep & (kv_idx <= q_idx)
            return keep

        block_mask = length_block_mask(q_lengths, k_lengths, qp.shape[2], kp.shape[2], causal, mask_mod)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return flex_attention_fn(qp.device)(qp, kp, vp, block_mask=block_mask, scale=qp.shape[-1] ** -0.5)


def _one_pass_softmax_output(
    masked: torch.Tensor,
    allowed: torch.Tensor,
    weights: torch.Tensor,
    denominator: torch.Tensor,
    vp: torch.Tensor,
    precision: Any,
    counters: tuple | None = None,
    seeds: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """MX softmax attention's output, (n, H, Lq, D) float32 holding values of vp's dtype, as the one-pass
    contract defines it (docs/numerics.md, "Jagged attention"), in the padded layout.

    Forward: the keys of each row run in blocks of 32 from the sequence's first key; block t's
    P~ = exp(s - m_t), with m_t the running row maximum over blocks 0..t, is quantized along the keys
    (pv.fwd.a) and multiplied by quant(V) of the block (pv.fwd.b); out = sum_t exp(m_t - m) P~_t V_t / l
    with m, l the row's maximum and sum, rounded to vp's dtype. Backward (autograd): dP and dV are the
    gradients of qmatmul(P, V) with P = weights / l the normalized probabilities, and the softmax row term
    is rowsum(dO * out), the output as returned: `out * (l / l)` (value 1) sends -rowsum(dO * out) / l into
    l, where plain autograd of softmax would take rowsum(P * dP). `masked`: float32 scores, the lowest
    float32 where not allowed, detached; `weights`: exp(s - m) where allowed (the gradient path); `counters`
    (of P, V and the output gradient) and `seeds`: the PV product's, as qmatmul takes them (seeds None: this
    call draws them)."""
    from mxlab.nn import qmatmul as qmatmul_module

    n, heads, queries, keys = masked.shape
    seeds = precision.next_call_seeds() if seeds is None else seeds
    through = None  # the gradient path (no observer sees it: its value is replaced); without gradients, exactly 0
    if torch.is_grad_enabled() and (weights.requires_grad or vp.requires_grad):
        previous = qmatmul_module.set_gemm_observer(None)
        try:
            through = qmatmul_module.qmatmul(
                weights / denominator.detach(), vp.float(), precision, counters=counters, seeds=seeds
            )
        finally:
            qmatmul_module.set_gemm_observer(previous)

    extra = -keys % 32
    blocks = (keys + extra) // 32
    masked = F.pad(masked, (0, extra), value=torch.finfo(torch.float32).min).view(n, heads, queries, blocks, 32)
    allowed = F.pad(allowed.expand(n, heads, queries, keys), (0, extra), value=False).view(
        n, heads, queries, blocks, 32
    )
    running = masked.amax(dim=-1).cummax(dim=-1).values  # (n, H, Lq, blocks)
    p_tilde = (torch.exp(masked - running[..., None]) * allowed).permute(0, 1, 3, 2, 4)  # (n, H, blocks, Lq, 32)
    v_blocks = F.pad(vp.float(), (0, 0, 0, extra)).view(n, heads, blocks, 32, vp.shape[-1])
    block_counters = (None, None)
    if counters is not None:
        block_counters = (
            F.pad(counters[0], (0, extra)).view(n, heads, queries, blocks, 32).permute(0, 1, 3, 2, 4),
            F.pad(counters[1], (0, 0, 0, extra)).view(n, heads, blocks, 32, vp.shape[-1]),
        )
    products = qmatmul_module.forward_product(p_tilde, v_blocks, precision, seeds=seeds, counters=block_counters)
    factor = torch.exp(running - running[..., -1:]).permute(0, 1, 3, 2)[..., None]  # (n, H, blocks, Lq, 1)
    value = (products * factor).sum(dim=2) / denominator.detach()
    value = value if through is None else value + (through - through.detach())  # qmatmul(P, V)'s gradients
    out = value.to(vp.dtype)  # the contract's value
    return out.float() * (denominator.detach() / denominator)


# ---------------------------------------------------------------------------------------------
# Stochastic rounding with layout-independent counters (docs/numerics.md, "Jagged attention").


def rounds_stochastically(policy: Any) -> bool:
    """Whether any operand of the attention policy's products (MatmulPrecisions) is MX with stochastic rounding."""
    for precision in (getattr(policy, "qk", None), getattr(policy, "pv", None)):
        gemms = [getattr(precision, name, None) for name in ("fwd", "grad_a", "grad_b")]
        if any(
            getattr(operand, "block_scaled", False) and operand.rounding == "stochastic"
            for gemm in gemms
            for operand in (getattr(gemm, "a", None), getattr(gemm, "b", None))
        ):
            return True
    return False


def call_seeds(policy: Any) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None:
    """Seeds of one attention call, per product (qk, pv): `next_call_seeds()` once each (advancing each product's
    call counter; None for a product without a precision), or None when no operand rounds stochastically
    (no counter advances). The reference path and the Triton kernel take the same seeds."""
    if policy is None or not rounds_stochastically(policy):
        return None
    return tuple(None if precision is None else precision.next_call_seeds() for precision in (policy.qk, policy.pv))  # type: ignore[return-value]


def token_counter(rows: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Stochastic-rounding counters (int64, (n, heads, L, head_dim)) of a padded gather of a packed
    (tokens, heads, head_dim) tensor whose rows (n, L) come from the packed rows `rows`: each element's
    linear index in the packed tensor, (row * heads + head) * head_dim + d."""
    head = torch.arange(heads, device=rows.device)[None, :, None, None]
    d = torch.arange(head_dim, device=rows.device)[None, None, None, :]
    return (rows[:, None, :, None] * heads + head) * head_dim + d


def score_counter(query_rows: torch.Tensor, heads: int, keys: int) -> torch.Tensor:
    """Stochastic-rounding counters (int64, (n, heads, Lq, keys)) of scores-shaped operands (P, dS) for
    queries from the packed rows `query_rows` (n, Lq): key * 2^32 + query_row * heads + head, with key the
    key's index within its sequence (query_row * heads + head < 2^32)."""
    head = torch.arange(heads, device=query_rows.device)[None, :, None, None]
    key = torch.arange(keys, device=query_rows.device)[None, None, None, :]
    return (key << 32) + query_rows[:, None, :, None] * heads + head


class _Counted:
    """One chunk's inputs to the counted products: the call's seeds (qk, pv) and the packed rows of its
    padded queries and keys (n, Lq), (n, Lk)."""

    def __init__(self, seeds: tuple, q_rows: torch.Tensor, k_rows: torch.Tensor, heads: int, head_dim: int) -> None:
        self.seeds, self.q_rows, self.k_rows, self.heads, self.head_dim = seeds, q_rows, k_rows, heads, head_dim

    def token(self, rows: torch.Tensor) -> torch.Tensor:
        return token_counter(rows, self.heads, self.head_dim)

    def scores(self) -> torch.Tensor:
        return score_counter(self.q_rows, self.heads, self.k_rows.shape[1])


__all__ = [
    "JaggedAttention",
    "call_seeds",
    "rounds_stochastically",
    "token_counter",
    "score_counter",
    "ACTIVATIONS",
    "BACKENDS",
]
