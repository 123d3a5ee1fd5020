# Prototype behind _mx_column_tile_kernel (session 4): one-pass column / both-at-once casts on 2-D and 3-D tiles, the
# stochastic row-tile sweep; its H200 output is column_prototype.txt. Kept as the record of that measurement, not maintained.
"""Prototype: one-pass column and both-at-once MX casts on 3-D tiles (32 rows, NB blocks of 32 columns);
bf16 -> e4m3 floor, hardware FP8 path only (every tile on path 2). Times them next to copy and the production
kernels, and checks codes/scales against the production kernels."""

import os

import torch
import triton
import triton.language as tl

from mxlab.formats import get_format
from mxlab.kernels import mx_quant as K

HW = os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def col_proto(
    x_ptr,
    col_codes_ptr,
    col_scales_ptr,
    row_codes_ptr,
    row_scales_ptr,
    L,
    B,
    NB: tl.constexpr,
    BOTH: tl.constexpr,
    HWC: tl.constexpr,
    MMAX: tl.constexpr,
):
    pid_l = tl.program_id(0)
    pid_b = tl.program_id(1)
    r = pid_l * 32 + tl.arange(0, 32)[:, None, None]
    c = (pid_b * NB + tl.arange(0, NB)[None, :, None]) * 32 + tl.arange(0, 32)[None, None, :]
    offs = r * B + c
    bits = K._load_bits(x_ptr + offs, (r < L) & (c < B), 1, HWC)
    mag = bits & 0x7FFFFFFF
    amax = tl.max(mag, axis=0)  # (NB, 32)
    s, special = K._scale_exponent(amax, 3, 8, MMAX, 0)
    cs = pid_l * B + (pid_b * NB + tl.arange(0, NB)[:, None]) * 32 + tl.arange(0, 32)[None, :]
    tl.store(col_scales_ptr + cs, (s + 127).to(tl.uint8))
    if HWC:
        code, out = K._hw_fp8_finite_elements(bits, s[None, :, :], 1, 3)
    else:
        code, out = K._quantize_fast(bits, s[None, :, :], 3, -6, 8, 0x7E, 14, 8, False)
    tl.store(col_codes_ptr + offs, code.to(tl.uint8))
    if BOTH:
        ramax = tl.max(mag, axis=2)  # (32, NB)
        rs, rspecial = K._scale_exponent(ramax, 3, 8, MMAX, 0)
        tl.store(
            row_scales_ptr
            + (pid_l * 32 + tl.arange(0, 32)[:, None]) * (B // 32)
            + pid_b * NB
            + tl.arange(0, NB)[None, :],
            (rs + 127).to(tl.uint8),
        )
        if HWC:
            rcode, rout = K._hw_fp8_finite_elements(bits, rs[:, :, None], 1, 3)
        else:
            rcode, rout = K._quantize_fast(bits, rs[:, :, None], 3, -6, 8, 0x7E, 14, 8, False)
        tl.store(row_codes_ptr + offs, rcode.to(tl.uint8))


@triton.jit
def col_proto2d(x_ptr, col_codes_ptr, col_scales_ptr, L, B, BN: tl.constexpr, HWC: tl.constexpr, MMAX: tl.constexpr):
    pid_l = tl.program_id(0)
    pid_b = tl.program_id(1)
    r = pid_l * 32 + tl.arange(0, 32)[:, None]
    c = pid_b * BN + tl.arange(0, BN)[None, :]
    offs = r * B + c
    bits = K._load_bits(x_ptr + offs, (r < L) & (c < B), 1, HWC)
    amax = tl.max(bits & 0x7FFFFFFF, axis=0)
    s, special = K._scale_exponent(amax, 3, 8, MMAX, 0)
    tl.store(col_scales_ptr + pid_l * B + pid_b * BN + tl.arange(0, BN), (s + 127).to(tl.uint8))
    if HWC:
        code, out = K._hw_fp8_finite_elements(bits, s[None, :], 1, 3)
    else:
        code, out = K._quantize_fast(bits, s[None, :], 3, -6, 8, 0x7E, 14, 8, False)
    tl.store(col_codes_ptr + offs, code.to(tl.uint8))


def run2d(x, bn, warps):
    L, B = x.shape
    cc = torch.empty(L, B, dtype=torch.uint8, device=x.device)
    csc = torch.empty(L // 32, B, dtype=torch.uint8, device=x.device)
    mmax = K._format_constants(get_format("e4m3"))["MMAX"]
    col_proto2d[(L // 32, B // bn)](x.view(torch.int16), cc, csc, L, B, BN=bn, HWC=HW, MMAX=mmax, num_warps=warps)
    return cc, csc


def run(x, nb, warps, both):
    L, B = x.shape
    cc = torch.empty(L, B, dtype=torch.uint8, device=x.device)
    csc = torch.empty(L // 32, B, dtype=torch.uint8, device=x.device)
    rc = torch.empty(L, B, dtype=torch.uint8, device=x.device) if both else cc
    rsc = torch.empty(L, B // 32, dtype=torch.uint8, device=x.device) if both else csc
    mmax = K._format_constants(get_format("e4m3"))["MMAX"]
    col_proto[(L // 32, B // (32 * nb))](
        x.view(torch.int16), cc, csc, rc, rsc, L, B, NB=nb, BOTH=both, HWC=HW, MMAX=mmax, num_warps=warps
    )
    return cc, csc, rc, rsc


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    L, B = (16384, 8192) if dev == "cuda" else (64, 256)
    x = torch.randn(L, B, device=dev).to(torch.bfloat16)
    fmt = get_format("e4m3")
    ref_c, ref_s = K.quantize(x, fmt, axis=0)
    (rr_c, rr_s), _ = K.quantize_rowcol(x, fmt)
    n = x.numel()
    if dev == "cuda":
        from triton.testing import do_bench_cudagraph as bench

        y = torch.empty_like(x)
        copy = bench(lambda: y.copy_(x), rep=100, return_mode="median")
        base = {
            "column cast (production)": (lambda: K.quantize(x, fmt, axis=0), 3 * n + n // 32),
            "both cast (production)": (lambda: K.quantize_rowcol(x, fmt), 4 * n + n // 16),
        }
        for name, (fn, moved) in base.items():
            ms = bench(fn, rep=100, return_mode="median")
            print(
                f"{name:40s} {ms:.4f} ms {moved / ms / 1e6:.0f} GB/s {(moved / ms) / (4 * n / copy):.3f} x copy",
                flush=True,
            )
    for bn in (64, 128, 256, 512):
        for warps in (2, 4, 8):
            cc, csc = run2d(x, bn, warps)
            line = f"column-2d bn={bn} warps={warps} same_bits={torch.equal(cc, ref_c) and torch.equal(csc, ref_s)}"
            if dev == "cuda":
                ms = bench(lambda: run2d(x, bn, warps), rep=100, return_mode="median")
                line += f" {ms:.4f} ms {((3 * n + n // 32) / ms) / (4 * n / copy):.3f} x copy"
            print(line, flush=True)
    if dev == "cuda":
        cfgs = [(16, 8, 4), (8, 8, 4), (16, 8, 8), (4, 8, 4), (8, 4, 4), (32, 8, 8), (8, 8, 2)]
        for r_, c_, w_ in cfgs:
            t = K.TileConfig(r_, c_, w_)
            for name, fn, moved in [
                ("sr fq", lambda: K.fake_quantize(x, fmt, rounding="stochastic", seed=5, tile=t), 4 * n),
                ("sr cast", lambda: K.quantize(x, fmt, rounding="stochastic", seed=5, tile=t), 3 * n + n // 32),
            ]:
                ms = bench(fn, rep=100, return_mode="median")
                print(f"{name} tile={r_}x{c_}x{w_} {ms:.4f} ms {(moved / ms) / (4 * n / copy):.3f} x copy", flush=True)
    for both in (False, True):
        for nb in (1, 2, 4, 8):
            for warps in (2, 4, 8):
                cc, csc, rc, rsc = run(x, nb, warps, both)
                ok = torch.equal(cc, ref_c) and torch.equal(csc, ref_s)
                if both:
                    ok = ok and torch.equal(rc, rr_c) and torch.equal(rsc, rr_s)
                line = f"{'both' if both else 'column'} nb={nb} warps={warps} same_bits={ok}"
                if dev == "cuda":
                    moved = (4 * n + n // 16) if both else (3 * n + n // 32)
                    ms = bench(lambda: run(x, nb, warps, both), rep=100, return_mode="median")
                    line += f" {ms:.4f} ms {(moved / ms) / (4 * n / copy):.3f} x copy"
                print(line, flush=True)


main()
