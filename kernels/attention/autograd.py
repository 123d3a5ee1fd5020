"""The autograd function of jagged attention: pre-quantization, the forward kernel, and the backward's dK/dV
and dQ kernels (or dQ fused into dK/dV by atomics)."""

from __future__ import annotations

from typing import Any

import torch

from mxlab.kernels.attention.codes import _HeadDimCasts, _OperandCodes, _SeedKeys
from mxlab.kernels.attention.kernels import _jagged_attention_bwd_dkdv, _jagged_attention_bwd_dq, _jagged_attention_fwd
from mxlab.kernels.attention.launch import _head_dim_quantized, _launch_options, _prequantized, _row_dots
from mxlab.kernels.attention.tiles import TileSizes, _tensor_version, _tiles


class _JaggedAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_offsets: torch.Tensor,
        k_offsets: torch.Tensor,
        causal: bool,
        silu: bool,
        codes: _OperandCodes | None,
        seeds: _SeedKeys,
        casts: _HeadDimCasts | None,
        tiles: TileSizes,
    ) -> torch.Tensor:  # type: ignore[override]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        total_q, heads, head_dim = q.shape
        quant = codes is not None
        # Every query row of every sequence is written, zeros where a sequence has no keys.
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        m = torch.empty(heads, total_q, device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        if quant:
            q_d, k_d = _head_dim_quantized(q, casts.q_d, casts.launch), _head_dim_quantized(k, casts.k_d, casts.launch)
            v_t, _ = _prequantized(v, k_offsets, codes.v_n, seed_key=seeds.v_n)
        else:
            q_d, k_d, v_t = q, k, v
        tile_seq, tile_start = _tiles(q_offsets, total_q, k_offsets, tiles.fwd_m)
        if tile_seq.numel() and heads:
            _jagged_attention_fwd[(tile_seq.numel(), heads)](
                q_d,
                k_d,
                v_t,
                out,
                m,
                l,
                q_offsets,
                k_offsets,
                tile_seq,
                tile_start,
                q.stride(0),
                q.stride(1),
                k.stride(0),
                k.stride(1),
                total_q,
                head_dim**-0.5,
                seeds.p_n,
                BLOCK_M=tiles.fwd_m,
                BLOCK_N=tiles.fwd_n,
                P_CODE=codes.p_n if quant else 0,
                **_launch_options(q, silu, causal, quant, tiles),
            )
        # Saved as BF16 mode saves them, in both modes: the high-precision inputs, the output and the softmax
        # statistics, no quantized copies; the backward quantizes the inputs again (deterministic, the same
        # seeds: the same bits), so the copies live only while one attention's backward runs.
        ctx.save_for_backward(q, k, v, out, m, l)
        # The offsets stay on ctx as the same Python objects, so the backward finds their tile
        # tables cached on them; their versions are checked as saved tensors' would be.
        ctx.offsets = (q_offsets, k_offsets, _tensor_version(q_offsets), _tensor_version(k_offsets))
        ctx.settings = (causal, silu, codes, seeds, casts, tiles)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        q, k, v, out, m, l = ctx.saved_tensors
        q_offsets, k_offsets, q_offsets_version, k_offsets_version = ctx.offsets
        if _tensor_version(q_offsets) != q_offsets_version or _tensor_version(k_offsets) != k_offsets_version:
            raise RuntimeError(
                "jagged attention: q_offsets or k_offsets were modified in place between the forward and the backward"
            )
        causal, silu, codes, seeds, casts, tiles = ctx.settings
        grad_out = grad_out.contiguous()
        total_q, heads, head_dim = q.shape
        quant = codes is not None
        # The softmax row term, in both modes: rowsum(dO * O) of the incoming gradient and the output (in MX mode
        # from the launch that quantizes dO). SiLU reads none.
        row_term_with = None if silu else out
        if quant:
            # Each orientation in its own launch: along the head dim the cast kernels' row fake-quantize, along the
            # tokens `_prequantize`. On the H200 at the h200 step's history shape one launch for both orientations
            # took 1.21 ms (e4m3, nearest even) and 4.0 ms (stochastic, with the row dots)
            # (docs/performance.md, "The attention's pre-quantization launches"); the two launches apart took
            # 0.37 + 0.62 ms for e4m3 (same section). Stochastic apart: not timed.
            q_d, k_d = _head_dim_quantized(q, casts.q_d, casts.launch), _head_dim_quantized(k, casts.k_d, casts.launch)
            v_d = _head_dim_quantized(v, casts.v_d, casts.launch)
            do_d = _head_dim_quantized(grad_out, casts.do_d, casts.launch)
            q_t, _ = _prequantized(q, q_offsets, codes.q_m, seed_key=seeds.q_m)
            k_t, _ = _prequantized(k, k_offsets, codes.k_n, seed_key=seeds.k_n)
            do_t, delta = _prequantized(grad_out, q_offsets, codes.do_m, dot_with=row_term_with, seed_key=seeds.do_m)
        else:
            q_d, q_t, k_d, k_t, v_d = q, q, k, k, v
            do_d, do_t, delta = grad_out, grad_out, None if silu else _row_dots(grad_out, row_term_with)
        if delta is None:
            delta = m  # not read
        # Every key row of every sequence with keys is written (zeros where a sequence has no
        # queries), and so is every query row by the dQ kernel; the fused dQ accumulates atomically.
        dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dv = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dq = None if tiles.fused_dq else torch.empty(q.shape, device=q.device, dtype=q.dtype)
        dq_accumulator = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if tiles.fused_dq else dq
        options = _launch_options(q, silu, causal, quant, tiles)
        strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), total_q, head_dim**-0.5)
        kv_seq, kv_start = _tiles(k_offsets, k.shape[0], q_offsets, tiles.dkdv_n)
        if kv_seq.numel() and heads:
            _jagged_attention_bwd_dkdv[(kv_seq.numel(), heads)](
                q_d,
                q_t,
                k_d,
                k_t,
                v_d,
                do_d,
                do_t,
                m,
                l,
                delta,
                dk,
                dv,
                dq_accumulator,
                q_offsets,
                k_offsets,
                kv_seq,
                kv_start,
                *strides,
                seeds.p_m,
                seeds.ds_m,
                seeds.ds_n,
                BLOCK_M=tiles.dkdv_m,
                BLOCK_N=tiles.dkdv_n,
                PM_CODE=codes.p_m if quant else 0,
                DSM_CODE=codes.ds_m if quant else 0,
                FUSED_DQ=tiles.fused_dq,
                DSN_CODE=codes.ds_n if quant else 0,
                **options,
                **({} if tiles.dkdv_max_registers is None else {"maxnreg": tiles.dkdv_max_registers}),
            )
        if tiles.fused_dq:
            return dq_accumulator.to(q.dtype), dk, dv, None, None, None, None, None, None, None, None
        q_seq, q_start = _tiles(q_offsets, total_q, k_offsets, tiles.dq_m)
        if q_seq.numel() and heads:
            _jagged_attention_bwd_dq[(q_seq.numel(), heads)](
                q_d,
                k_d,
                k_t,
                v_d,
                do_d,
                m,
                l,
                delta,
                dq,
                q_offsets,
                k_offsets,
                q_seq,
                q_start,
                *strides,
                seeds.ds_n,
                BLOCK_M=tiles.dq_m,
                BLOCK_N=tiles.dq_n,
                DSN_CODE=codes.ds_n if quant else 0,
                **options,
            )
        return dq, dk, dv, None, None, None, None, None, None, None, None
