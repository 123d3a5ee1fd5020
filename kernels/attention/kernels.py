"""The jagged attention kernels: the forward (`_jagged_attention_fwd`), dK/dV (`_jagged_attention_bwd_dkdv`, with
dQ by atomics when FUSED_DQ) and dQ (`_jagged_attention_bwd_dq`). Each program takes one tile of queries (or
keys) of one sequence and one head from a tile table (`tiles._tiles`); see the package docstring."""

from __future__ import annotations

import triton
import triton.language as tl

from mxlab.kernels.attention.device import (
    _F32_LOWEST,
    _allowed,
    _dot_operand,
    _load_rows,
    _maybe_quant,
    _probabilities,
    _round_to,
    _score_bits,
    _score_gradient,
    _scores,
)


@triton.jit
def _sequence_tile(
    q_offsets,
    k_offsets,
    tile_seq,
    tile_start,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    BLOCK: tl.constexpr,
    KEY_TILES: tl.constexpr,
):
    """Where this program works: the grid's first axis runs over a tile table (sequence, start), its second
    over the heads; the table is an upper bound on the tile count, and spare entries (sequence -1) see empty
    runs. Returns (head, q_begin, q_len, k_begin, k_len, n_keys as float32, the tile's first row, its BLOCK
    rows of queries, or of keys when KEY_TILES, their mask, and the offsets of the head's first query and
    first key)."""
    pid = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq = tl.load(tile_seq + pid)
    live = seq >= 0
    seq = tl.maximum(seq, 0)
    q_begin = tl.load(q_offsets + seq)
    q_len = tl.where(live, (tl.load(q_offsets + seq + 1) - q_begin).to(tl.int32), 0)
    k_begin = tl.load(k_offsets + seq)
    k_len = tl.where(live, (tl.load(k_offsets + seq + 1) - k_begin).to(tl.int32), 0)
    start = tl.load(tile_start + pid)
    offs = start + tl.arange(0, BLOCK)
    if KEY_TILES:
        ok = offs < k_len
    else:
        ok = offs < q_len
    return (
        head,
        q_begin,
        q_len,
        k_begin,
        k_len,
        tl.maximum(k_len, 1).to(tl.float32),
        start,
        offs,
        ok,
        q_begin * stride_qt + head * stride_qh,
        k_begin * stride_kt + head * stride_kh,
    )


@triton.jit
def _row_statistics(M, L, DELTA, index, row_ok):
    """The forward's softmax max and sum and the backward's row term of query rows `index` (masked by row_ok)."""
    m_row = tl.load(M + index, mask=row_ok, other=0.0)
    l_row = tl.load(L + index, mask=row_ok, other=1.0)
    delta_row = tl.load(DELTA + index, mask=row_ok, other=0.0)
    return m_row, l_row, delta_row


@triton.jit
def _probabilities_and_score_gradient(
    q_dot,
    k_dot,
    dod_dot,
    vd_dot,
    offs_m,
    offs_n,
    q_len,
    k_len,
    m_row,
    l_row,
    delta_row,
    n_keys,
    sm_scale,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    QUANT: tl.constexpr,
    S_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
    KEYS_FIRST: tl.constexpr,
):
    """(P, dS) of a (queries, keys) tile in the backward, or of its transpose, a (keys, queries) tile, when
    KEYS_FIRST (the same values: S^T = K Q^T, dP^T = V dO^T): the forward's normalized P again from the saved
    statistics, dP = dO V^T (rounded to the input dtype in BF16 mode), and dS (`_score_gradient`)."""
    inv_l = 1.0 / tl.where(l_row > 0, l_row, 1.0)
    if KEYS_FIRST:
        s = _scores(k_dot, q_dot, sm_scale, S_DTYPE, BY_BITS)
        m, inv_l, delta = m_row[None, :], inv_l[None, :], delta_row[None, :]
        dp = tl.dot(vd_dot, tl.trans(dod_dot))
    else:
        s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
        m, inv_l, delta = m_row[:, None], inv_l[:, None], delta_row[:, None]
        dp = tl.dot(dod_dot, tl.trans(vd_dot))
    allowed = _allowed(offs_m, offs_n, q_len, k_len, CAUSAL, KEYS_FIRST)
    p = _probabilities(s, allowed, m, inv_l, n_keys, SILU)
    if not QUANT:
        dp = _round_to(dp, S_DTYPE, BY_BITS)
    return p, _score_gradient(s, p, dp, delta, allowed, n_keys, sm_scale, S_DTYPE, SILU, BY_BITS)


