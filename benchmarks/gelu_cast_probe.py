"""Would the MLP's GELU write the quantized copies of its output itself? One kernel in place of GELU + cast, at the
h200 model's hidden activation (M x 1024), forward and backward. An exploration, not imported by the library.

`benchmarks/cast_traffic.py` says an MX step reaches 1.15x of BF16 only if the copies are written by the kernels that
produce their sources. The MLP is the simplest producer: fc2 multiplies gelu(h) quantized along its rows, and fc1's
backward quantizes g = gelu'(h) * dy along both dims (the one-read pair, with the bias gradient's column sums).
This probe times, by CUDA-graph replay (device time):

- copy: an M x N bfloat16 copy, the bandwidth yardstick;
- backward today: `aten.gelu_backward(dy, h)`, then `fake_quantize_rowcol(g, column_sums=True)` (the library's pair);
- backward fused: one kernel reads dy and h, computes g as PyTorch's GeluBackward does (float32, erf and exp from
  libdevice), rounds it to bfloat16 and writes g's row- and column-quantized copies and its column sums;
- forward today: `gelu(h)`, then the row cast; forward fused: one kernel reads h, writes gelu(h) (fc2 keeps it for
  its weight gradient) and its row-quantized copy.

Exactness is measured, not assumed: the share of g and gelu(h) elements whose bfloat16 bits differ from PyTorch's
(any would make the fused path a different model, not the same one faster), and the fused copies against the
library's casts of the fused kernel's own g and gelu(h), bit for bit; and GELU of every finite bfloat16 input,
with erf and exp of GELU's own arguments against torch.erf / torch.exp (which function makes the bits differ).
e4m3, rceil, round to nearest even, with the
hardware FP8 conversion (the in-register quantizer of `fused_gemm_probe.py`); finite inputs only.

    python3 benchmarks/gelu_cast_probe.py [--m 1482752] [--n 1024] [--json probe.json] [--no-fp-fusion] [--erf-table]
        (--erf-table: both kernels read erf from a table of torch.erf over the 65536 bfloat16 inputs; if erf alone
        differs, as the every-input check found on an H100, the fused GELU's bits are then PyTorch's)
    TRITON_INTERPRET=1 python3 benchmarks/gelu_cast_probe.py --device cpu --m 64 --n 64   (runs; the interpreter's
        FP8 emulation is not the hardware's, so its bit comparisons say nothing)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import triton
import triton.language as tl
from fused_gemm_probe import _quantize_tile, constants
from triton.language.extra import libdevice

from mxlab.io import write_json
from mxlab.numerics.formats import FORMATS

SQRT1_2 = float(torch.tensor(math.sqrt(0.5), dtype=torch.float32))  # PyTorch's kAlpha (M_SQRT1_2) as float32
BETA = float(torch.tensor(2 / math.sqrt(math.pi) * math.sqrt(0.5) * 0.5, dtype=torch.float32))  # kBeta


@triton.jit
def _erf(x, LIBDEVICE: tl.constexpr):
    """erf of float32 x: libdevice's erff (CUDA's, which PyTorch calls) on a GPU, tl.math.erf under the interpreter."""
    if LIBDEVICE:
        return libdevice.erf(x)
    return tl.math.erf(x)


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    """exp of float32 x: libdevice's expf on a GPU (tl.exp would be ex2.approx), tl.exp under the interpreter."""
    if LIBDEVICE:
        return libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _erf_of_input(
    h_ptr, offsets, mask, x, table_ptr, SQRT1_2: tl.constexpr, TABLE: tl.constexpr, LIBDEVICE: tl.constexpr
):
    """erf(x / sqrt 2) of the bfloat16 input x at h_ptr + offsets: read from a table of PyTorch's torch.erf over
    the 65536 bfloat16 bit patterns (TABLE), else computed (`_erf`)."""
    if TABLE:
        bits = tl.load(h_ptr.to(tl.pointer_type(tl.int16)) + offsets, mask=mask, other=0).to(tl.int32) & 0xFFFF
        return tl.load(table_ptr + bits, mask=mask, other=0.0)
    return _erf(x * SQRT1_2, LIBDEVICE)


@triton.jit
def _tile(pid_m, pid_n, M, N, BC: tl.constexpr):
    rows = (pid_m * 32 + tl.arange(0, 32)).to(tl.int64)[:, None]
    cols = pid_n * BC + tl.arange(0, BC)[None, :]
    return rows * N + cols, (rows < M) & (cols < N), cols


