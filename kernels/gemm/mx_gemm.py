"""Fused MX GEMM: op(a) @ op(b) from the high-precision operands, quantized in registers, FP32 accumulation.

One Triton kernel serves the forward and both backward GEMMs of `mxlab.nn.qmatmul`: each operand is read
through its strides as a (rows, contraction) matrix (no transposed or quantized copies), each K-block of 32
of each operand tile is fake-quantized by the prologue (kernels/gemm/prologue.py: 1-D blocks of 32 or
(32, 32) tiles, every MX element format, scale mode and rounding, stochastic rounding with the contract's
counters, the block-32 random Hadamard transform), and the tensor cores multiply the values.

Exactness. A quantized value has at most 8 significant bits, so it is exact in bfloat16 unless it is a
nonzero value below 2^-126 (bfloat16 subnormals have fewer bits). Values quantized from bfloat16 or float16
inputs never are (docs/numerics.md, "Fused MX GEMM"); for float32 inputs and Hadamard-transformed operands
the kernel checks each K-step's blocks in registers (no host sync): where some block's quantum lies below
2^-126 it multiplies the element values y * 2^-S (exact in bfloat16: the element formats' own values) and
scales that K-block's float32 partial product by 2^(S_a + S_b), as MX hardware applies its two block scales,
in two power-of-two steps (each within [-127, 127], both of the same sign, so no intermediate under- or
overflow that the result does not have). Either way the result is a float32-accumulated product of the
reference's quantized operands; only the order of float32 accumulation differs from any other GEMM.

Under TRITON_INTERPRET=1 (CPU tests) the dot runs on the float32 values (numpy's bfloat16 conversion flushes
subnormals); on CUDA it runs on bfloat16 tensor cores.

Refused (see `unsupported_reason`): per-tensor FP8 and high-precision operands, Hadamard blocks other than
32, dtypes other than float32/bfloat16/float16, operands on different devices, batch dims that differ, CPU
tensors outside the interpreter. mxlab.nn.qmatmul then runs its reference path.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
import triton
import triton.language as tl

from mxlab.numerics.formats import FORMATS, get_format
from mxlab.numerics.seeding import mix32_int
from mxlab.kernels.gemm.prologue import (
    BLOCK,
    DTYPE_KINDS,
    K_BLOCK,
    HADAMARD_COMPILE_OPTIONS,
    _f32_bits_to_output,
    _pow2,
    block_exponents,
    hardware_fp8_applies,
    load_quantized_tile,
    operand_code,
    quantized_operand_kernel,
)

HADAMARD_BLOCK = 32
SQUARE = (BLOCK, BLOCK)
_BITS_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
_MAX_GRID_Y = 65535


@triton.jit
def _dot(x, y, acc, DOT_F32: tl.constexpr):
    """acc + x @ y^T for float32 tiles x (BM, 32), y (BN, 32) holding bfloat16-exact values."""
    if DOT_F32:
        out = tl.dot(x, tl.trans(y), acc, input_precision="ieee")
    else:
        out = tl.dot(x.to(tl.bfloat16), tl.trans(y.to(tl.bfloat16)), acc)
    return out


@triton.jit
def _k_step(acc, k0, a_base, b_base, rows_a, rows_b, M, N, K, stride_am, stride_ak, stride_bn, stride_bk, counter_a,
            cam, cak, counter_b, cbn, cbk, seed_key_a, seed_key_b, hadamard_key, CODE_A: tl.constexpr,
            CODE_B: tl.constexpr, SQUARE_A: tl.constexpr, SQUARE_B: tl.constexpr, HADAMARD: tl.constexpr,
            IN_KIND_A: tl.constexpr, IN_KIND_B: tl.constexpr, CONVERT_BF16: tl.constexpr, MAY_BE_TINY: tl.constexpr,
            DOT_F32: tl.constexpr):
    """acc plus the product of K-block k0 // 32 of both operands, each quantized by the prologue."""
    ya, xa = load_quantized_tile(a_base, rows_a, k0, M, K, stride_am, stride_ak, counter_a, cam, cak, seed_key_a,
                                 hadamard_key, CODE_A, SQUARE_A, HADAMARD, IN_KIND_A, CONVERT_BF16)
    yb, xb = load_quantized_tile(b_base, rows_b, k0, N, K, stride_bn, stride_bk, counter_b, cbn, cbk, seed_key_b,
                                 hadamard_key, CODE_B, SQUARE_B, HADAMARD, IN_KIND_B, CONVERT_BF16)
    if MAY_BE_TINY:
        sa, low_a = block_exponents(xa, CODE_A, SQUARE_A)
        sb, low_b = block_exponents(xb, CODE_B, SQUARE_B)
        tiny = tl.max(low_a.to(tl.int32), axis=0) + tl.max(low_b.to(tl.int32), axis=0)
        if tiny > 0:  # element values times the two block scales, applied to this K-block's partial product
            partial = _dot(ya * _pow2(-sa)[:, None], yb * _pow2(-sb)[:, None], tl.zeros_like(acc), DOT_F32)
            exponent = sa[:, None] + sb[None, :]
            half = exponent >> 1
            acc += partial * _pow2(half) * _pow2(exponent - half)
        else:
            acc = _dot(ya, yb, acc, DOT_F32)
    else:
        acc = _dot(ya, yb, acc, DOT_F32)
    return acc