@triton.jit
def _key_scores(
    q_dot,
    KD,
    k_offset,
    start_n,
    offs_n0,
    offs_m,
    q_len,
    k_len,
    offs_d,
    stride_kt,
    sm_scale,
    CAUSAL: tl.constexpr,
    S_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """(keys, their mask, s, allowed) of the forward's key tile at start_n: the tile's scores against q_dot and
    which (query, key) pairs attend."""
    offs_n = start_n + offs_n0
    key_ok = offs_n < k_len
    k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
    s = _scores(q_dot, k_dot, sm_scale, S_DTYPE, BY_BITS)
    return offs_n, key_ok, s, _allowed(offs_m, offs_n, q_len, k_len, CAUSAL, False)


@triton.jit
def _online_softmax(s, allowed, m_i, l_i):
    """One key tile of the running softmax statistics: (unnormalized P, the old terms' factor, new max, new sum)."""
    s = tl.where(allowed, s, _F32_LOWEST)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.where(allowed, tl.exp(s - m_new[:, None]), 0.0)
    alpha = tl.exp(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit(do_not_specialize=["total_q", "p_seed_key"])
def _jagged_attention_fwd(
    QD,
    KD,
    VT,
    O,
    M,
    L,
    q_offsets,
    k_offsets,
    tile_seq,
    tile_start,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    total_q,
    sm_scale,
    p_seed_key,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    QUANT: tl.constexpr,
    S_DTYPE: tl.constexpr,
    OP_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
    P_CODE: tl.constexpr,
):
    """One BLOCK_M tile of queries of one head, in one pass over the keys. QD, KD: the S operands (quantized
    along the head dim in MX mode), VT: the PV operand (quantized along keys); BF16 mode passes the raw
    tensors. Softmax keeps the running row maximum and sum (flash style): P = exp(s - running maximum) is
    rounded to BF16 (BF16 mode) or quantized along the keys (MX mode: BLOCK_N = 32, one block per row, so the
    running maximum moves once per block, as the contract says), and the output is divided by the sum at
    the end. SiLU needs no statistics."""
    head, q_begin, q_len, k_begin, k_len, n_keys, start_m, offs_m, row_ok, q_offset, k_offset = _sequence_tile(
        q_offsets, k_offsets, tile_seq, tile_start, stride_qt, stride_qh, stride_kt, stride_kh, BLOCK_M, False
    )
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_dot = _load_rows(QD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)

    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, start_m + BLOCK_M)

    m_i = tl.full([BLOCK_M], _F32_LOWEST, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        offs_n, key_ok, s, allowed = _key_scores(
            q_dot,
            KD,
            k_offset,
            start_n,
            offs_n0,
            offs_m,
            q_len,
            k_len,
            offs_d,
            stride_kt,
            sm_scale,
            CAUSAL,
            S_DTYPE,
            DOT_DTYPE,
            BY_BITS,
        )
        v_dot = _load_rows(VT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        if SILU:
            p = _probabilities(s, allowed, 0.0, 1.0, n_keys, True)
        else:
            p, alpha, m_i, l_i = _online_softmax(s, allowed, m_i, l_i)
        p_bits = _score_bits(q_begin + offs_m, head, offs_n, p_seed_key, P_CODE, False)
        p_dot = _dot_operand(_maybe_quant(p, p_bits, BLOCK_M, BLOCK_N, 1, P_CODE, QUANT), OP_DTYPE, DOT_DTYPE, BY_BITS)
        if SILU:
            acc += tl.dot(p_dot, v_dot)
        else:
            acc = acc * alpha[:, None] + tl.dot(p_dot, v_dot)
    if not SILU:
        acc = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)

    out_index = (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    tl.store(O + out_index, _round_to(acc, O.dtype.element_ty, BY_BITS).to(O.dtype.element_ty), mask=row_ok[:, None])
    stat_index = head * total_q + q_begin + offs_m
    tl.store(M + stat_index, m_i, mask=row_ok)
    tl.store(L + stat_index, l_i, mask=row_ok)


@triton.jit
def _transposed_if(tile, TRANSPOSE: tl.constexpr):
    """tile, or its transpose when TRANSPOSE."""
    if TRANSPOSE:
        return tl.trans(tile)
    else:
        return tile


@triton.jit(do_not_specialize=["total_q", "pm_seed_key", "dsm_seed_key", "dsn_seed_key"])
def _jagged_attention_bwd_dkdv(
    QD,
    QT,
    KD,
    KT,
    VD,
    DOD,
    DOT,
    M,
    L,
    DELTA,
    DK,
    DV,
    DQ_ACC,
    q_offsets,
    k_offsets,
    tile_seq,
    tile_start,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    total_q,
    sm_scale,
    pm_seed_key,
    dsm_seed_key,
    dsn_seed_key,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    QUANT: tl.constexpr,
    S_DTYPE: tl.constexpr,
    OP_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
    PM_CODE: tl.constexpr,
    DSM_CODE: tl.constexpr,
    FUSED_DQ: tl.constexpr,
    DSN_CODE: tl.constexpr,
):
    """dK, dV of one BLOCK_N tile of keys of one head. Operands (MX: pre-quantized): QD, KD for S;
    DOD, VD for dP (head dim); QT, DOT along the queries for dK and dV. P and dS are quantized
    here along the queries. FUSED_DQ also adds dS K (dS quantized along the keys, KT: K along
    the keys) into the float32 DQ_ACC with atomics, instead of the separate dQ kernel.
    MX works on the (keys, queries) tile, so P and dS are quantized along its rows (on the H200 the MX
    arms' steps ran 0.3-2.2% faster); BF16 keeps the (queries, keys) tile, whose step ran 4% faster than on
    the other (docs/performance.md, "Design decisions timed by A/B")."""
    head, q_begin, q_len, k_begin, k_len, n_keys, start_n, offs_n, key_ok, q_offset, k_offset = _sequence_tile(
        q_offsets, k_offsets, tile_seq, tile_start, stride_qt, stride_qh, stride_kt, stride_kh, BLOCK_N, True
    )
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
    vd_dot = _load_rows(VD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
    if FUSED_DQ:
        kt_dot = _load_rows(KT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
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
        m_row, l_row, delta_row = _row_statistics(M, L, DELTA, stat_base + offs_m, row_ok)
        dod_dot = _load_rows(DOD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        # MX: the (keys, queries) tile, whose shapes and axes the quantization below takes (BF16 skips it)
        p, ds = _probabilities_and_score_gradient(
            q_dot,
            k_dot,
            dod_dot,
            vd_dot,
            offs_m,
            offs_n,
            q_len,
            k_len,
            m_row,
            l_row,
            delta_row,
            n_keys,
            sm_scale,
            CAUSAL,
            SILU,
            QUANT,
            S_DTYPE,
            BY_BITS,
            QUANT,
        )
        query_rows = q_begin + offs_m
        p_bits = _score_bits(query_rows, head, offs_n, pm_seed_key, PM_CODE, QUANT)
        p_dot = _dot_operand(_maybe_quant(p, p_bits, BLOCK_N, BLOCK_M, 1, PM_CODE, QUANT), OP_DTYPE, DOT_DTYPE, BY_BITS)
        dot_dot = _load_rows(DOT + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        dv += tl.dot(_transposed_if(p_dot, not QUANT), dot_dot)
        ds_bits = _score_bits(query_rows, head, offs_n, dsm_seed_key, DSM_CODE, QUANT)
        ds_dot = _dot_operand(
            _maybe_quant(ds, ds_bits, BLOCK_N, BLOCK_M, 1, DSM_CODE, QUANT), OP_DTYPE, DOT_DTYPE, BY_BITS
        )
        qt_dot = _load_rows(QT + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
        dk += tl.dot(_transposed_if(ds_dot, not QUANT), qt_dot)
        if FUSED_DQ:
            dsn_bits = _score_bits(query_rows, head, offs_n, dsn_seed_key, DSN_CODE, QUANT)
            dsn_dot = _dot_operand(
                _maybe_quant(ds, dsn_bits, BLOCK_N, BLOCK_M, 0, DSN_CODE, QUANT), OP_DTYPE, DOT_DTYPE, BY_BITS
            )
            dq_index = (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
            tl.atomic_add(
                DQ_ACC + dq_index, tl.dot(_transposed_if(dsn_dot, QUANT), kt_dot), mask=row_ok[:, None], sem="relaxed"
            )

    out_index = (k_begin + offs_n)[:, None] * stride_kt + head * stride_kh + offs_d[None, :]
    tl.store(DK + out_index, _round_to(dk, DK.dtype.element_ty, BY_BITS).to(DK.dtype.element_ty), mask=key_ok[:, None])
    tl.store(DV + out_index, _round_to(dv, DV.dtype.element_ty, BY_BITS).to(DV.dtype.element_ty), mask=key_ok[:, None])


@triton.jit(do_not_specialize=["total_q", "dsn_seed_key"])
def _jagged_attention_bwd_dq(
    QD,
    KD,
    KT,
    VD,
    DOD,
    M,
    L,
    DELTA,
    DQ,
    q_offsets,
    k_offsets,
    tile_seq,
    tile_start,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    total_q,
    sm_scale,
    dsn_seed_key,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    QUANT: tl.constexpr,
    S_DTYPE: tl.constexpr,
    OP_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
    DSN_CODE: tl.constexpr,
):
    """dQ of one BLOCK_M tile of queries of one head. KT: K along the keys (MX) for dQ = dS K;
    dS is quantized here along the keys."""
    head, q_begin, q_len, k_begin, k_len, n_keys, start_m, offs_m, row_ok, q_offset, k_offset = _sequence_tile(
        q_offsets, k_offsets, tile_seq, tile_start, stride_qt, stride_qh, stride_kt, stride_kh, BLOCK_M, False
    )
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_dot = _load_rows(QD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
    dod_dot = _load_rows(DOD + q_offset, offs_m, row_ok, offs_d, stride_qt, DOT_DTYPE)
    m_row, l_row, delta_row = _row_statistics(M, L, DELTA, head * total_q + q_begin + offs_m, row_ok)

    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, start_m + BLOCK_M)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < k_len
        k_dot = _load_rows(KD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        vd_dot = _load_rows(VD + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        _, ds = _probabilities_and_score_gradient(
            q_dot,
            k_dot,
            dod_dot,
            vd_dot,
            offs_m,
            offs_n,
            q_len,
            k_len,
            m_row,
            l_row,
            delta_row,
            n_keys,
            sm_scale,
            CAUSAL,
            SILU,
            QUANT,
            S_DTYPE,
            BY_BITS,
            False,
        )
        ds_bits = _score_bits(q_begin + offs_m, head, offs_n, dsn_seed_key, DSN_CODE, False)
        ds_dot = _dot_operand(
            _maybe_quant(ds, ds_bits, BLOCK_M, BLOCK_N, 1, DSN_CODE, QUANT), OP_DTYPE, DOT_DTYPE, BY_BITS
        )
        kt_dot = _load_rows(KT + k_offset, offs_n, key_ok, offs_d, stride_kt, DOT_DTYPE)
        dq += tl.dot(ds_dot, kt_dot)
    out_index = (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    tl.store(DQ + out_index, _round_to(dq, DQ.dtype.element_ty, BY_BITS).to(DQ.dtype.element_ty), mask=row_ok[:, None])
