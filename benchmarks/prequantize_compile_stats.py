"""Shared-memory traffic of the attention's pre-quantization kernel as compiled for sm_90, on any machine (no GPU).

An exploration for the training-step issue (not imported by the library): compiles `_prequantize` of the tree it
runs in for each launch kind the attention makes (head dim, tokens, both, both with the row dots) under nearest
even with the FP8 conversion and under stochastic rounding, and counts in the output the layout conversions
(TTGIR), barriers and shared-memory stores and loads (PTX) and the shared memory a program takes. A reshape of a
register tile, or a reduction across warps, shows up as shared-memory traffic; whether that traffic is what the
kernel's time goes to, only a GPU can say (benchmarks/prequantize_sweep.py).

    python3 benchmarks/prequantize_compile_stats.py
"""
from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mxlab.kernels._mx_device import operand_code
from mxlab.kernels.attention import device

SIGNATURE = {name: "*bf16" for name in ("X", "OUT_ALONG_D", "OUT_ALONG_T", "DOT_WITH")}
SIGNATURE.update({"ROW_DOTS": "*fp32", "offsets": "*i64", "tile_seq": "*i32", "tile_start": "*i32", "stride_t": "i32",
                  "width": "i32", "tokens": "i32", "d_seed_key": "i32", "t_seed_key": "i32"})
LAUNCHES = {"head dim (Q, K fwd; V bwd)": (True, False, False), "tokens (V fwd)": (False, True, False),
            "both (Q, K bwd)": (True, True, False), "both + row dots (dO bwd)": (True, True, True)}


def main() -> None:
    for rounding in ("nearest_even", "stochastic"):
        code = operand_code("e4m3", "rceil", rounding, hw_fp8=rounding == "nearest_even")
        for name, (along_d, along_t, row_dot) in LAUNCHES.items():
            constants = dict(COLS=256, D_CODE=code, T_CODE=code, ALONG_D=along_d, ALONG_T=along_t, ROW_DOT=row_dot, HEAD_DIM=64)
            signature = {arg: SIGNATURE.get(arg, "constexpr") for arg in device._prequantize.arg_names}
            compiled = triton.compile(ASTSource(fn=device._prequantize, signature=signature, constexprs=constants),
                                      target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
            ptx = compiled.asm["ptx"]
            print(f"{rounding:<12} {name:<28} layout conversions {compiled.asm['ttgir'].count('convert_layout')}  "
                  f"barriers {ptx.count('bar.sync') + ptx.count('barrier.sync'):2d}  "
                  f"st.shared {len(re.findall(r'st[.]shared', ptx)):3d}  ld.shared {len(re.findall(r'ld[.]shared', ptx)):3d}  "
                  f"shared bytes {compiled.metadata.shared}")


if __name__ == "__main__":
    main()
