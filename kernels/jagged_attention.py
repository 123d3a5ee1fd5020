"""Jagged flash attention in Triton, forward and backward, with exact MX emulation of QK^T and PV.

`jagged_attention(q, k, v, q_offsets, k_offsets, causal=..., activation=..., policy=...)`
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
  heads + head; each operand's seed is its qmatmul seed slot of the product's `next_call_seeds()`,
  drawn once per call (`_seed_keys`). e4m3/e5m2 operands with nearest-even rounding convert with
  the GPU's FP8 instructions on sm_90+ (`_mx_device`), bit-identical to the integer steps.

  dS is the gradient of the rounded S, i.e. rounded to the input dtype after the scale. Q, K,
  V and dO are fake-quantized once per call into bfloat16 copies, one per orientation needed,
  both orientations of a tensor from one read (`_prequantize`, blocks of 32 tokens from each
  sequence's first token; the forward also makes the backward's copies of Q and K when
  gradients are needed); P and dS are quantized inside the attention kernels. The softmax P
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

Host side: the kernels' tile tables (`_tiles`) are cached on the offsets tensors themselves
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
from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import torch
import triton
import triton.language as tl

from mxlab.numerics.formats import FORMATS
from mxlab.kernels._mx_device import ROUND_STOCHASTIC, fake_quant_tile, operand_code, score_random_bits, token_random_bits
from mxlab.kernels.mx_quant import _mix32_host, hardware_fp8_applies
from mxlab.nn.jagged_checks import ACTIVATIONS, check_attention_inputs, check_offsets_layout, check_offsets_values



def _interpreter_loop_bounds() -> None:
    """Let the Triton interpreter use loaded scalars as `range` bounds.

    The interpreter keeps scalars as one-element arrays and converts them with `int(array)`,
    which NumPy >= 2.4 refuses for arrays with ndim > 0; the kernels' loops end at lengths
    loaded from the offsets. Only runs under TRITON_INTERPRET=1; compiled kernels are unaffected.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_accepts_one_element_bounds", False):
        return

    def patch(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch._accepts_one_element_bounds = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


if os.environ.get("TRITON_INTERPRET", "0") == "1":
    _interpreter_loop_bounds()

_F32_LOWEST = tl.constexpr(-3.4028234663852886e38)  # a global used in @jit code must be a constexpr

# Benchmark-only ablations (`jagged_attention(..., _ablate=mask)`, MX mode): each bit removes one cost of the MX
# kernels and keeps their memory traffic and the rest of their work. The results are wrong by design; they exist
# so that `mxlab bench attention` can time what each part costs. 0 (the default) is the kernel itself.
ABLATE_P_QUANT = 1  # P is not fake-quantized (forward PV, dK/dV's P^T dO): P rounded to bfloat16 only
ABLATE_DS_QUANT = 2  # dS is not fake-quantized (dK/dV's dS^T Q, dQ's dS K): dS rounded to the input dtype only
ABLATE_STATISTICS_PASS = 4  # MX softmax forward in one pass: P from the running (not final) max and sum
ABLATE_P_SPLIT = 8  # the row term P @ quant(V) from the bfloat16-rounded P alone (one product, not two)
ABLATE_ROW_TERM = 16  # no row term P @ quant(V) in the forward (zeros are stored; dS then uses delta = 0)
ABLATE_PREQUANTIZE = 32  # no pre-quantization launches: Q, K, V, dO enter the kernels unquantized
ABLATIONS = {
    "no P quant": ABLATE_P_QUANT, "no dS quant": ABLATE_DS_QUANT, "one softmax pass": ABLATE_STATISTICS_PASS,
    "no P split": ABLATE_P_SPLIT, "no row term": ABLATE_ROW_TERM, "no prequantize": ABLATE_PREQUANTIZE,
}
_ALL_ABLATIONS = sum(ABLATIONS.values())
_A_P_QUANT = tl.constexpr(ABLATE_P_QUANT)  # the same bits as constexprs, for @jit code
_A_DS_QUANT = tl.constexpr(ABLATE_DS_QUANT)
_A_STATISTICS_PASS = tl.constexpr(ABLATE_STATISTICS_PASS)
_A_P_SPLIT = tl.constexpr(ABLATE_P_SPLIT)
_A_ROW_TERM = tl.constexpr(ABLATE_ROW_TERM)


# ----------------------------------------------------------------------------- device code
@triton.jit
def _maybe_quant(x, r24, ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, CODE: tl.constexpr, QUANT: tl.constexpr):
    """x (float32) fake-quantized along AXIS when QUANT (r24: random bits, see `_score_bits`), else x."""
    if QUANT:
        return fake_quant_tile(x, r24, ROWS, COLS, AXIS, CODE)
    else:
        return x


@triton.jit
def _score_bits(query_rows, head, keys, seed_key, CODE: tl.constexpr):
    """Random bits of the scores (query_rows x keys) of `head` for the operand CODE (the grid's second
    axis runs over the heads); 0 when CODE does not round stochastically."""
    if ((CODE >> 15) & 3) == ROUND_STOCHASTIC:
        return score_random_bits(query_rows, head, tl.num_programs(1), keys, seed_key)
    else:
        return 0


@triton.jit
def _token_bits(tokens, columns, width, seed_key, CODE: tl.constexpr):
    """Random bits of the elements (tokens x columns) of a packed (tokens, width) tensor for the operand
    CODE; 0 when CODE does not round stochastically."""
    if ((CODE >> 15) & 3) == ROUND_STOCHASTIC:
        return token_random_bits(tokens, columns, width, seed_key)
    else:
        return 0


@triton.jit
def _rne_bfloat16(x):
    """float32 x rounded to the nearest bfloat16 (ties to even) by integer ops, as float32."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def _round_to(x, DTYPE: tl.constexpr, BY_BITS: tl.constexpr):
    """float32 x rounded to DTYPE (nearest even), as float32. BY_BITS rounds bfloat16 with integer
    ops: the interpreter's float32 -> bfloat16 conversion truncates."""
    if BY_BITS and DTYPE == tl.bfloat16:
        return _rne_bfloat16(x)
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def _dot_operand(x, OP_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, BY_BITS: tl.constexpr):
    """float32 x rounded to OP_DTYPE, held in DOT_DTYPE (see `_scores`)."""
    if BY_BITS:
        return _round_to(x, OP_DTYPE, True).to(DOT_DTYPE)
    else:
        return x.to(OP_DTYPE).to(DOT_DTYPE)


@triton.jit
def _scores(q_dot, k_dot, sm_scale, S_DTYPE: tl.constexpr, BY_BITS: tl.constexpr):
    """s = float32(round_to_input_dtype(Q K^T)) * scale, as the reference rounds the product.

    Dot operands are rounded to OP_DTYPE (bfloat16 in MX mode, where quantized values are exact
    in it) and held in DOT_DTYPE: OP_DTYPE on the GPU, float32 under the interpreter (whose
    bfloat16 dot is unreliable; the products are the same exact values)."""
    raw = tl.dot(q_dot, tl.trans(k_dot))
    return _round_to(raw, S_DTYPE, BY_BITS) * sm_scale


@triton.jit
def _allowed(offs_m, offs_n, q_len, k_len, CAUSAL: tl.constexpr):
    allowed = (offs_m[:, None] < q_len) & (offs_n[None, :] < k_len)
    if CAUSAL:
        allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
    return allowed


@triton.jit
def _probabilities(s, allowed, m_row, l_row, n_keys, SILU: tl.constexpr):
    """Normalized P of the reference: exp(s - m) * (1 / l) (one reciprocal per row, not a quotient per
    element: on the GPU both are float32 approximations within two ulps), or silu(s) / n_keys; 0 where not
    allowed."""
    if SILU:
        p = s / (1.0 + tl.exp(-s)) / n_keys
    else:
        p = tl.exp(s - m_row[:, None]) * (1.0 / l_row)[:, None]
    return tl.where(allowed, p, 0.0)


@triton.jit
def _score_gradient(s, p, dp, delta_row, allowed, n_keys, sm_scale, S_DTYPE: tl.constexpr, SILU: tl.constexpr, BY_BITS: tl.constexpr):
    """dS as the reference's autograd gives it: d(s) * scale rounded to the input dtype."""
    if SILU:
        sig = 1.0 / (1.0 + tl.exp(-s))
        ds = dp / n_keys * (sig * (1.0 + s * (1.0 - sig)))
    else:
        ds = p * (dp - delta_row[:, None])
    ds = tl.where(allowed, ds * sm_scale, 0.0)
    return _round_to(ds, S_DTYPE, BY_BITS)


@triton.jit
def _load_rows(base, rows, row_ok, offs_d, stride_t, DOT_DTYPE: tl.constexpr):
    """Rows `rows` (masked by row_ok, zeros elsewhere) of a (tokens, head_dim) slice, in DOT_DTYPE."""
    x = tl.load(base + rows[:, None] * stride_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    return x.to(DOT_DTYPE)


@triton.jit(do_not_specialize=["rows", "tokens"])
def _row_dot(A, B, OUT, rows, heads, tokens, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """OUT[h, t] = sum_d A[t, h, d] * B[t, h, d] in float32, for contiguous (tokens, heads, head_dim) A, B."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = row < rows
    offs_d = tl.arange(0, HEAD_DIM)
    index = row[:, None] * HEAD_DIM + offs_d[None, :]
    a = tl.load(A + index, mask=row_ok[:, None], other=0.0).to(tl.float32)
    b = tl.load(B + index, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(OUT + (row % heads) * tokens + row // heads, tl.sum(a * b, 1), mask=row_ok)


@triton.jit(do_not_specialize=["d_seed_key", "t_seed_key"])  # seeds change every call: one compiled kernel
def _prequantize(
    X, OUT_ALONG_D, OUT_ALONG_T, DOT_WITH, ROW_DOTS, offsets, tile_seq, tile_start, stride_t, width, tokens,
    d_seed_key, t_seed_key, COLS: tl.constexpr, D_CODE: tl.constexpr, T_CODE: tl.constexpr, ALONG_D: tl.constexpr, ALONG_T: tl.constexpr,
    ROW_DOT: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """Fake-quantize 32 tokens x COLS columns of a jagged (tokens, heads * head_dim) tensor (rows
    of `width` contiguous elements, token stride `stride_t`) along the columns (OUT_ALONG_D: blocks
    of 32 of the head dim; COLS and the column start are multiples of 32 and head_dim, so no
    block crosses a head) and/or along the tokens (OUT_ALONG_T, blocks of 32 tokens from each
    sequence's first token), as bfloat16 (exact: MX values have <= 8 significant bits).
    ROW_DOT (with ALONG_D) also writes ROW_DOTS[h, t] = sum_d along_d[t, h, d] * DOT_WITH[t, h, d]
    in float32, (heads, tokens). Stochastic rounding draws `token_random_bits` of the packed tensor
    (d_seed_key, t_seed_key: mix32 of each orientation's seed)."""
    pid = tl.program_id(0)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    seq = tl.load(tile_seq + pid)
    live = seq >= 0  # the grid is an upper bound on the tile count; spare programs see empty runs
    seq = tl.maximum(seq, 0)
    start = tl.load(tile_start + pid)
    begin = tl.load(offsets + seq)
    length = tl.where(live, (tl.load(offsets + seq + 1) - begin).to(tl.int32), 0)
    rows = start + tl.arange(0, 32)
    ok = (rows < length)[:, None] & (cols < width)[None, :]
    index = (begin + rows)[:, None] * stride_t + cols[None, :]
    x = tl.load(X + index, mask=ok, other=0.0).to(tl.float32)
    if ALONG_D:
        along_d = fake_quant_tile(x, _token_bits(begin + rows, cols, width, d_seed_key, D_CODE), 32, COLS, 1, D_CODE)
        tl.store(OUT_ALONG_D + index, along_d.to(tl.bfloat16), mask=ok)
        if ROW_DOT:
            other = tl.load(DOT_WITH + index, mask=ok, other=0.0).to(tl.float32)
            sums = tl.sum(tl.reshape(along_d * other, (32, COLS // HEAD_DIM, HEAD_DIM)), 2)
            head = (tl.min(tl.reshape(cols, (COLS // HEAD_DIM, HEAD_DIM)), 1) // HEAD_DIM).to(tl.int64)
            token_ok = rows < length
            tl.store(ROW_DOTS + head[None, :] * tokens + (begin + rows)[:, None], sums,
                     mask=token_ok[:, None] & (head * HEAD_DIM < width)[None, :])
    if ALONG_T:
        along_t = fake_quant_tile(x, _token_bits(begin + rows, cols, width, t_seed_key, T_CODE), 32, COLS, 0, T_CODE)
        tl.store(OUT_ALONG_T + index, along_t.to(tl.bfloat16), mask=ok)


@triton.jit(do_not_specialize=["total_q", "p_seed_key"])
def _jagged_attention_fwd(
    QD, KD, VT, VD, O, OU, M, L,
    q_offsets, k_offsets, tile_seq, tile_start,
    stride_qt, stride_qh, stride_kt, stride_kh,
    total_q, sm_scale, p_seed_key,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SILU: tl.constexpr, QUANT: tl.constexpr, WRITE_OU: tl.constexpr,
    S_DTYPE: tl.constexpr, OP_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, BY_BITS: tl.constexpr,
    P_CODE: tl.constexpr, ABLATE: tl.constexpr,
):
    """One BLOCK_M tile of queries of one head. QD, KD: the S operands (quantized along the head
    dim in MX mode), VT: the PV operand (quantized along keys), VD: V quantized along the head dim
    (MX softmax only, for the backward's row term). BF16 mode passes the raw tensors."""
    pid = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq = tl.load(tile_seq + pid)
    live = seq >= 0  # the grid is an upper bound on the tile count; spare programs see empty runs
    seq = tl.maximum(seq, 0)
    start_m = tl.load(tile_start + pid)
    q_begin = tl.load(q_offsets + seq)
    q_len = tl.where(live, (tl.load(q_offsets + seq + 1) - q_begin).to(tl.int32), 0)
    k_begin = tl.load(k_offsets + seq)
    k_len = tl.where(live, (tl.load(k_offsets + seq + 1) - k_begin).to(tl.int32), 0)
    n_keys = tl.maximum(k_len, 1).to(tl.float32)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    q_dot = _load_rows(QD + q_begin * stride_qt + head * stride_qh, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
    k_offset = k_begin * stride_kt + head * stride_kh

    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, start_m + BLOCK_M)

    m_i = tl.full([BLOCK_M], _F32_LOWEST, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc_u = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if SILU or not QUANT:
        # One pass: silu needs no statistics; BF16 softmax rescales the running sum (flash style).
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            key_ok = offs_n < k_len
            k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
            v_dot = _load_rows(VT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
            s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
            allowed = _allowed(offs_m, offs_n, q_len, k_len, CAUSAL)
            if SILU:
                p = _probabilities(s, allowed, m_i, l_i, n_keys, True)
                p_bits = _score_bits(q_begin + offs_m, head, offs_n, p_seed_key, P_CODE)
                p_dot = _dot_operand(_maybe_quant(p, p_bits, BLOCK_M, BLOCK_N, 1, P_CODE, QUANT and (_A_P_QUANT & ABLATE) == 0),
                                     OP_DTYPE, DOT_DTYPE, BY_BITS)
                acc += tl.dot(p_dot, v_dot)
            else:
                s = tl.where(allowed, s, _F32_LOWEST)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.where(allowed, tl.exp(s - m_new[:, None]), 0.0)
                alpha = tl.exp(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(_dot_operand(p, OP_DTYPE, DOT_DTYPE, BY_BITS), v_dot)
                m_i = m_new
        if not SILU:
            acc = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    else:
        # MX softmax: the reference quantizes normalized P, so take the statistics first.
        if (_A_STATISTICS_PASS & ABLATE) == 0:
            for start_n in range(0, hi, BLOCK_N):
                offs_n = start_n + offs_n0
                key_ok = offs_n < k_len
                k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
                s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
                allowed = _allowed(offs_m, offs_n, q_len, k_len, CAUSAL)
                s = tl.where(allowed, s, _F32_LOWEST)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.where(allowed, tl.exp(s - m_new[:, None]), 0.0)
                l_i = l_i * tl.exp(m_i - m_new) + tl.sum(p, 1)
                m_i = m_new
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            key_ok = offs_n < k_len
            k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
            v_dot = _load_rows(VT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
            s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
            allowed = _allowed(offs_m, offs_n, q_len, k_len, CAUSAL)
            if _A_STATISTICS_PASS & ABLATE:  # benchmark ablation: the statistics pass's work folded into this one
                s_allowed = tl.where(allowed, s, _F32_LOWEST)
                m_new = tl.maximum(m_i, tl.max(s_allowed, 1))
                l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.where(allowed, tl.exp(s_allowed - m_new[:, None]), 0.0), 1)
                m_i = m_new
                l_safe = tl.where(l_i > 0, l_i, 1.0)
            p = _probabilities(s, allowed, m_i, l_safe, n_keys, False)
            p_bits = _score_bits(q_begin + offs_m, head, offs_n, p_seed_key, P_CODE)
            p_dot = _dot_operand(_maybe_quant(p, p_bits, BLOCK_M, BLOCK_N, 1, P_CODE, (_A_P_QUANT & ABLATE) == 0),
                                 OP_DTYPE, DOT_DTYPE, BY_BITS)
            acc += tl.dot(p_dot, v_dot)
            if WRITE_OU and (_A_ROW_TERM & ABLATE) == 0:
                # P @ quant(V along head dim), P split in two bfloat16 parts (relative error < 2^-16).
                vd_dot = _load_rows(VD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
                p_high = _dot_operand(p, OP_DTYPE, DOT_DTYPE, BY_BITS)
                if _A_P_SPLIT & ABLATE:
                    acc_u += tl.dot(p_high, vd_dot)
                else:
                    p_low = _dot_operand(p - _round_to(p, OP_DTYPE, BY_BITS), OP_DTYPE, DOT_DTYPE, BY_BITS)
                    acc_u += tl.dot(p_high, vd_dot) + tl.dot(p_low, vd_dot)

    out_index = (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    tl.store(O + out_index, _round_to(acc, O.dtype.element_ty, BY_BITS).to(O.dtype.element_ty), mask=row_ok[:, None])
    stat_index = head * total_q + q_begin + offs_m
    tl.store(M + stat_index, m_i, mask=row_ok)
    tl.store(L + stat_index, l_i, mask=row_ok)
    if WRITE_OU:
        tl.store(OU + out_index, acc_u, mask=row_ok[:, None])


@triton.jit(do_not_specialize=["total_q", "pm_seed_key", "dsm_seed_key", "dsn_seed_key"])
def _jagged_attention_bwd_dkdv(
    QD, QT, KD, KT, VD, DOD, DOT, M, L, DELTA, DK, DV, DQ_ACC,
    q_offsets, k_offsets, tile_seq, tile_start,
    stride_qt, stride_qh, stride_kt, stride_kh,
    total_q, sm_scale, pm_seed_key, dsm_seed_key, dsn_seed_key,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SILU: tl.constexpr, QUANT: tl.constexpr,
    S_DTYPE: tl.constexpr, OP_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, BY_BITS: tl.constexpr,
    PM_CODE: tl.constexpr, DSM_CODE: tl.constexpr, FUSED_DQ: tl.constexpr, DSN_CODE: tl.constexpr, ABLATE: tl.constexpr,
):
    """dK, dV of one BLOCK_N tile of keys of one head. Operands (MX: pre-quantized): QD, KD for S;
    DOD, VD for dP (head dim); QT, DOT along the queries for dK and dV. P and dS are quantized
    here along the queries. FUSED_DQ also adds dS K (dS quantized along the keys, KT: K along
    the keys) into the float32 DQ_ACC with atomics, instead of the separate dQ kernel."""
    pid = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq = tl.load(tile_seq + pid)
    live = seq >= 0  # the grid is an upper bound on the tile count; spare programs see empty runs
    seq = tl.maximum(seq, 0)
    start_n = tl.load(tile_start + pid)
    q_begin = tl.load(q_offsets + seq)
    q_len = tl.where(live, (tl.load(q_offsets + seq + 1) - q_begin).to(tl.int32), 0)
    k_begin = tl.load(k_offsets + seq)
    k_len = tl.where(live, (tl.load(k_offsets + seq + 1) - k_begin).to(tl.int32), 0)
    n_keys = tl.maximum(k_len, 1).to(tl.float32)

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < k_len
    k_offset = k_begin * stride_kt + head * stride_kh
    k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
    vd_dot = _load_rows(VD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
    if FUSED_DQ:
        kt_dot = _load_rows(KT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
    q_offset = q_begin * stride_qt + head * stride_qh
    stat_base = head * total_q + q_begin

    lo = 0
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for start_m in range(lo, q_len, BLOCK_M):
        offs_m = start_m + offs_m0
        row_ok = offs_m < q_len
        q_dot = _load_rows(QD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        m_row = tl.load(M + stat_base + offs_m, mask=row_ok, other=0.0)
        l_row = tl.load(L + stat_base + offs_m, mask=row_ok, other=1.0)
        delta_row = tl.load(DELTA + stat_base + offs_m, mask=row_ok, other=0.0)
        s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
        allowed = _allowed(offs_m, offs_n, q_len, k_len, CAUSAL)
        p = _probabilities(s, allowed, m_row, tl.where(l_row > 0, l_row, 1.0), n_keys, SILU)
        query_rows = q_begin + offs_m
        p_bits = _score_bits(query_rows, head, offs_n, pm_seed_key, PM_CODE)
        p_dot = _dot_operand(_maybe_quant(p, p_bits, BLOCK_M, BLOCK_N, 0, PM_CODE, QUANT and (_A_P_QUANT & ABLATE) == 0),
                             OP_DTYPE, DOT_DTYPE, BY_BITS)
        dot_dot = _load_rows(DOT + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        dv += tl.dot(tl.trans(p_dot), dot_dot)
        dod_dot = _load_rows(DOD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        dp = tl.dot(dod_dot, tl.trans(vd_dot))
        if not QUANT:
            dp = _round_to(dp, S_DTYPE, BY_BITS)
        ds = _score_gradient(s, p, dp, delta_row, allowed, n_keys, sm_scale, S_DTYPE, SILU, BY_BITS)
        ds_bits = _score_bits(query_rows, head, offs_n, dsm_seed_key, DSM_CODE)
        ds_dot = _dot_operand(_maybe_quant(ds, ds_bits, BLOCK_M, BLOCK_N, 0, DSM_CODE, QUANT and (_A_DS_QUANT & ABLATE) == 0),
                              OP_DTYPE, DOT_DTYPE, BY_BITS)
        qt_dot = _load_rows(QT + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        dk += tl.dot(tl.trans(ds_dot), qt_dot)
        if FUSED_DQ:
            dsn_bits = _score_bits(query_rows, head, offs_n, dsn_seed_key, DSN_CODE)
            dsn_dot = _dot_operand(_maybe_quant(ds, dsn_bits, BLOCK_M, BLOCK_N, 1, DSN_CODE, QUANT and (_A_DS_QUANT & ABLATE) == 0),
                                   OP_DTYPE, DOT_DTYPE, BY_BITS)
            dq_index = (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
            tl.atomic_add(DQ_ACC + dq_index, tl.dot(dsn_dot, kt_dot), mask=row_ok[:, None], sem="relaxed")

    out_index = (k_begin + offs_n)[:, None] * stride_kt + head * stride_kh + offs_d[None, :]
    tl.store(DK + out_index, _round_to(dk, DK.dtype.element_ty, BY_BITS).to(DK.dtype.element_ty), mask=key_ok[:, None])
    tl.store(DV + out_index, _round_to(dv, DV.dtype.element_ty, BY_BITS).to(DV.dtype.element_ty), mask=key_ok[:, None])


@triton.jit(do_not_specialize=["total_q", "dsn_seed_key"])
def _jagged_attention_bwd_dq(
    QD, KD, KT, VD, DOD, M, L, DELTA, DQ,
    q_offsets, k_offsets, tile_seq, tile_start,
    stride_qt, stride_qh, stride_kt, stride_kh,
    total_q, sm_scale, dsn_seed_key,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SILU: tl.constexpr, QUANT: tl.constexpr,
    S_DTYPE: tl.constexpr, OP_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, BY_BITS: tl.constexpr,
    DSN_CODE: tl.constexpr, ABLATE: tl.constexpr,
):
    """dQ of one BLOCK_M tile of queries of one head. KT: K along the keys (MX) for dQ = dS K;
    dS is quantized here along the keys."""
    pid = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq = tl.load(tile_seq + pid)
    live = seq >= 0  # the grid is an upper bound on the tile count; spare programs see empty runs
    seq = tl.maximum(seq, 0)
    start_m = tl.load(tile_start + pid)
    q_begin = tl.load(q_offsets + seq)
    q_len = tl.where(live, (tl.load(q_offsets + seq + 1) - q_begin).to(tl.int32), 0)
    k_begin = tl.load(k_offsets + seq)
    k_len = tl.where(live, (tl.load(k_offsets + seq + 1) - k_begin).to(tl.int32), 0)
    n_keys = tl.maximum(k_len, 1).to(tl.float32)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    q_offset = q_begin * stride_qt + head * stride_qh
    q_dot = _load_rows(QD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
    dod_dot = _load_rows(DOD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
    stat_index = head * total_q + q_begin + offs_m
    m_row = tl.load(M + stat_index, mask=row_ok, other=0.0)
    l_row = tl.load(L + stat_index, mask=row_ok, other=1.0)
    l_safe = tl.where(l_row > 0, l_row, 1.0)
    delta_row = tl.load(DELTA + stat_index, mask=row_ok, other=0.0)
    k_offset = k_begin * stride_kt + head * stride_kh

    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, start_m + BLOCK_M)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < k_len
        k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        vd_dot = _load_rows(VD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
        allowed = _allowed(offs_m, offs_n, q_len, k_len, CAUSAL)
        p = _probabilities(s, allowed, m_row, l_safe, n_keys, SILU)
        dp = tl.dot(dod_dot, tl.trans(vd_dot))
        if not QUANT:
            dp = _round_to(dp, S_DTYPE, BY_BITS)
        ds = _score_gradient(s, p, dp, delta_row, allowed, n_keys, sm_scale, S_DTYPE, SILU, BY_BITS)
        ds_bits = _score_bits(q_begin + offs_m, head, offs_n, dsn_seed_key, DSN_CODE)
        ds_dot = _dot_operand(_maybe_quant(ds, ds_bits, BLOCK_M, BLOCK_N, 1, DSN_CODE, QUANT and (_A_DS_QUANT & ABLATE) == 0),
                              OP_DTYPE, DOT_DTYPE, BY_BITS)
        kt_dot = _load_rows(KT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        dq += tl.dot(ds_dot, kt_dot)
    out_index = (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    tl.store(DQ + out_index, _round_to(dq, DQ.dtype.element_ty, BY_BITS).to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------- host code
@dataclass(frozen=True)
class TileSizes:
    """Tile sizes (multiples of 32 for MX; powers of two >= 16) and launch options of the three kernels."""

    fwd_m: int = 128
    fwd_n: int = 64
    dkdv_m: int = 64
    dkdv_n: int = 64
    dq_m: int = 64
    dq_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    fused_dq: bool = False  # dQ by float32 atomics from the dK/dV kernel instead of its own kernel

    def __post_init__(self) -> None:
        for name in ("fwd_m", "fwd_n", "dkdv_m", "dkdv_n", "dq_m", "dq_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"tile size {name}={value} must be a power of two >= 16")


# BF16: the fastest of `mxlab bench attention --sweep-tiles` on one H200 (512 log-normal sequences,
# 4 x 64): 3.98 ms forward + backward, against 4.33 ms for 128x64 tiles with 8 warps everywhere.
DEFAULT_TILES = TileSizes(fwd_m=128, fwd_n=64, dkdv_m=64, dkdv_n=64, dq_m=64, dq_n=64, num_warps=4, num_stages=2)
# MX: key tiles of 32 in the forward and dQ (P and dS quantized along keys in one block per row),
# query tiles of 32 in dK/dV (P and dS along queries): no reshapes, no register spills on sm_90.
DEFAULT_MX_TILES = TileSizes(fwd_m=64, fwd_n=32, dkdv_m=32, dkdv_n=64, dq_m=64, dq_n=32, num_warps=4, num_stages=2)
INTERPRETER_TILES = TileSizes(fwd_m=32, fwd_n=32, dkdv_m=32, dkdv_n=32, dq_m=32, dq_n=32, num_warps=1, num_stages=1)


@dataclass(frozen=True)
class _OperandCodes:
    """Packed operand codes of the 12 quantized operands (None: BF16 mode)."""

    q_d: int
    k_d: int
    p_n: int
    v_n: int
    do_d: int
    v_d: int
    p_m: int
    do_m: int
    ds_n: int
    k_n: int
    q_m: int
    ds_m: int


@dataclass(frozen=True)
class _SeedKeys:
    """mix32 of the per-call stochastic-rounding seed of each of the 12 operands, as signed int32
    (0 where an operand does not round stochastically)."""

    q_d: int = 0
    k_d: int = 0
    p_n: int = 0
    v_n: int = 0
    do_d: int = 0
    v_d: int = 0
    p_m: int = 0
    do_m: int = 0
    ds_n: int = 0
    k_n: int = 0
    q_m: int = 0
    ds_m: int = 0


_NO_SEEDS = _SeedKeys()
def _stochastic(code: int) -> bool:
    return (code >> 15) & 3 == ROUND_STOCHASTIC.value


def _seed_key(seed: int) -> int:
    key = _mix32_host(seed & 0xFFFFFFFF)
    return key - (1 << 32) if key >= 1 << 31 else key  # int32 bits: one kernel signature for every seed


def _seed_keys(policy: Any, codes: Optional[_OperandCodes]) -> _SeedKeys:
    """The seed keys of one attention call. When any operand rounds stochastically, draws the next call's
    seeds of both products (`MatmulPrecision.next_call_seeds`: advances each product's call counter by one)
    and maps qmatmul's seed slots to the operands: fwd.a, fwd.b, grad_a.g, grad_a.b, grad_b.a, grad_b.g are
    Q, K, dS (along keys), K (along keys), Q (along queries), dS (along queries) for qk and P, V, dO, V (along
    the head dim), P (along queries), dO (along queries) for pv."""
    if codes is None or not any(_stochastic(code) for code in vars(codes).values()):
        return _NO_SEEDS
    from mxlab.nn.qmatmul import SEED_SLOTS

    qk, pv = policy.qk.next_call_seeds(), policy.pv.next_call_seeds()
    slots = {
        "q_d": (qk, "fwd.a"), "k_d": (qk, "fwd.b"), "ds_n": (qk, "grad_a.g"), "k_n": (qk, "grad_a.b"), "q_m": (qk, "grad_b.a"),
        "ds_m": (qk, "grad_b.g"), "p_n": (pv, "fwd.a"), "v_n": (pv, "fwd.b"), "do_d": (pv, "grad_a.g"), "v_d": (pv, "grad_a.b"),
        "p_m": (pv, "grad_b.a"), "do_m": (pv, "grad_b.g"),
    }
    return _SeedKeys(**{name: _seed_key(seeds[SEED_SLOTS[slot]]) if _stochastic(getattr(codes, name)) else 0
                        for name, (seeds, slot) in slots.items()})


def _operand(quant: Any, where: str, device: Optional[torch.device]) -> int:
    if quant.fmt not in FORMATS:
        raise ValueError(f"{where}: operand format {quant.fmt!r} is not an MX format; the kernel quantizes every operand in MX mode")
    if quant.block != 32:
        raise ValueError(f"{where}: block {quant.block!r} is not supported by the kernel; accepted: 32")
    hw_fp8 = device is not None and hardware_fp8_applies(device, FORMATS[quant.fmt], quant.rounding)
    return operand_code(quant.fmt, quant.scale_mode, quant.rounding, hw_fp8=hw_fp8)


def _codes(policy: Any, device: Optional[torch.device] = None) -> Optional[_OperandCodes]:
    """Operand codes of an attention policy; None for policy None. ValueError if unsupported.
    With `device`, operands convert with the hardware FP8 instructions where
    `mx_quant.hardware_fp8_applies` holds for it (None: integer steps everywhere)."""
    if policy is None:
        return None
    qk, pv = getattr(policy, "qk", None), getattr(policy, "pv", None)
    if qk is None or pv is None:
        raise ValueError("the kernel needs both attention products quantized (policy.qk and policy.pv set) or policy None")
    for name, precision in (("qk", qk), ("pv", pv)):
        if getattr(precision, "grad_scale", None) is not None:
            raise ValueError(f"policy.{name}.grad_scale is set; per-layer gradient scaling is not supported by the kernel")
        for gemm_name, gemm in (("fwd", precision.fwd), ("grad_a", precision.grad_a), ("grad_b", precision.grad_b)):
            if gemm.hadamard is not None:
                raise ValueError(f"policy.{name}.{gemm_name} uses a Hadamard transform; not supported by the kernel")
    return _OperandCodes(
        q_d=_operand(qk.fwd.a, "qk.fwd.a", device), k_d=_operand(qk.fwd.b, "qk.fwd.b", device),
        p_n=_operand(pv.fwd.a, "pv.fwd.a", device), v_n=_operand(pv.fwd.b, "pv.fwd.b", device),
        do_d=_operand(pv.grad_a.a, "pv.grad_a.a", device), v_d=_operand(pv.grad_a.b, "pv.grad_a.b", device),
        p_m=_operand(pv.grad_b.a, "pv.grad_b.a", device), do_m=_operand(pv.grad_b.b, "pv.grad_b.b", device),
        ds_n=_operand(qk.grad_a.a, "qk.grad_a.a", device), k_n=_operand(qk.grad_a.b, "qk.grad_a.b", device),
        q_m=_operand(qk.grad_b.a, "qk.grad_b.a", device), ds_m=_operand(qk.grad_b.b, "qk.grad_b.b", device),
    )


def unsupported_reason(q: torch.Tensor, policy: Any, activation: str = "softmax") -> Optional[str]:
    """Why `jagged_attention` cannot run these inputs (a sentence), or None when it can."""
    if activation not in ACTIVATIONS:
        return f"unknown attention activation {activation!r}; accepted: {', '.join(ACTIVATIONS)}"
    accepted = (torch.bfloat16, torch.float16) if policy is None else (torch.bfloat16, torch.float16, torch.float32)
    if q.dtype not in accepted:
        return f"dtype {q.dtype} is not supported {'without' if policy is None else 'with'} a policy; accepted: {', '.join(map(str, accepted))}"
    head_dim = q.shape[-1] if q.dim() == 3 else 0
    minimum = 32 if policy is not None else 16
    if head_dim < minimum or head_dim > 256 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not supported; accepted: powers of two from {minimum} to 256"
    try:
        _codes(policy)
    except ValueError as error:
        return str(error)
    return None


_OFFSETS_CACHE_ATTRIBUTE = "_mxlab_jagged_attention_cache"
_Cached = TypeVar("_Cached")


def _tensor_version(tensor: torch.Tensor) -> Optional[int]:
    """tensor._version, or None for tensors without a version counter (inference mode)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _cached_on_offsets(offsets: torch.Tensor, tag: tuple, other: Optional[torch.Tensor], compute: Callable[[], _Cached]) -> _Cached:
    """compute(), cached on the offsets tensor itself (a Python attribute) under `tag` and the
    identity and version of `other` (a second tensor the result depends on, or None), for the
    current version of `offsets`: an in-place change of either tensor computes it again.
    Tensors without a version counter (inference mode) are not cached."""
    version = _tensor_version(offsets)
    other_version = _tensor_version(other) if other is not None else -1
    if version is None or other_version is None:
        return compute()
    cache = offsets.__dict__.get(_OFFSETS_CACHE_ATTRIBUTE)
    if cache is None or cache[0] != version:  # a new or changed offsets tensor: drop every entry
        cache = (version, {})
        setattr(offsets, _OFFSETS_CACHE_ATTRIBUTE, cache)
    key = (*tag, id(other), other_version)
    entry = cache[1].get(key)
    # The weak reference tells a live `other` from a new tensor that reuses a freed one's id.
    if entry is not None and (other is None or entry[0]() is other):
        return entry[1]
    value = compute()
    entries = cache[1]
    # Drop the entries of freed `other` tensors (offsets reused with per-batch partners would
    # otherwise keep every batch's tables alive).
    for dead in [key for key, (reference, _) in entries.items() if reference is not None and reference() is None]:
        del entries[dead]
    entries[key] = (weakref.ref(other) if other is not None else None, value)
    return value


def _tiles(offsets: torch.Tensor, tokens: int, work_offsets: Optional[torch.Tensor], block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence index, start) int32 of every `block`-row tile of every non-empty run of `offsets`,
    the tiles of sequences with the longest runs in `work_offsets` first (None: in order).

    Computed on the device without a host synchronization: the table has a fixed size (tokens //
    block + sequences, an upper bound; `tokens` is the run's total length), and spare entries
    have sequence index -1. Cached on `offsets` (`_cached_on_offsets`): the layers of a model
    that share offsets, and the backward, compute it once.
    """
    return _cached_on_offsets(
        offsets, ("tiles", tokens, block), work_offsets, lambda: _compute_tiles(offsets, tokens, work_offsets, block)
    )


def _compute_tiles(offsets: torch.Tensor, tokens: int, work_offsets: Optional[torch.Tensor], block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The uncached `_tiles`."""
    n = offsets.numel() - 1
    bound = tokens // block + n
    lengths = offsets[1:] - offsets[:-1]
    counts = (lengths + block - 1) // block
    ends = torch.cumsum(counts, 0)
    index = torch.arange(bound, device=offsets.device)
    seq = torch.searchsorted(ends, index, right=True)
    live = seq < n
    seq_clamped = seq.clamp(max=max(n - 1, 0))
    start = (index - (ends - counts)[seq_clamped]) * block if n else index
    seq = torch.where(live, seq, -1)
    if work_offsets is not None and n:
        work = work_offsets[1:] - work_offsets[:-1]
        key = torch.where(live, work[seq_clamped], -1)
        order = torch.argsort(key, descending=True, stable=True)
        seq, start = seq[order], start[order]
    return seq.to(torch.int32), start.to(torch.int32)


def _dtype_constexpr(dtype: torch.dtype) -> Any:
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_tiles(quantized: bool, device: torch.device) -> TileSizes:
    """The tile sizes used when none are given: small ones under the interpreter."""
    if _interpreting() or device.type != "cuda":
        return INTERPRETER_TILES
    return DEFAULT_MX_TILES if quantized else DEFAULT_TILES


def _prequantized(x: torch.Tensor, offsets: torch.Tensor, d_code: Optional[int], t_code: Optional[int],
                  dot_with: Optional[torch.Tensor] = None, d_seed_key: int = 0,
                  t_seed_key: int = 0) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """x fake-quantized (bfloat16) along the head dim with d_code and/or along the tokens of each
    sequence with t_code (blocks of 32 from each sequence's first token); for a None code, x
    itself is returned in that slot. Third: with `dot_with` (contiguous, x's shape; needs
    d_code), the (heads, tokens) float32 sums over the head dim of along_d * dot_with, else None.
    d_seed_key, t_seed_key: `_seed_key` of each orientation's seed (stochastic codes only)."""
    if not x.is_contiguous():
        raise ValueError(f"_prequantized needs a contiguous (tokens, heads, head_dim) tensor; got strides {x.stride()}")
    seq, start = _tiles(offsets, x.shape[0], None, 32)
    along_d = torch.empty(x.shape, device=x.device, dtype=torch.bfloat16) if d_code is not None else x
    along_t = torch.empty(x.shape, device=x.device, dtype=torch.bfloat16) if t_code is not None else x
    row_dots = None
    if dot_with is not None:
        if d_code is None or dot_with.shape != x.shape or not dot_with.is_contiguous():
            raise ValueError(f"_prequantized: dot_with needs d_code and a contiguous tensor of shape {tuple(x.shape)}")
        row_dots = torch.empty(x.shape[1], x.shape[0], device=x.device, dtype=torch.float32)
    width = x.shape[1] * x.shape[2]  # a token's heads side by side: one program covers all of them
    if seq.numel() and width:
        columns = min(triton.next_power_of_2(width), _PREQUANTIZE_COLUMNS)
        _prequantize[(seq.numel(), triton.cdiv(width, columns))](
            x, along_d, along_t, dot_with if dot_with is not None else x, row_dots if row_dots is not None else x,
            offsets, seq, start, width, width, x.shape[0], d_seed_key, t_seed_key,
            COLS=columns, D_CODE=d_code or 0, T_CODE=t_code or 0, ALONG_D=d_code is not None, ALONG_T=t_code is not None,
            ROW_DOT=dot_with is not None, HEAD_DIM=x.shape[2], num_warps=_prequantize_warps(columns),
        )
    return along_d, along_t, row_dots


# Columns (heads x head_dim) of one `_prequantize` program: at most 256 (a multiple of every
# supported head dim up to 256); 32 x 256 float32 values take 64 registers per thread at 4 warps.
_PREQUANTIZE_COLUMNS = 256


def _prequantize_warps(columns: int) -> int:
    return 1 if _interpreting() else max(1, min(8, columns // 32))


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(heads, tokens) float32 sums over the head dim of a * b, both contiguous (tokens, heads, head_dim)."""
    tokens, heads, head_dim = a.shape
    out = torch.empty(heads, tokens, device=a.device, dtype=torch.float32)
    rows = tokens * heads
    if rows:
        block_rows = 64
        _row_dot[(triton.cdiv(rows, block_rows),)](a, b, out, rows, heads, tokens, HEAD_DIM=head_dim, BLOCK_ROWS=block_rows, num_warps=4)
    return out


def _launch_options(x: torch.Tensor, silu: bool, causal: bool, quant: bool, tiles: TileSizes, ablate: int = 0) -> dict[str, Any]:
    """Constexpr arguments and launch options shared by the three attention kernels (a cached
    dict: callers unpack it and never change it). `ablate`: the benchmark-only ABLATE_* mask."""
    return _cached_launch_options(x.dtype, x.shape[2], silu, causal, quant, tiles, _interpreting(), ablate)


@functools.lru_cache(maxsize=256)
def _cached_launch_options(dtype: torch.dtype, head_dim: int, silu: bool, causal: bool, quant: bool, tiles: TileSizes, interpreting: bool,
                           ablate: int) -> dict[str, Any]:
    s_dtype = _dtype_constexpr(dtype)
    op_dtype = tl.bfloat16 if quant else s_dtype
    return dict(
        HEAD_DIM=head_dim, CAUSAL=causal, SILU=silu, QUANT=quant, S_DTYPE=s_dtype, OP_DTYPE=op_dtype,
        DOT_DTYPE=tl.float32 if interpreting else op_dtype, BY_BITS=interpreting, ABLATE=ablate,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


class _JaggedAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, k_offsets: torch.Tensor,
                causal: bool, silu: bool, codes: Optional[_OperandCodes], seeds: _SeedKeys, tiles: TileSizes,
                backward_expected: bool, ablate: int = 0) -> torch.Tensor:  # type: ignore[override]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        total_q, heads, head_dim = q.shape
        quant = codes is not None
        # Every query row of every sequence is written, zeros where a sequence has no keys.
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        m = torch.empty(heads, total_q, device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        write_ou = quant and not silu
        out_u = torch.empty(q.shape, device=q.device, dtype=torch.float32) if write_ou else m
        if quant and ablate & ABLATE_PREQUANTIZE:  # benchmark ablation: the unquantized inputs in every slot
            q_d, k_d, v_d, v_t, q_t, k_t = q, k, v, v, q, k
        elif quant:
            # The backward's along-token copies of Q and K come from the same read.
            q_d, q_t, _ = _prequantized(q, q_offsets, codes.q_d, codes.q_m if backward_expected else None,
                                        d_seed_key=seeds.q_d, t_seed_key=seeds.q_m)
            k_d, k_t, _ = _prequantized(k, k_offsets, codes.k_d, codes.k_n if backward_expected else None,
                                        d_seed_key=seeds.k_d, t_seed_key=seeds.k_n)
            v_d, v_t, _ = _prequantized(v, k_offsets, codes.v_d, codes.v_n, d_seed_key=seeds.v_d, t_seed_key=seeds.v_n)
        else:
            q_d, k_d, v_d, v_t, q_t, k_t = q, k, v, v, q, k
        tile_seq, tile_start = _tiles(q_offsets, total_q, k_offsets, tiles.fwd_m)
        if tile_seq.numel() and heads:
            _jagged_attention_fwd[(tile_seq.numel(), heads)](
                q_d, k_d, v_t, v_d, out, out_u, m, l, q_offsets, k_offsets, tile_seq, tile_start,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), total_q, head_dim ** -0.5, seeds.p_n,
                BLOCK_M=tiles.fwd_m, BLOCK_N=tiles.fwd_n, WRITE_OU=write_ou, P_CODE=codes.p_n if quant else 0,
                **_launch_options(q, silu, causal, quant, tiles, ablate),
            )
        ctx.save_for_backward(q, k, out, out_u, m, l, q_d, k_d, v_d, q_t, k_t)
        # The offsets stay on ctx as the same Python objects, so the backward finds their tile
        # tables cached on them; their versions are checked as saved tensors' would be.
        ctx.offsets = (q_offsets, k_offsets, _tensor_version(q_offsets), _tensor_version(k_offsets))
        ctx.settings = (causal, silu, codes, seeds, tiles, write_ou, ablate)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        q, k, out, out_u, m, l, q_d, k_d, v_d, q_t, k_t = ctx.saved_tensors
        q_offsets, k_offsets, q_offsets_version, k_offsets_version = ctx.offsets
        if _tensor_version(q_offsets) != q_offsets_version or _tensor_version(k_offsets) != k_offsets_version:
            raise RuntimeError("jagged attention: q_offsets or k_offsets were modified in place between the forward and the backward")
        causal, silu, codes, seeds, tiles, write_ou, ablate = ctx.settings
        grad_out = grad_out.contiguous()
        total_q, heads, head_dim = q.shape
        quant = codes is not None
        # The softmax row term: MX: sum_j P_ij dP_ij = sum_d quant(dO)_id (P @ quant(V))_id, both
        # along the head dim, from the launch that quantizes dO; BF16: the flash-attention
        # rowsum(dO * O). SiLU reads none.
        if quant and ablate & ABLATE_PREQUANTIZE:  # benchmark ablation: dO unquantized, the row term by a plain row dot
            do_d, do_t, delta = grad_out, grad_out, _row_dots(grad_out, out_u) if write_ou else None
        elif quant:
            do_d, do_t, delta = _prequantized(grad_out, q_offsets, codes.do_d, codes.do_m, dot_with=out_u if write_ou else None,
                                              d_seed_key=seeds.do_d, t_seed_key=seeds.do_m)
        else:
            do_d, do_t, delta = grad_out, grad_out, None if silu else _row_dots(grad_out, out)
        if delta is None:
            delta = m  # not read
        # Every key row of every sequence with keys is written (zeros where a sequence has no
        # queries), and so is every query row by the dQ kernel; the fused dQ accumulates atomically.
        dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dv = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dq = None if tiles.fused_dq else torch.empty(q.shape, device=q.device, dtype=q.dtype)
        dq_accumulator = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if tiles.fused_dq else dq
        options = _launch_options(q, silu, causal, quant, tiles, ablate)
        strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), total_q, head_dim ** -0.5)
        kv_seq, kv_start = _tiles(k_offsets, k.shape[0], q_offsets, tiles.dkdv_n)
        if kv_seq.numel() and heads:
            _jagged_attention_bwd_dkdv[(kv_seq.numel(), heads)](
                q_d, q_t, k_d, k_t, v_d, do_d, do_t, m, l, delta, dk, dv, dq_accumulator,
                q_offsets, k_offsets, kv_seq, kv_start, *strides, seeds.p_m, seeds.ds_m, seeds.ds_n,
                BLOCK_M=tiles.dkdv_m, BLOCK_N=tiles.dkdv_n, PM_CODE=codes.p_m if quant else 0,
                DSM_CODE=codes.ds_m if quant else 0, FUSED_DQ=tiles.fused_dq, DSN_CODE=codes.ds_n if quant else 0, **options,
            )
        if tiles.fused_dq:
            return dq_accumulator.to(q.dtype), dk, dv, None, None, None, None, None, None, None, None, None
        q_seq, q_start = _tiles(q_offsets, total_q, k_offsets, tiles.dq_m)
        if q_seq.numel() and heads:
            _jagged_attention_bwd_dq[(q_seq.numel(), heads)](
                q_d, k_d, k_t, v_d, do_d, m, l, delta, dq, q_offsets, k_offsets, q_seq, q_start, *strides, seeds.ds_n,
                BLOCK_M=tiles.dq_m, BLOCK_N=tiles.dq_n, DSN_CODE=codes.ds_n if quant else 0, **options,
            )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def _check_offsets(name: str, offsets: torch.Tensor, total: int, device: torch.device) -> None:
    check_offsets_layout(name, offsets)
    if offsets.device != device:
        raise ValueError(f"{name} is on {offsets.device}, the tensors on {device}; put them on one device")
    # The value checks synchronize with the device: done once per offsets tensor and version.
    _cached_on_offsets(offsets, ("checked", total), None, lambda: check_offsets_values(name, offsets, total))


def check_jagged_offsets(q_offsets: torch.Tensor, k_offsets: torch.Tensor, total_q: int, total_k: int,
                         device: torch.device, causal: bool) -> None:
    """Refuses (ValueError) offsets that are not int64 batch+1 runs on `device` from 0 to the token
    counts, of different batch sizes, or (causal) not equal. The value checks read the device (a host
    sync), so they run once per offsets tensor and version (cached on the tensors)."""
    _check_offsets("q_offsets", q_offsets, total_q, device)
    _check_offsets("k_offsets", k_offsets, total_k, device)
    if q_offsets.numel() != k_offsets.numel():
        raise ValueError(f"q_offsets ({q_offsets.numel()}) and k_offsets ({k_offsets.numel()}) describe different batch sizes")
    if causal and not (q_offsets is k_offsets or _cached_on_offsets(q_offsets, ("equal",), k_offsets, lambda: torch.equal(q_offsets, k_offsets))):
        raise ValueError("causal attention needs as many queries as keys in every example")


def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    k_offsets: torch.Tensor,
    *,
    causal: bool = False,
    activation: str = "softmax",
    policy: Any = None,
    tiles: Optional[TileSizes] = None,
    hw_fp8: bool = True,
    _ablate: int = 0,
) -> torch.Tensor:
    """Attention over packed jagged sequences in Triton; returns (total_q, heads, head_dim) in q's dtype.

    Differentiable with respect to q, k, v. ``policy`` is None (BF16 mode) or an attention policy
    with ``qk`` and ``pv`` MatmulPrecisions (MX mode, see the module docstring). ``hw_fp8=False``
    keeps the integer quantization steps where the hardware FP8 conversion would run (the same
    bits; for tests and benchmarks). ``_ablate`` is a benchmark-only diagnostic, never for training: a
    mask of ABLATE_* bits (`ABLATIONS`), MX mode only, each removing one cost of the MX kernels while
    keeping their memory traffic; the results are then wrong by design. Refuses
    (ValueError) what `unsupported_reason` names, mismatched shapes, devices or offsets,
    ``causal=True`` when an example has a different number of queries and keys, and an ``_ablate``
    mask with unknown bits or without a policy.
    """
    check_attention_inputs(q, k, v, activation)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    reason = unsupported_reason(q, policy, activation)
    if reason is not None:
        raise ValueError(reason)
    check_jagged_offsets(q_offsets, k_offsets, q.shape[0], k.shape[0], q.device, causal)
    return jagged_attention_checked(q, k, v, q_offsets, k_offsets, causal=causal, activation=activation, policy=policy, tiles=tiles,
                                    hw_fp8=hw_fp8, _ablate=_ablate)


def jagged_attention_checked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    k_offsets: torch.Tensor,
    *,
    causal: bool,
    activation: str,
    policy: Any,
    tiles: Optional[TileSizes] = None,
    hw_fp8: bool = True,
    _ablate: int = 0,
) -> torch.Tensor:
    """`jagged_attention` for inputs a caller has already validated (shapes, dtypes, offsets,
    activation, and `unsupported_reason` is None): skips the offset checks, which cost host syncs.
    mxlab.nn.attention.JaggedAttention validates once and calls this."""
    codes = _codes(policy, q.device if hw_fp8 else None)
    if _ablate:
        if not isinstance(_ablate, int) or _ablate < 0 or _ablate & ~_ALL_ABLATIONS:
            raise ValueError(f"_ablate={_ablate!r} has unknown bits; accepted: sums of {ABLATIONS}")
        if codes is None:
            raise ValueError(f"_ablate={_ablate} ablates MX work; it needs a policy (MX mode)")
    if tiles is None:
        tiles = default_tiles(codes is not None, q.device)
    if codes is not None:
        for name in ("fwd_m", "fwd_n", "dkdv_m", "dkdv_n", "dq_m", "dq_n"):
            if getattr(tiles, name) % 32:
                raise ValueError(f"MX mode needs tile sizes that are multiples of 32; got {name}={getattr(tiles, name)}")
    seeds = _seed_keys(policy, codes)
    scores_stochastic = codes is not None and any(_stochastic(code) for code in (codes.p_n, codes.p_m, codes.ds_n, codes.ds_m))
    if scores_stochastic and q.shape[0] * q.shape[1] >= 1 << 32:
        raise ValueError(f"stochastic rounding of P or dS counts query rows x heads in 32 bits; got {q.shape[0]} x {q.shape[1]}")
    backward_expected = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _JaggedAttentionFunction.apply(q, k, v, q_offsets, k_offsets, causal, activation == "silu", codes, seeds, tiles,
                                          backward_expected, _ablate)


__all__ = ["check_jagged_offsets", "jagged_attention", "jagged_attention_checked", "unsupported_reason", "TileSizes", "DEFAULT_TILES", "DEFAULT_MX_TILES", "INTERPRETER_TILES", "default_tiles",
           "ABLATIONS"]