@triton.jit
def _mx_gemm_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, K_STEPS,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bn, stride_bk, stride_cb, stride_cm, stride_cn,
    cab, cam, cak, cbb, cbn, cbk, seed_key_a, seed_key_b, hadamard_key,
    CODE_A: tl.constexpr, CODE_B: tl.constexpr, SQUARE_A: tl.constexpr, SQUARE_B: tl.constexpr,
    HADAMARD: tl.constexpr, IN_KIND_A: tl.constexpr, IN_KIND_B: tl.constexpr, CONVERT_BF16: tl.constexpr,
    OUT_KIND: tl.constexpr, MAY_BE_TINY: tl.constexpr, DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """C[b] = Q(A[b]) @ Q(B[b])^T for A (M, K) and B (N, K) read through their strides, blocks along K."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows_a = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_b = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    a_base = a_ptr + batch * stride_ab
    b_base = b_ptr + batch * stride_bb
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if DOT_F32:  # the interpreter: its range() takes no runtime bound (numpy 2 refuses int() of its 1-element scalars)
        step = 0
        while step < K_STEPS:
            acc = _k_step(acc, step * K_BLOCK, a_base, b_base, rows_a, rows_b, M, N, K, stride_am, stride_ak, stride_bn,
                          stride_bk, batch * cab, cam, cak, batch * cbb, cbn, cbk, seed_key_a, seed_key_b, hadamard_key,
                          CODE_A, CODE_B, SQUARE_A, SQUARE_B, HADAMARD, IN_KIND_A, IN_KIND_B, CONVERT_BF16, MAY_BE_TINY,
                          DOT_F32)
            step += 1
    else:
        for step in range(0, K_STEPS):
            acc = _k_step(acc, step * K_BLOCK, a_base, b_base, rows_a, rows_b, M, N, K, stride_am, stride_ak, stride_bn,
                          stride_bk, batch * cab, cam, cak, batch * cbb, cbn, cbk, seed_key_a, seed_key_b, hadamard_key,
                          CODE_A, CODE_B, SQUARE_A, SQUARE_B, HADAMARD, IN_KIND_A, IN_KIND_B, CONVERT_BF16, MAY_BE_TINY,
                          DOT_F32)
    c_offsets = batch * stride_cb + rows_a.to(tl.int64)[:, None] * stride_cm + rows_b.to(tl.int64)[None, :] * stride_cn
    c_mask = (rows_a[:, None] < M) & (rows_b[None, :] < N)
    # rounded to nearest even on the bit pattern (the interpreter's own bfloat16 conversion truncates)
    tl.store(c_ptr + c_offsets, _f32_bits_to_output(acc.to(tl.int32, bitcast=True), OUT_KIND), mask=c_mask)


# ----------------------------------------------------------------------------- host side
def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _block_of(quant: Any) -> Any:
    block = quant.block
    return tuple(block) if isinstance(block, (list, tuple)) else block


def unsupported_reason(a: torch.Tensor, b: torch.Tensor, a_quant: Any, b_quant: Any, hadamard: Optional[int] = None) -> Optional[str]:
    """Why `mx_gemm` cannot run op(a) @ op(b) with these operand precisions (objects with fmt, block,
    scale_mode, rounding, e.g. mxlab.nn.qmatmul.OperandQuant) and Hadamard block; None when it can."""
    for name, quant in (("a", a_quant), ("b", b_quant)):
        if quant.fmt not in FORMATS:
            return f"operand {name} has format {quant.fmt!r}; the fused GEMM takes MX formats only ({', '.join(FORMATS)})"
        if _block_of(quant) not in (BLOCK, SQUARE):
            return f"operand {name} has block {quant.block!r}; the fused GEMM takes 32 or (32, 32)"
    if hadamard not in (None, HADAMARD_BLOCK):
        return f"Hadamard block {hadamard!r}; the fused GEMM transforms blocks of {HADAMARD_BLOCK} only"
    for name, x in (("a", a), ("b", b)):
        if x.dtype not in DTYPE_KINDS:
            return f"operand {name} has dtype {x.dtype}; accepted: float32, bfloat16, float16"
        if x.dim() < 2:
            return f"operand {name} has {x.dim()} dims; needs at least 2"
    if a.device != b.device:
        return f"operands on different devices ({a.device}, {b.device})"
    if a.device.type != "cuda" and not (_interpreting() and a.device.type == "cpu"):
        return f"device {a.device} (CUDA, or the CPU under TRITON_INTERPRET=1)"
    if a.shape[:-2] != b.shape[:-2]:
        return f"batch dims differ: {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])}"
    if a[..., :1, :1].numel() > _MAX_GRID_Y:
        return f"{a[..., :1, :1].numel()} batch entries exceed the launch grid ({_MAX_GRID_Y})"
    return None


def _rows_by_contraction(x: torch.Tensor, axis: int, hadamard: bool):
    """(x3, rows, contraction, strides (batch, row, contraction), counter strides (batch, row, contraction)):
    x as (batch, D1, D2) read as a (rows, contraction) matrix whose contraction axis is `axis` (-1 or -2) of
    x's stored layout, and the element counter (linear index in the stored layout, that axis zero-padded to 32
    when a Hadamard transform runs)."""
    x3 = x.reshape(-1, *x.shape[-2:])
    d1, d2 = x3.shape[1], x3.shape[2]
    pad = (lambda size: -(-size // BLOCK) * BLOCK) if hadamard else (lambda size: size)
    if axis == -1:
        d2p = pad(d2)
        return x3, d1, d2, (x3.stride(0), x3.stride(1), x3.stride(2)), (d1 * d2p, d2p, 1)
    d1p = pad(d1)
    return x3, d2, d1, (x3.stride(0), x3.stride(2), x3.stride(1)), (d1p * d2, 1, d2)


def _code(quant: Any, device: torch.device) -> int:
    hw = hardware_fp8_applies(device, get_format(quant.fmt), quant.rounding)
    return operand_code(quant.fmt, quant.scale_mode, quant.rounding, hw_fp8=hw)


def _seed_key(quant: Any, seed: Optional[int]) -> int:
    if quant.rounding != "stochastic":
        return 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"stochastic rounding needs an integer seed, got {seed!r}")
    return mix32_int(seed & 0xFFFFFFFF)


def _check(a: torch.Tensor, b: torch.Tensor, a_quant: Any, b_quant: Any, hadamard_seed: Optional[int]) -> None:
    reason = unsupported_reason(a, b, a_quant, b_quant, None if hadamard_seed is None else HADAMARD_BLOCK)
    if reason is not None:
        raise ValueError(f"mx_gemm cannot run this call: {reason}")
    if hadamard_seed is not None and (isinstance(hadamard_seed, bool) or not isinstance(hadamard_seed, int)):
        raise ValueError(f"hadamard_seed must be an integer or None, got {hadamard_seed!r}")


def mx_gemm(a: torch.Tensor, b: torch.Tensor, a_quant: Any, b_quant: Any, *, transpose_a: bool = False,
            transpose_b: bool = False, seeds: tuple[Optional[int], Optional[int]] = (None, None),
            hadamard_seed: Optional[int] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """op(Q(a)) @ op(Q(b)), op a transpose of the last two dims where asked, in `out_dtype` (default a's).

    a and b have equal leading (batch) dims; every operand is quantized with blocks along the contraction
    axis of its stored layout (a: -1, or -2 when transposed; b: -2, or -1 when transposed) as its quant
    (fmt, block, scale_mode, rounding) says, exactly as `mxlab.numerics.quant.fake_quantize(x, fmt, axis=...,
    pad=True)` would, with stochastic rounding counting elements by their linear index there (`seeds`: the
    seeds of a and b); `hadamard_seed` first transforms both along the contraction axis (block 32, zero-padded
    to a multiple of 32: `hadamard_fake_quantize`). Accumulation is float32. Refuses (ValueError) what
    `unsupported_reason` names, contraction sizes that differ, and stochastic rounding without a seed.
    """
    _check(a, b, a_quant, b_quant, hadamard_seed)
    out_dtype = out_dtype or a.dtype
    if out_dtype not in DTYPE_KINDS:
        raise ValueError(f"out_dtype {out_dtype}; accepted: float32, bfloat16, float16")
    hadamard = hadamard_seed is not None
    a3, m, k, a_strides, a_counter = _rows_by_contraction(a, -2 if transpose_a else -1, hadamard)
    b3, n, kb, b_strides, b_counter = _rows_by_contraction(b, -1 if transpose_b else -2, hadamard)
    if k != kb:
        raise ValueError(f"contraction sizes differ: {k} and {kb} (a {tuple(a.shape)}, b {tuple(b.shape)})")
    batch = a3.shape[0]
    out = torch.empty((batch, m, n), dtype=out_dtype, device=a.device)
    interpreting = _interpreting()
    may_be_tiny = hadamard or a.dtype == torch.float32 or b.dtype == torch.float32
    heavy = may_be_tiny or "stochastic" in (a_quant.rounding, b_quant.rounding)
    # (128, 128) tiles, 8 warps; (128, 64) where the prologue needs more registers (sm_90 ptxas: no spills)
    block_m, block_n = (64, 64) if interpreting else (128, 64 if heavy else 128)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), batch)
    options = dict(HADAMARD_COMPILE_OPTIONS) if hadamard else {}
    if m and n:
        _mx_gemm_kernel[grid](
            a3.view(_BITS_DTYPES[a.dtype]), b3.view(_BITS_DTYPES[b.dtype]), out.view(_BITS_DTYPES[out.dtype]), m, n, k, triton.cdiv(k, BLOCK), *a_strides, *b_strides,
            *out.stride(), *a_counter, *b_counter, _seed_key(a_quant, seeds[0]), _seed_key(b_quant, seeds[1]),
            mix32_int(hadamard_seed & 0xFFFFFFFF) if hadamard else 0,
            CODE_A=_code(a_quant, a.device), CODE_B=_code(b_quant, b.device), SQUARE_A=_block_of(a_quant) == SQUARE,
            SQUARE_B=_block_of(b_quant) == SQUARE, HADAMARD=hadamard, IN_KIND_A=DTYPE_KINDS[a.dtype],
            IN_KIND_B=DTYPE_KINDS[b.dtype], OUT_KIND=DTYPE_KINDS[out.dtype], CONVERT_BF16=not interpreting, MAY_BE_TINY=may_be_tiny,
            DOT_F32=interpreting, BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8,
            num_warps=4 if interpreting else 8, num_stages=3, **options,
        )
    return out.reshape(*a.shape[:-2], m, n)


def quantized_operand(x: torch.Tensor, quant: Any, *, axis: int = -1, seed: Optional[int] = None,
                      hadamard_seed: Optional[int] = None) -> torch.Tensor:
    """The operand the fused GEMM multiplies, from the same prologue device code: x quantized with blocks
    along `axis` (-1 or -2) as `mx_gemm` quantizes it, float32, x's shape with `axis` zero-padded to a
    multiple of 32 (the padding holds zeros, or with `hadamard_seed` what the transform gives it). For
    tests. Refuses what `mx_gemm` refuses and an axis other than -1 or -2."""
    if axis not in (-1, -2):
        raise ValueError(f"axis must be -1 or -2, got {axis!r}")
    _check(x, x, quant, quant, hadamard_seed)
    hadamard = hadamard_seed is not None
    x3, rows, k, strides, counter = _rows_by_contraction(x, axis, hadamard)
    kp = -(-k // BLOCK) * BLOCK
    out = torch.empty((x3.shape[0], rows, kp), dtype=torch.float32, device=x.device)
    block_r = 64
    grid = (triton.cdiv(rows, block_r), kp // BLOCK, x3.shape[0])
    if rows and kp:
        quantized_operand_kernel[grid](
            x3.view(_BITS_DTYPES[x.dtype]), out, rows, k, kp, *strides, *counter, _seed_key(quant, seed),
            mix32_int(hadamard_seed & 0xFFFFFFFF) if hadamard else 0, CODE=_code(quant, x.device),
            SQUARE=_block_of(quant) == SQUARE, HADAMARD=hadamard, IN_KIND=DTYPE_KINDS[x.dtype],
            CONVERT_BF16=not _interpreting(), BLOCK_R=block_r, **(dict(HADAMARD_COMPILE_OPTIONS) if hadamard else {}),
        )
    out = out.reshape(*x.shape[:-2], rows, kp)
    return out if axis == -1 else out.transpose(-1, -2).contiguous()
