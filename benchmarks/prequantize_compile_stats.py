"""Shared-memory traffic of the attention's pre-quantization kernel as compiled for sm_90, on any machine (no GPU).

An exploration for the training-step issue (not imported by the library): compiles `_prequantize` of the tree it
runs in for each launch kind the attention makes (head dim, tokens, both, both with the row dots) under nearest
even with the FP8 conversion and under stochastic rounding, and counts in the output the layout conversions
(TTGIR), barriers and shared-memory stores and loads (PTX) and the shared memory a program takes. A reshape of a
register tile, or a reduction across warps, shows up as shared-memory traffic; whether that traffic is what the
kernel's time goes to, only a GPU can say (benchmarks/prequantize_sweep.py).

With `--spills` it prints instead ptxas -v's registers and spill bytes per launch kind, for 256-column programs at 4
and 8 warps and 128-column ones at 2 and 4, for the codes
of the gem-synthetic arms: e4m3 with the FP8 conversion (floor, rceil, tail-bf16), e4m3 stochastic (rceil-sr's
gradients), e2m1 and e3m2 on the integer steps (mxfp4-all).

    python3 benchmarks/prequantize_compile_stats.py
    python3 benchmarks/prequantize_compile_stats.py --spills
"""

from __future__ import annotations

import re
import sys

import triton
from attention_compile_stats import _ptxas
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mxlab.kernels._mx_device import operand_code
from mxlab.kernels.attention import device

SIGNATURE = {name: "*bf16" for name in ("X", "OUT_ALONG_D", "OUT_ALONG_T", "DOT_WITH")}
SIGNATURE.update(
    {
        "ROW_DOTS": "*fp32",
        "offsets": "*i64",
        "tile_seq": "*i32",
        "tile_start": "*i32",
        "stride_t": "i32",
        "width": "i32",
        "tokens": "i32",
        "d_seed_key": "i32",
        "t_seed_key": "i32",
    }
)
LAUNCHES = {
    "head dim (Q, K fwd; V bwd)": (True, False, False),
    "tokens (V fwd)": (False, True, False),
    "both (Q, K bwd)": (True, True, False),
    "both + row dots (dO bwd)": (True, True, True),
}


def _compiled(code: int, along_d: bool, along_t: bool, row_dot: bool, num_warps: int, columns: int = 256):
    constants = dict(
        COLS=columns, D_CODE=code, T_CODE=code, ALONG_D=along_d, ALONG_T=along_t, ROW_DOT=row_dot, HEAD_DIM=64
    )
    signature = {arg: SIGNATURE.get(arg, "constexpr") for arg in device._prequantize.arg_names}
    return triton.compile(
        ASTSource(fn=device._prequantize, signature=signature, constexprs=constants),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": 2},
    )


def spills() -> None:
    codes = {
        "e4m3 FP8 convert": operand_code("e4m3", "rceil", "nearest_even", hw_fp8=True),
        "e4m3 stochastic": operand_code("e4m3", "rceil", "stochastic"),
        "e2m1 integer": operand_code("e2m1", "rceil", "nearest_even"),
        "e3m2 integer": operand_code("e3m2", "rceil", "nearest_even"),
    }
    for label, code in codes.items():
        for name, kind in LAUNCHES.items():
            for columns, warps in ((256, 4), (256, 8), (128, 2), (128, 4)):
                print(
                    f"{label:<17} {name:<28} {columns} columns {warps} warps  "
                    f"{_ptxas(_compiled(code, *kind, warps, columns).asm['ptx'])}"
                )


def main() -> None:
    for rounding in ("nearest_even", "stochastic"):
        code = operand_code("e4m3", "rceil", rounding, hw_fp8=rounding == "nearest_even")
        for name, (along_d, along_t, row_dot) in LAUNCHES.items():
            compiled = _compiled(code, along_d, along_t, row_dot, 4)
            ptx = compiled.asm["ptx"]
            print(
                f"{rounding:<12} {name:<28} layout conversions {compiled.asm['ttgir'].count('convert_layout')}  "
                f"barriers {ptx.count('bar.sync') + ptx.count('barrier.sync'):2d}  "
                f"st.shared {len(re.findall(r'st[.]shared', ptx)):3d}  ld.shared {len(re.findall(r'ld[.]shared', ptx)):3d}  "
                f"shared bytes {compiled.metadata.shared}"
            )


if __name__ == "__main__":
    spills() if "--spills" in sys.argv[1:] else main()
