"""Emulated forms of PyTorch's functional GEMMs, for GEMM sites reached without a module swap (mxlab.recipe.sites).

Each takes the operands the PyTorch op takes and a `MatmulPrecision` (or, for attention, one per product) and runs
its products through `mxlab.nn.qmatmul.qmatmul`: the numerics contract of QLinear (forward, grad of each operand;
blocks of 32 along the contraction dimension, zero-padded; float32 accumulation; autocast's casts first). A shape
the emulation cannot take raises `UnsupportedGemm` with the reason; nothing is run in high precision silently.
"""

from __future__ import annotations

import math

import torch

from mxlab.nn.qmatmul import MatmulPrecision, qmatmul


class UnsupportedGemm(ValueError):
    """A GEMM the emulation cannot take (its reason in the message)."""


def _autocast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The operands in autocast's dtype where autocast is on for their device (as autocast casts a GEMM's)."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


def product(a: torch.Tensor, b: torch.Tensor, precision: MatmulPrecision) -> torch.Tensor:
    """torch.matmul(a, b) (mm, bmm, @) emulated: a (..., M, K) and b (..., K, N) with equal batch dims, or a 2-D b.
    Refuses (UnsupportedGemm) 1-D operands and batch dims that would broadcast."""
    if a.dim() < 2 or b.dim() < 2:
        raise UnsupportedGemm(f"a 1-D operand (shapes {tuple(a.shape)} @ {tuple(b.shape)}): a vector product")
    if b.dim() > 2 and a.shape[:-2] != b.shape[:-2]:
        raise UnsupportedGemm(f"batch dims that broadcast ({tuple(a.shape)} @ {tuple(b.shape)})")
    a, b = _autocast(a, b)
    return qmatmul(a, b, precision)


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, precision: MatmulPrecision, **scalars) -> torch.Tensor:
    """torch.addmm / baddbmm (beta = alpha = 1): a (N,) bias enters the float32 accumulator as nn.Linear's does;
    another bias is added to the rounded product. Refuses other beta, alpha."""
    if any(scalars.get(key, 1) != 1 for key in ("beta", "alpha")):
        raise UnsupportedGemm(f"beta/alpha other than 1 ({scalars})")
    if a.dim() == 2 and b.dim() == 2 and bias.dim() == 1 and bias.shape[0] == b.shape[1]:
        a, b, bias = _autocast(a, b, bias)
        return qmatmul(a, b, precision, bias=bias)
    out = product(a, b, precision)
    return out + bias.to(out.dtype)


def _einsum_plan(equation: str, a: torch.Tensor, b: torch.Tensor) -> tuple[list[str], ...]:
    """(batch, free of a, contracted, free of b, output) index letters of a two-operand einsum; refuses the rest."""
    equation = equation.replace(" ", "")
    if "..." in equation or "->" not in equation:
        raise UnsupportedGemm(f"einsum {equation!r}: needs explicit output indices and no ellipsis")
    inputs, out = equation.split("->")
    names = inputs.split(",")
    if len(names) != 2:
        raise UnsupportedGemm(f"einsum {equation!r}: only products of two operands are emulated")
    sa, sb = names
    if len(set(sa)) != len(sa) or len(set(sb)) != len(sb) or len(sa) != a.dim() or len(sb) != b.dim():
        raise UnsupportedGemm(f"einsum {equation!r}: repeated indices or a rank that does not match")
    batch = [c for c in out if c in sa and c in sb]
    contracted = [c for c in sa if c in sb and c not in out]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    if not contracted or any(c not in out for c in free_a + free_b):
        raise UnsupportedGemm(f"einsum {equation!r}: no contracted index, or an index summed in one operand only")
    for c in batch + contracted:
        if a.shape[sa.index(c)] != b.shape[sb.index(c)]:
            raise UnsupportedGemm(f"einsum {equation!r}: index {c!r} broadcasts")
    return batch, free_a, contracted, free_b, list(out), list(sa), list(sb)


def einsum(equation: str, a: torch.Tensor, b: torch.Tensor, precision: MatmulPrecision) -> torch.Tensor:
    """torch.einsum(equation, a, b) emulated as one batched product: a's indices become (batch, M, K), b's
    (batch, K, N), with the contracted indices flattened into K in a's order (blocks of 32 along that K)."""
    batch, free_a, contracted, free_b, out, sa, sb = _einsum_plan(equation, a, b)
    size = {c: a.shape[i] for i, c in enumerate(sa)} | {c: b.shape[i] for i, c in enumerate(sb)}

    def count(letters: list[str]) -> int:
        return math.prod(size[c] for c in letters)

    lead = [count(batch)] if batch else []
    left = a.permute([sa.index(c) for c in batch + free_a + contracted]).reshape(
        *lead, count(free_a), count(contracted)
    )
    right = b.permute([sb.index(c) for c in batch + contracted + free_b]).reshape(
        *lead, count(contracted), count(free_b)
    )
    result = product(left, right, precision).reshape(*[size[c] for c in batch + free_a + free_b])
    order = batch + free_a + free_b
    return result.permute([order.index(c) for c in out])


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    qk: MatmulPrecision | None,
    pv: MatmulPrecision | None,
) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=, scale=) (no dropout) with QK^T under `qk` and
    PV under `pv` (None: a plain matmul), PV by the one-pass MX softmax contract of JaggedAttention
    (docs/numerics.md, "Jagged attention"): keys in blocks of 32 from the first key. A boolean mask marks the
    keys taken, a float mask is added to the scores, `is_causal` keeps the lower triangle (top-left aligned).
    A query with no key allowed gets zeros (PyTorch: NaN). Refuses (UnsupportedGemm) q, k, v whose batch
    dims differ (grouped-query attention, broadcasting)."""
    from mxlab.nn.attention import _one_pass_softmax_output

    if q.dim() < 2 or k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise UnsupportedGemm(f"q, k, v batch dims differ ({tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)})")
    q, k, v = _autocast(q, k, v)
    out_dtype = q.dtype
    lead, queries, keys = q.shape[:-2], q.shape[-2], k.shape[-2]
    n = math.prod(lead)
    q4, k4, v4 = (t.reshape(n, 1, t.shape[-2], t.shape[-1]) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with torch.autocast(device_type=q.device.type, enabled=False):
        k_t = k4.transpose(-1, -2)
        scores = (torch.matmul(q4, k_t) if qk is None else qmatmul(q4, k_t, qk)).float() * scale
        allowed = torch.ones(queries, keys, dtype=torch.bool, device=q.device)
        if is_causal:
            allowed = allowed.tril()
        allowed = allowed.expand(n, 1, queries, keys)
        if attn_mask is not None:
            mask = attn_mask.expand(*lead, queries, keys).reshape(n, 1, queries, keys)
            if mask.dtype == torch.bool:
                allowed = allowed & mask
            else:
                allowed = allowed & (mask != float("-inf"))
                scores = scores + mask.float()
        masked = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
        row_max = masked.amax(dim=-1, keepdim=True).detach()
        weights = torch.exp(masked - row_max) * allowed
        denominator = weights.sum(dim=-1, keepdim=True)
        denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        if pv is not None:
            out = _one_pass_softmax_output(masked.detach(), allowed, weights, denominator, v4, pv)
        else:
            out = torch.matmul((weights / denominator).to(v4.dtype), v4)
    return out.to(out_dtype).reshape(*lead, queries, v.shape[-1])


__all__ = ["UnsupportedGemm", "addmm", "attention", "einsum", "product"]
