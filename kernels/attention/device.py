"""Device helpers of the jagged attention kernels: operand rounding, scores, probabilities, score gradients,
row loads, and the pre-quantization of Q, K, V, dO (`_prequantize`) and the row dots of the BF16 backward."""

from __future__ import annotations

import os
from typing import Any

import triton
import triton.language as tl

from mxlab.kernels._mx_device import fake_quant_tile, score_random_bits, token_random_bits
from mxlab.kernels.cast.bits import ROUND_STOCHASTIC, code_field


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


@triton.jit
def _maybe_quant(
    x, r24, ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, CODE: tl.constexpr, QUANT: tl.constexpr
):
    """x (float32) fake-quantized along AXIS when QUANT (r24: random bits, see `_score_bits`), else x."""
    if QUANT:
        return fake_quant_tile(x, r24, ROWS, COLS, AXIS, CODE)
    else:
        return x


@triton.jit
def _score_bits(query_rows, head, keys, seed_key, CODE: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """Random bits of the scores (query_rows x keys, or keys x query_rows when KEYS_FIRST) of `head` for the
    operand CODE (the grid's second axis runs over the heads); 0 when CODE does not round stochastically."""
    if code_field(CODE, "rounding") == ROUND_STOCHASTIC:
        return score_random_bits(query_rows, head, tl.num_programs(1), keys, seed_key, KEYS_FIRST)
    else:
        return 0


@triton.jit
def _token_bits(tokens, columns, width, seed_key, CODE: tl.constexpr):
    """Random bits of the elements (tokens x columns) of a packed (tokens, width) tensor for the operand
    CODE; 0 when CODE does not round stochastically."""
    if code_field(CODE, "rounding") == ROUND_STOCHASTIC:
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
def _allowed(offs_m, offs_n, q_len, k_len, CAUSAL: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """Which (query, key) pairs attend, as a (queries, keys) tile, or (keys, queries) when KEYS_FIRST."""
    if KEYS_FIRST:
        allowed = (offs_n[:, None] < k_len) & (offs_m[None, :] < q_len)
        if CAUSAL:
            allowed = allowed & (offs_n[:, None] <= offs_m[None, :])
    else:
        allowed = (offs_m[:, None] < q_len) & (offs_n[None, :] < k_len)
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
    return allowed


@triton.jit
def _probabilities(s, allowed, m, inv_l, n_keys, SILU: tl.constexpr):
    """Normalized P of the reference: exp(s - m) * inv_l, with each query's maximum m and reciprocal sum inv_l
    broadcast against s (one reciprocal per row, not a quotient per element: on the GPU both are float32
    approximations within two ulps), or silu(s) / n_keys; 0 where not allowed."""
    if SILU:
        p = s / (1.0 + tl.exp(-s)) / n_keys
    else:
        p = tl.exp(s - m) * inv_l
    return tl.where(allowed, p, 0.0)


@triton.jit
def _score_gradient(
    s, p, dp, delta, allowed, n_keys, sm_scale, S_DTYPE: tl.constexpr, SILU: tl.constexpr, BY_BITS: tl.constexpr
):
    """dS as the reference's autograd gives it: d(s) * scale rounded to the input dtype (delta: each query's
    softmax row term, broadcast against s)."""
    if SILU:
        sig = 1.0 / (1.0 + tl.exp(-s))
        ds = dp / n_keys * (sig * (1.0 + s * (1.0 - sig)))
    else:
        ds = p * (dp - delta)
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


@triton.jit(do_not_specialize=["seed_key"])  # seeds change every call: one compiled kernel
def _prequantize(
    X,
    OUT,
    DOT_WITH,
    ROW_DOTS,
    offsets,
    tile_seq,
    tile_start,
    stride_t,
    width,
    tokens,
    seed_key,
    COLS: tl.constexpr,
    CODE: tl.constexpr,
    ROW_DOT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Fake-quantize 32 tokens x COLS columns of a jagged (tokens, heads * head_dim) tensor (rows of `width`
    contiguous elements, token stride `stride_t`) along the tokens (blocks of 32 tokens from each sequence's
    first token), as bfloat16 (exact: MX values have <= 8 significant bits). ROW_DOT also writes
    ROW_DOTS[h, t] = sum_d X[t, h, d] * DOT_WITH[t, h, d] in float32, (heads, tokens) (the softmax backward's
    row term, with X = dO and DOT_WITH = O; COLS and the column start are multiples of head_dim). Stochastic
    rounding draws `token_random_bits` of the packed tensor (seed_key: mix32 of the seed)."""
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
    if ROW_DOT:
        other = tl.load(DOT_WITH + index, mask=ok, other=0.0).to(tl.float32)
        sums = tl.sum(tl.reshape(x * other, (32, COLS // HEAD_DIM, HEAD_DIM)), 2)
        head = (tl.min(tl.reshape(cols, (COLS // HEAD_DIM, HEAD_DIM)), 1) // HEAD_DIM).to(tl.int64)
        token_ok = rows < length
        tl.store(
            ROW_DOTS + head[None, :] * tokens + (begin + rows)[:, None],
            sums,
            mask=token_ok[:, None] & (head * HEAD_DIM < width)[None, :],
        )
    along_t = fake_quant_tile(x, _token_bits(begin + rows, cols, width, seed_key, CODE), 32, COLS, 0, CODE)
    tl.store(OUT + index, along_t.to(tl.bfloat16), mask=ok)