@triton.jit
def _gelu_backward_pair(
    dy_ptr,
    h_ptr,
    g_ptr,
    row_ptr,
    col_ptr,
    sums_ptr,
    M,
    N,
    SQRT1_2: tl.constexpr,
    BETA: tl.constexpr,
    CODE: tl.constexpr,
    BC: tl.constexpr,
    WRITE_G: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    table_ptr=None,
    TABLE: tl.constexpr = False,
):
    """g = gelu'(h) * dy in bfloat16 for a 32 x BC tile, quantized along its rows' 32-blocks and its 32-row columns."""
    offsets, mask, cols = _tile(tl.program_id(0), tl.program_id(1), M, N, BC)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(h_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    cdf = 0.5 * (1.0 + _erf_of_input(h_ptr, offsets, mask, x, table_ptr, SQRT1_2, TABLE, LIBDEVICE))
    pdf = _exp(-0.5 * x * x, LIBDEVICE) * BETA
    g = (dy * (cdf + x * pdf)).to(tl.bfloat16)
    if WRITE_G:
        tl.store(g_ptr + offsets, g, mask=mask)
    tl.store(row_ptr + offsets, _quantize_tile(g, 1, CODE, 32, BC), mask=mask)
    tl.store(col_ptr + offsets, _quantize_tile(g, 0, CODE, 32, BC), mask=mask)
    tl.store(sums_ptr + tl.program_id(0) * N + cols, tl.sum(g.to(tl.float32), axis=0)[None, :], mask=cols < N)


@triton.jit
def _gelu_forward_row(
    h_ptr,
    a_ptr,
    row_ptr,
    M,
    N,
    SQRT1_2: tl.constexpr,
    CODE: tl.constexpr,
    BC: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    table_ptr=None,
    TABLE: tl.constexpr = False,
):
    """a = gelu(h) in bfloat16 for a 32 x BC tile, and a quantized along its rows' 32-blocks."""
    offsets, mask, _ = _tile(tl.program_id(0), tl.program_id(1), M, N, BC)
    x = tl.load(h_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    a = (x * 0.5 * (1.0 + _erf_of_input(h_ptr, offsets, mask, x, table_ptr, SQRT1_2, TABLE, LIBDEVICE))).to(tl.bfloat16)
    tl.store(a_ptr + offsets, a, mask=mask)
    tl.store(row_ptr + offsets, _quantize_tile(a, 1, CODE, 32, BC), mask=mask)


FUSION = {}  # compile options of both kernels: --no-fp-fusion sets enable_fp_fusion=False (no multiply-add contraction)
ERF = {}  # --erf-table: table_ptr (PyTorch's erf of every bfloat16 input / sqrt 2, float32) and TABLE=True


def every_bfloat16(device: str) -> torch.Tensor:
    """The 65536 bfloat16 bit patterns, each at its own index (Inf and NaN included)."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(device)


def erf_table(device: str) -> torch.Tensor:
    """torch.erf(x * SQRT1_2) in float32 for the 65536 bfloat16 bit patterns x, indexed by the pattern."""
    return torch.erf(every_bfloat16(device).float() * SQRT1_2)


def fused_backward(dy, h, const, bc, write_g=False):
    """(g or None, row copy, column copy, column sums) from one kernel."""
    m, n = h.shape
    g = torch.empty_like(h) if write_g else h  # h is never written: a placeholder pointer
    row, col = torch.empty_like(h), torch.empty_like(h)
    partial = torch.empty((triton.cdiv(m, 32), n), dtype=torch.float32, device=h.device)
    _gelu_backward_pair[(triton.cdiv(m, 32), triton.cdiv(n, bc))](
        dy,
        h,
        g,
        row,
        col,
        partial,
        m,
        n,
        SQRT1_2,
        BETA,
        **const,
        BC=bc,
        WRITE_G=write_g,
        LIBDEVICE=h.is_cuda,
        num_warps=4,
        **FUSION,
        **ERF,
    )
    return (g if write_g else None), row, col, partial.sum(0)


def fused_forward(h, const, bc):
    m, n = h.shape
    a, row = torch.empty_like(h), torch.empty_like(h)
    _gelu_forward_row[(triton.cdiv(m, 32), triton.cdiv(n, bc))](
        h, a, row, m, n, SQRT1_2, **const, BC=bc, LIBDEVICE=h.is_cuda, num_warps=4, **FUSION, **ERF
    )
    return a, row


@triton.jit
def _libdevice_elementwise(z_ptr, out_ptr, n, FN: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    """out = erf(z) (FN 0) or exp(z) (FN 1), float32, as the fused kernels compute them."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    z = tl.load(z_ptr + offsets, mask=offsets < n, other=0.0)
    out = _erf(z, LIBDEVICE) if FN == 0 else _exp(z, LIBDEVICE)
    tl.store(out_ptr + offsets, out, mask=offsets < n)


def every_bfloat16_input(device: str, const: dict, bc: int) -> dict:
    """GELU forward of every finite bfloat16 x, fused kernel against F.gelu, and erf / exp of the very float32
    arguments GELU passes them, libdevice against torch.erf / torch.exp: which function makes the bits differ."""
    x = every_bfloat16(device)
    finite = torch.isfinite(x)
    ours, _ = fused_forward(x.reshape(-1, bc), const, bc)
    differ = finite & (ours.reshape(-1).view(torch.int16) != torch.nn.functional.gelu(x).view(torch.int16))

    def libdevice(z: torch.Tensor, fn: int) -> torch.Tensor:
        out = torch.empty_like(z)
        _libdevice_elementwise[(triton.cdiv(z.numel(), 1024),)](
            z, out, z.numel(), FN=fn, LIBDEVICE=z.is_cuda, BLOCK=1024
        )
        return out

    xf = x.float()
    erf_arg, exp_arg = xf * SQRT1_2, -0.5 * xf * xf
    erf_differ = finite & (libdevice(erf_arg, 0).view(torch.int32) != torch.erf(erf_arg).view(torch.int32))
    exp_differ = finite & (libdevice(exp_arg, 1).view(torch.int32) != torch.exp(exp_arg).view(torch.int32))
    examples = [float(v) for v in x[differ][:8].float().cpu()]
    return {
        "finite bfloat16 inputs": int(finite.sum()),
        "gelu differing": int(differ.sum()),
        "erf differing (float32 bits)": int(erf_differ.sum()),
        "exp differing (float32 bits)": int(exp_differ.sum()),
        "gelu differing where erf agrees": int((differ & ~erf_differ).sum()),
        "first differing x": examples,
    }


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.view(torch.int16) != b.view(torch.int16)).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=1482752, help="rows (history tokens), a multiple of 32")
    parser.add_argument("--n", type=int, default=1024, help="hidden width, a multiple of --bc")
    parser.add_argument("--bc", type=int, default=128, help="columns per program, a multiple of 32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--no-fp-fusion", action="store_true", help="compile without multiply-add contraction")
    parser.add_argument(
        "--erf-table",
        action="store_true",
        help="both kernels read erf from a table of torch.erf over the 65536 bfloat16 inputs",
    )
    args = parser.parse_args()
    if args.no_fp_fusion:
        FUSION["enable_fp_fusion"] = False
    if args.erf_table:
        ERF.update(table_ptr=erf_table(args.device), TABLE=True)
    if args.m % 32 or args.n % args.bc or args.bc % 32:
        raise SystemExit(f"--m {args.m} must be a multiple of 32 and --n {args.n} of --bc {args.bc} (itself of 32)")
    from mxlab.kernels.cast import fake_quantize, fake_quantize_rowcol

    fmt, const = FORMATS["e4m3"], constants("e4m3", "rceil")
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(args.m, args.n, generator=generator).to(args.device, torch.bfloat16)
    dy = (torch.randn(args.m, args.n, generator=generator) * 1e-3).to(args.device, torch.bfloat16)
    results: dict = {"m": args.m, "n": args.n, "bc": args.bc}

    g_torch = torch.ops.aten.gelu_backward(dy, h)
    g, row, col, sums = fused_backward(dy, h, const, args.bc, write_g=True)
    want_row, want_col, want_sums = fake_quantize_rowcol(g, fmt, scale_mode="rceil", pad=True, column_sums=True)
    a_torch = torch.nn.functional.gelu(h)
    a, a_row = fused_forward(h, const, args.bc)
    results["exactness"] = {
        "g bits differing from aten.gelu_backward": _differ(g, g_torch),
        "gelu(h) bits differing from F.gelu": _differ(a, a_torch),
        "row copy of g differing from the library's cast": _differ(row, want_row),
        "column copy of g differing from the library's cast": _differ(col, want_col),
        "column sums max relative difference": float(
            ((sums - want_sums).abs() / want_sums.abs().clamp_min(1e-30)).max()
        ),
        "row copy of gelu(h) differing from the library's cast": _differ(
            a_row, fake_quantize(a, fmt, scale_mode="rceil", pad=True)
        ),
    }
    results["every bfloat16 input"] = every_bfloat16_input(args.device, const, args.bc)
    print(json.dumps({k: results[k] for k in ("exactness", "every bfloat16 input")}, indent=1))
    if args.device == "cuda":
        from mxlab.bench.timing import graph_ms

        copy_out = torch.empty_like(h)
        timings = {
            "copy": lambda: copy_out.copy_(h),
            "backward today: gelu_backward + pair cast with sums": lambda: fake_quantize_rowcol(
                torch.ops.aten.gelu_backward(dy, h), fmt, scale_mode="rceil", pad=True, column_sums=True
            ),
            "backward fused": lambda: fused_backward(dy, h, const, args.bc),
            "forward today: gelu + row cast": lambda: fake_quantize(
                torch.nn.functional.gelu(h), fmt, scale_mode="rceil", pad=True
            ),
            "forward fused": lambda: fused_forward(h, const, args.bc),
        }
        results["ms"] = {name: graph_ms(step, warmup=3, repeat=args.repeat) for name, step in timings.items()}
        for name, ms in results["ms"].items():
            print(f"{name:55s} {ms:8.3f} ms  {ms / results['ms']['copy']:5.2f} x copy")
    if args.json:
        write_json(Path(args.json), results)


if __name__ == "__main__":
    main()
