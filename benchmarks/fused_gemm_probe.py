"""Would a GEMM that quantizes its operands in registers beat today's cast kernels + cuBLAS at the h200 model's
linear shapes? An exploration, not imported by the library.

For each (M, K, N) it times, on one GPU, the three GEMMs of one linear layer's training step (forward
Q(a) @ Q(w)^T with blocks along K, dgrad Q(g) @ Q(w) with blocks along N, wgrad Q(g)^T @ Q(a) with blocks
along M) three ways: cuBLAS on BF16 operands (the baseline), today's path (mxlab's fake_quantize cast
kernels, then cuBLAS), and Triton GEMMs that read the BF16 operands and quantize each 32-block in registers
through the hardware FP8 conversion (the cast kernels' device functions: `_scale_exponent`,
`_hw_fp8_finite_elements`), the small weight pre-quantized by the cast kernel. Each median is a CUDA-graph
replay (device time only). Exactness is checked, not assumed: a Triton kernel that writes the in-register
quantized tile out must equal mxlab's fake_quantize bit for bit, and each fused product must equal a float32
matmul of the reference-quantized operands within float32 accumulation order. Finite inputs only (a
NaN/Inf block takes the cast kernels' special path, which this probe leaves out).

    python3 benchmarks/fused_gemm_probe.py --m 1048576 --shape 256x768 --shape 256x256 --shape 256x1024 --shape 1024x256

On the H200 the K-loop kernel's dgrad was wrong (0.08-0.09 of the max) with the weight read through its
transpose (stride 1 along the output) and right with a contiguous copy. `--layout-check` runs that kernel
unquantized under the Triton interpreter on the CPU, float32, with both weight layouts:

    TRITON_INTERPRET=1 python3 benchmarks/fused_gemm_probe.py --layout-check
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from mxlab.bench.timing import graph_ms
from mxlab.kernels.cast.bits import _scale_exponent
from mxlab.kernels.cast.elements import _hw_fp8_finite_elements
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.quant import fake_quantize
from mxlab.numerics.vocab import ScaleMode, kernel_code


@triton.jit
def _quantize_tile(x, AXIS: tl.constexpr, CODE: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """bfloat16 fake-quantized values of an (R, C) bfloat16 tile, blocks of 32 along AXIS (1: its columns,
    0: its rows)."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    if AXIS == 1:
        bits = tl.reshape(bits, (R, C // 32, 32))
        s, _ = _scale_exponent(tl.max(bits & 0x7FFFFFFF, axis=2), CODE)
        _, out = _hw_fp8_finite_elements(bits, s[:, :, None], 1, CODE)
    else:
        bits = tl.reshape(bits, (R // 32, 32, C))
        s, _ = _scale_exponent(tl.max(bits & 0x7FFFFFFF, axis=1), CODE)
        _, out = _hw_fp8_finite_elements(bits, s[:, None, :], 1, CODE)
    return tl.reshape(out.to(tl.bfloat16, bitcast=True), (R, C))


@triton.jit
def _grouped_tile(tile, grid_m, grid_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of output tile number `tile`, GROUP_M row tiles at a time (L2 reuse of W)."""
    per_group = GROUP_M * grid_n
    first_m = (tile // per_group) * GROUP_M
    rows_in_group = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows_in_group, (tile % per_group) // rows_in_group


@triton.jit
def _rows_gemm(
    x_ptr,
    w_ptr,
    c_ptr,
    M,
    N,
    KC,
    sxm,
    sxk,
    swn,
    swk,
    scm,
    scn,
    CODE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,
    QUANT: tl.constexpr = True,
):
    """C = Q(X) @ W^T (X as loaded where not QUANT: the control): X (M, KC) quantized in registers along KC,
    W (N, KC) already quantized; KC % BK == 0."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, KC, BK, num_stages=STAGES):
        x = tl.load(x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :] * sxk, mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[None, :] * swn + (k0 + rk)[:, None] * swk, mask=rn[None, :] < N, other=0.0)
        if QUANT:
            x = _quantize_tile(x, 1, CODE, BM, BK)
        acc = tl.dot(x, w, acc)
    tl.store(
        c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N)
    )


@triton.jit
def _rows_gemm_stationary(
    x_ptr,
    w_ptr,
    c_ptr,
    M,
    N,
    sxm,
    sxk,
    swn,
    swk,
    scm,
    scn,
    CODE: tl.constexpr,
    KC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    STAGES: tl.constexpr,
    QUANT: tl.constexpr = True,
):
    """C = Q(X) @ W^T with the whole contraction (KC) of a BM-row block of X quantized once, in registers, and
    kept there while the program runs over every BN-column tile of C (each element of X quantized once)."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rk = tl.arange(0, KC)
    rn = tl.arange(0, BN)
    x = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :] * sxk, mask=rm[:, None] < M, other=0.0)
    if QUANT:
        x = _quantize_tile(x, 1, CODE, BM, KC)
    for n0 in tl.range(0, N, BN, num_stages=STAGES):
        w = tl.load(w_ptr + (n0 + rn)[None, :] * swn + rk[:, None] * swk, mask=(n0 + rn)[None, :] < N, other=0.0)
        acc = tl.dot(x, w)
        tl.store(
            c_ptr + rm[:, None] * scm + (n0 + rn)[None, :] * scn,
            acc.to(tl.bfloat16),
            mask=(rm[:, None] < M) & ((n0 + rn)[None, :] < N),
        )


@triton.jit
def _rows_gemm_persistent(
    x_desc,
    w_desc,
    c_desc,
    M,
    N,
    KC,
    CODE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    STAGES: tl.constexpr,
    QUANT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """`_rows_gemm` as a persistent kernel over output tiles with TMA loads and stores (host tensor
    descriptors: X (M, KC), W (N, KC), C (M, N)), the outer loop flattened so the next tile's loads overlap
    this tile's epilogue."""
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(KC, BK)
    for tile in tl.range(tl.program_id(0), grid_m * grid_n, NUM_SMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _grouped_tile(tile, grid_m, grid_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            x = x_desc.load([pid_m * BM, ki * BK])
            if QUANT:
                x = _quantize_tile(x, 1, CODE, BM, BK)
            w = w_desc.load([pid_n * BN, ki * BK])
            acc = tl.dot(x, w.T, acc)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


@triton.jit
def _cols_gemm(
    g_ptr,
    a_ptr,
    part_ptr,
    M,
    N,
    K,
    ROWS_PER_SPLIT,
    sgm,
    sgn,
    sam,
    sak,
    CODE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    STAGES: tl.constexpr,
    QUANT: tl.constexpr = True,
):
    """part[split] = Q(G[rows])^T @ Q(A[rows]) over this split's rows, both quantized in registers along M."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    split = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_k * BK + tl.arange(0, BK)
    first = split.to(tl.int64) * ROWS_PER_SPLIT
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for m0 in tl.range(0, ROWS_PER_SPLIT, BM, num_stages=STAGES):
        rm = first + m0 + tl.arange(0, BM).to(tl.int64)
        g = tl.load(
            g_ptr + rm[:, None] * sgm + rn[None, :] * sgn, mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0
        )
        a = tl.load(
            a_ptr + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0
        )
        if QUANT:
            g = _quantize_tile(g, 0, CODE, BM, BN)
            a = _quantize_tile(a, 0, CODE, BM, BK)
        acc = tl.dot(tl.trans(g), a, acc)
    tl.store(
        part_ptr + split.to(tl.int64) * N * K + rn[:, None] * K + rk[None, :],
        acc,
        mask=(rn[:, None] < N) & (rk[None, :] < K),
    )


@triton.jit
def _write_quantized(x_ptr, y_ptr, M, C, AXIS: tl.constexpr, CODE: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    """Y = the GEMMs' in-register quantization of X (M, C) contiguous: the exactness check's view of it."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    offsets = rm[:, None] * C + rc[None, :]
    mask = (rm[:, None] < M) & (rc[None, :] < C)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(y_ptr + offsets, _quantize_tile(x, AXIS, CODE, BM, BC), mask=mask)


PERSISTENT_SWEEP = (
    (128, 128, 64, 8, 3, False),
    (128, 256, 64, 8, 3, False),
    (128, 128, 64, 4, 4, False),
    (128, 256, 64, 8, 3, True),
    (128, 128, 64, 8, 3, True),
)
SWEEP = ((128, 256, 64, 8, 3), (128, 128, 128, 8, 3), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 8, 3))


def constants(fmt: str, scale_mode: str) -> dict:
    return dict(CODE=kernel_code(FORMATS[fmt], scale_mode, "nearest_even", hw_fp8=True))


def rows_gemm(x, w_q, const, bm=128, bn=128, bk=64, group_m=8, stages=3, warps=8, quant=True):
    """Q(x) @ w_q^T, x (M, KC) bfloat16 quantized along KC in registers, w_q (N, KC) already quantized."""
    m, kc = x.shape
    n = w_q.shape[0]
    c = torch.empty(m, n, device=x.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _rows_gemm[grid](
        x,
        w_q,
        c,
        m,
        n,
        kc,
        x.stride(0),
        x.stride(1),
        w_q.stride(0),
        w_q.stride(1),
        c.stride(0),
        c.stride(1),
        **const,
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP_M=group_m,
        STAGES=stages,
        QUANT=quant,
        num_warps=warps,
    )
    return c


def rows_gemm_persistent(
    x, w_q, const, bm=128, bn=128, bk=64, group_m=8, stages=3, warps=8, quant=True, warp_specialize=False
):
    """`rows_gemm` by `_rows_gemm_persistent` (x, w_q contiguous)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, kc = x.shape
    n = w_q.shape[0]
    c = torch.empty(m, n, device=x.device, dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    _rows_gemm_persistent[(min(sms, tiles),)](
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(w_q, [bn, bk]),
        TensorDescriptor.from_tensor(c, [bm, bn]),
        m,
        n,
        kc,
        **const,
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP_M=group_m,
        NUM_SMS=sms,
        STAGES=stages,
        QUANT=quant,
        WARP_SPECIALIZE=warp_specialize,
        num_warps=warps,
        num_stages=stages,
    )
    return c


def rows_gemm_stationary(x, w_q, const, bm=128, bn=128, stages=2, warps=8, quant=True):
    """`rows_gemm` by `_rows_gemm_stationary` (KC a power of two, at most 512)."""
    m, kc = x.shape
    n = w_q.shape[0]
    c = torch.empty(m, n, device=x.device, dtype=torch.bfloat16)
    _rows_gemm_stationary[(triton.cdiv(m, bm),)](
        x,
        w_q,
        c,
        m,
        n,
        x.stride(0),
        x.stride(1),
        w_q.stride(0),
        w_q.stride(1),
        c.stride(0),
        c.stride(1),
        **const,
        KC=kc,
        BM=bm,
        BN=bn,
        STAGES=stages,
        QUANT=quant,
        num_warps=warps,
    )
    return c


def cols_gemm(g, a, const, splits=128, bm=64, bn=128, bk=128, stages=3, warps=8, quant=True):
    """Q(g)^T @ Q(a), both quantized along M in registers, the splits' float32 partials summed by torch."""
    m, n = g.shape
    k = a.shape[1]
    rows = triton.cdiv(triton.cdiv(m, splits), bm) * bm
    splits = triton.cdiv(m, rows)
    part = torch.empty(splits, n, k, device=g.device, dtype=torch.float32)
    _cols_gemm[(triton.cdiv(n, bn), triton.cdiv(k, bk), splits)](
        g,
        a,
        part,
        m,
        n,
        k,
        rows,
        g.stride(0),
        g.stride(1),
        a.stride(0),
        a.stride(1),
        **const,
        BM=bm,
        BN=bn,
        BK=bk,
        STAGES=stages,
        QUANT=quant,
        num_warps=warps,
    )
    return part.sum(0).to(torch.bfloat16)


def in_register_values(x, const, along_rows: bool):
    y = torch.empty_like(x)
    bm, bc = (64, 64)
    _write_quantized[(triton.cdiv(x.shape[0], bm), triton.cdiv(x.shape[1], bc))](
        x, y, x.shape[0], x.shape[1], 0 if along_rows else 1, **const, BM=bm, BC=bc
    )
    return y


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def probe(m: int, k: int, n: int, fmt: str, scale_mode: str, repeat: int) -> dict:
    torch.manual_seed(0)
    spread = lambda low, high: torch.exp2(torch.randint(low, high, (m, 1), device="cuda").float())  # noqa: E731
    a = (torch.randn(m, k, device="cuda") * spread(-6, 7)).bfloat16()
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    g = (torch.randn(m, n, device="cuda") * spread(-20, -8)).bfloat16()
    const = constants(fmt, scale_mode)
    fq = lambda x, axis: fake_quantize(x, fmt, axis=axis, scale_mode=scale_mode)  # noqa: E731
    w_k, w_n = fq(w, -1), fq(w, 0)

    exact = {
        "a rows bits equal": bool(
            torch.equal(in_register_values(a, const, False).view(torch.int16), fq(a, -1).view(torch.int16))
        ),
        "g cols bits equal": bool(
            torch.equal(in_register_values(g, const, True).view(torch.int16), fq(g, 0).view(torch.int16))
        ),
    }
    ref_fwd = fq(a, -1).float() @ w_k.float().t()
    ref_dgrad = fq(g, -1).float() @ w_n.float()
    ref_wgrad = fq(g, 0).float().t() @ fq(a, 0).float()
    exact["fwd rel err"] = relative_error(rows_gemm(a, w_k, const), ref_fwd)
    exact["dgrad rel err"] = relative_error(rows_gemm(g, w_n.t(), const), ref_dgrad)
    exact["wgrad rel err"] = relative_error(cols_gemm(g, a, const), ref_wgrad)
    exact["cuBLAS fwd rel err (same operands)"] = relative_error(fq(a, -1) @ w_k.t(), ref_fwd)
    exact["cuBLAS dgrad rel err (same operands)"] = relative_error(fq(g, -1) @ w_n, ref_dgrad)
    exact["dgrad rel err, contiguous w"] = relative_error(rows_gemm(g, w_n.t().contiguous(), const), ref_dgrad)
    try:
        exact["persistent fwd rel err"] = relative_error(rows_gemm_persistent(a, w_k, const), ref_fwd)
    except Exception as error:  # noqa: BLE001  recorded: the timing below says the same
        exact["persistent fwd rel err"] = f"{type(error).__name__}: {str(error)[:200]}"
    if k <= 512:
        exact["stationary fwd rel err"] = relative_error(rows_gemm_stationary(a, w_k, const), ref_fwd)
    exact["g rows bits equal"] = bool(
        torch.equal(in_register_values(g, const, False).view(torch.int16), fq(g, -1).view(torch.int16))
    )
    del ref_fwd, ref_dgrad, ref_wgrad

    def ms(step) -> float:
        try:
            return graph_ms(step, warmup=3, repeat=repeat)
        except Exception as error:  # noqa: BLE001  a configuration that does not compile or fit: recorded, not fatal
            print(f"   (not timed: {type(error).__name__}: {str(error)[:200]})", flush=True)
            return float("nan")

    times = {
        "bf16 fwd": ms(lambda: a @ w.t()),
        "bf16 dgrad": ms(lambda: g @ w),
        "bf16 wgrad": ms(lambda: g.t() @ a),
        "cast+cuBLAS fwd": ms(lambda: fq(a, -1) @ w_k.t()),
        "cast+cuBLAS dgrad": ms(lambda: fq(g, -1) @ w_n),
        "cast+cuBLAS wgrad": ms(lambda: fq(g, 0).t() @ fq(a, 0)),
        "cast only a rows": ms(lambda: fq(a, -1)),
        "cast only a cols": ms(lambda: fq(a, 0)),
        "fused fwd": ms(lambda: rows_gemm(a, w_k, const)),
        "fused dgrad": ms(lambda: rows_gemm(g, w_n.t(), const)),
        "fused wgrad": ms(lambda: cols_gemm(g, a, const)),
        "triton fwd (no quantization)": ms(lambda: rows_gemm(a, w_k, const, quant=False)),
        "triton dgrad (no quantization)": ms(lambda: rows_gemm(g, w_n.t(), const, quant=False)),
        "triton wgrad (no quantization)": ms(lambda: cols_gemm(g, a, const, quant=False)),
    }
    for bm, bn, bk, warps, stages, ws in PERSISTENT_SWEEP:
        name = f"{bm}x{bn}x{bk} w{warps} s{stages}{' ws' if ws else ''}"
        times[f"fused fwd persistent {name}"] = ms(
            lambda: rows_gemm_persistent(
                a, w_k, const, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, warp_specialize=ws
            )
        )
        times[f"triton fwd persistent {name}"] = ms(
            lambda: rows_gemm_persistent(
                a, w_k, const, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, quant=False, warp_specialize=ws
            )
        )
    if k <= 512:
        for bm, bn, warps, stages in ((128, 128, 8, 2), (64, 128, 4, 2), (128, 256, 8, 2), (64, 256, 8, 2)):
            times[f"fused fwd stationary {bm}x{bn} w{warps} s{stages}"] = ms(
                lambda: rows_gemm_stationary(a, w_k, const, bm=bm, bn=bn, warps=warps, stages=stages)
            )
            times[f"triton fwd stationary {bm}x{bn} w{warps} s{stages}"] = ms(
                lambda: rows_gemm_stationary(a, w_k, const, bm=bm, bn=bn, warps=warps, stages=stages, quant=False)
            )
    for bm, bn, bk, warps, stages in SWEEP:
        times[f"fused fwd {bm}x{bn}x{bk} w{warps} s{stages}"] = ms(
            lambda: rows_gemm(a, w_k, const, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages)
        )
        times[f"triton fwd {bm}x{bn}x{bk} w{warps} s{stages}"] = ms(
            lambda: rows_gemm(a, w_k, const, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, quant=False)
        )
    return {"m": m, "k": k, "n": n, "fmt": fmt, "scale_mode": scale_mode, "exact": exact, "ms": times}


def layout_check(m: int = 128) -> list[dict]:
    """Relative error of the unquantized K-loop kernel's dgrad against a float32 matmul, for the weight
    read through its transpose and as a contiguous copy, at the h200 widths (CPU interpreter; float32
    operands, since the interpreter's bfloat16 dot is unreliable). Refuses to run compiled (RuntimeError)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("--layout-check runs under the interpreter: set TRITON_INTERPRET=1")
    import mxlab.kernels.attention.device  # noqa: F401  its import lets the interpreter take loaded loop bounds

    torch.manual_seed(0)
    const = constants("e4m3", "rceil")
    rows = []
    for k, n in ((256, 768), (256, 1024), (1024, 256)):
        w = (torch.randn(n, k) * 0.05).bfloat16().float()
        g = torch.randn(m, n).bfloat16().float()
        want = g @ w
        for layout, w_q in (("transposed view", w.t()), ("contiguous copy", w.t().contiguous())):
            for bk in (32, 64):
                got = rows_gemm(g, w_q, const, bm=64, bn=64, bk=bk, warps=4, quant=False)
                rows.append({"k": k, "n": n, "weight": layout, "bk": bk, "rel err": relative_error(got, want)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=1 << 20, help="rows (tokens) of the layer's input")
    parser.add_argument("--shape", action="append", metavar="KxN", help="in x out features (repeatable)")
    parser.add_argument("--fmt", default="e4m3", choices=("e4m3", "e5m2"))
    parser.add_argument("--scale-mode", default="rceil", choices=tuple(ScaleMode))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--layout-check",
        action="store_true",
        help="only the dgrad weight-layout check on the CPU (needs TRITON_INTERPRET=1)",
    )
    args = parser.parse_args()
    if args.layout_check:
        for row in layout_check():
            print(
                f"   dgrad {row['k']}x{row['n']} weight {row['weight']:16s} "
                f"BK {row['bk']:3d}: rel err {row['rel err']:.2e}"
            )
        return
    results = []
    for shape in args.shape or ["256x768", "256x256", "256x1024", "1024x256"]:
        k, n = (int(v) for v in shape.split("x"))
        result = probe(args.m, k, n, args.fmt, args.scale_mode, args.repeat)
        results.append(result)
        print(f"== M={args.m} K={k} N={n} {args.fmt} {args.scale_mode}: {result['exact']}")
        t = result["ms"]
        for name in ("fwd", "dgrad", "wgrad"):
            base = t[f"bf16 {name}"]
            print(
                f"   {name:6s} bf16 {base:7.3f} ms   cast+cuBLAS {t[f'cast+cuBLAS {name}']:7.3f} "
                f"({t[f'cast+cuBLAS {name}'] / base:4.2f}x)   fused "
                f"{t[f'fused {name}']:7.3f} ({t[f'fused {name}'] / base:4.2f}x)"
            )
        for name in t:
            if name.startswith(("triton", "fused fwd ")):
                print(f"   {name:42s} {t[name]:7.3f} ms")
        print(f"   casts alone: a rows {t['cast only a rows']:.3f} ms, a cols {t['cast only a cols']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
