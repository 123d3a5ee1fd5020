"""Registers, spills, shared memory and static SASS size of the jagged attention kernels as compiled for sm_90, on
any machine (no GPU).

An exploration for the training-step issue (not imported by the library). On the H200 the stochastic-rounding arm's
attention backward costs far more than the MXFP4 arm's, whose operands take the integer path too
(reports/benchmarks/anatomy_sr.txt: dQ 62.0 ms against 32.6, dK/dV 93.0 against 78.1). This compiles the forward,
dK/dV and dQ kernels of the tree it runs in, at the default tiles (`tiles.DEFAULT_TILES`, `DEFAULT_MX_TILES`), for
the operand codes of four gem-synthetic arms (BF16; mxfp8-rceil with the FP8 conversion; mxfp8-rceil-sr, whose
gradient operands dO and dS round stochastically; mxfp4-all, e2m1 forward and e3m2 gradients on the integer path),
and prints ptxas -v's registers and spill bytes per kernel, and nvdisasm's instruction and CTA-barrier counts of the
whole kernel (static counts, not per key step). A spill, a register count that halves occupancy, or instructions
well above the BF16 kernel's at the same tiles are leads for the next GPU visit; only a GPU can say what the time
goes to.

    python3 benchmarks/attention_compile_stats.py
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mxlab.kernels._mx_device import operand_code
from mxlab.kernels.attention import kernels
from mxlab.kernels.attention.tiles import DEFAULT_MX_TILES, DEFAULT_TILES, TileSizes

NVIDIA_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTXAS = os.path.join(NVIDIA_BIN, "ptxas")
NVDISASM = os.path.join(NVIDIA_BIN, "nvdisasm")
BFLOAT16_POINTERS = {"QD", "QT", "KD", "KT", "VD", "VT", "DOD", "DOT", "O", "DQ", "DK", "DV"}
FLOAT32_POINTERS = {"M", "L", "DELTA", "DQ_ACC"}
INT64_POINTERS = {"q_offsets", "k_offsets"}
INT32_POINTERS = {"tile_seq", "tile_start"}


def _arm_codes(arm: str) -> dict[str, int]:
    """Forward operand code, gradient operand code (dO, dS) and P's backward code of one arm."""
    if arm == "mxfp8-rceil":
        fwd = operand_code("e4m3", "rceil", "nearest_even", hw_fp8=True)
        return dict(fwd=fwd, grad=fwd)
    if arm == "mxfp8-rceil-sr":
        return dict(
            fwd=operand_code("e4m3", "rceil", "nearest_even", hw_fp8=True),
            grad=operand_code("e4m3", "rceil", "stochastic"),
        )
    return dict(fwd=operand_code("e2m1", "rceil", "nearest_even"), grad=operand_code("e3m2", "rceil", "nearest_even"))


def _signature(fn) -> dict[str, str]:
    signature = {}
    for name in fn.arg_names:
        if name in BFLOAT16_POINTERS:
            signature[name] = "*bf16"  # bfloat16 in MX and BF16 mode alike
        elif name in FLOAT32_POINTERS:
            signature[name] = "*fp32"
        elif name in INT64_POINTERS:
            signature[name] = "*i64"
        elif name in INT32_POINTERS:
            signature[name] = "*i32"
        elif name == "sm_scale":
            signature[name] = "fp32"
        elif name.startswith(("stride_", "total_")) or name.endswith("seed_key"):
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
    return signature


def _ptxas(ptx: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(ptx)
    report = subprocess.run(
        [PTXAS, "-v", "--gpu-name", "sm_90a", handle.name, "-o", os.devnull], capture_output=True, text=True
    ).stderr
    os.unlink(handle.name)
    registers = re.search(r"Used (\d+) registers", report)
    stores, loads = re.search(r"(\d+) bytes spill stores", report), re.search(r"(\d+) bytes spill loads", report)
    if not registers:
        return report.strip().splitlines()[-1]
    return (
        f"registers {registers.group(1):>3}  spill stores {stores.group(1) if stores else '?':>5}  "
        f"spill loads {loads.group(1) if loads else '?':>5}"
    )


def _sass_counts(cubin: bytes) -> str:
    """Instructions and CTA barriers (BAR) in the kernel's SASS, by nvdisasm."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as handle:
        handle.write(cubin)
    sass = subprocess.run([NVDISASM, "-c", handle.name], capture_output=True, text=True).stdout
    os.unlink(handle.name)
    opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    return f"SASS {len(opcodes):>5}  BAR {opcodes.count('BAR'):>3}"


def _compile(fn, constants: dict, num_warps: int, num_stages: int) -> str:
    compiled = triton.compile(
        ASTSource(fn=fn, signature=_signature(fn), constexprs=constants),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    return (
        f"{_ptxas(compiled.asm['ptx'])}  shared bytes {compiled.metadata.shared:>5}  "
        f"{_sass_counts(compiled.asm['cubin'])}"
    )


def _shared_constants(quant: bool) -> dict:
    return dict(
        HEAD_DIM=64,
        CAUSAL=False,
        SILU=False,
        QUANT=quant,
        S_DTYPE=tl.bfloat16,
        OP_DTYPE=tl.bfloat16,
        DOT_DTYPE=tl.bfloat16,
        BY_BITS=False,
    )


def _launches(tiles, codes: dict) -> dict:
    return {
        "forward": (kernels._jagged_attention_fwd, dict(BLOCK_M=tiles.fwd_m, BLOCK_N=tiles.fwd_n, P_CODE=codes["fwd"])),
        "dK/dV": (
            kernels._jagged_attention_bwd_dkdv,
            dict(
                BLOCK_M=tiles.dkdv_m,
                BLOCK_N=tiles.dkdv_n,
                PM_CODE=codes["fwd"],
                DSM_CODE=codes["grad"],
                FUSED_DQ=False,
                DSN_CODE=codes["grad"],
            ),
        ),
        "dQ": (kernels._jagged_attention_bwd_dq, dict(BLOCK_M=tiles.dq_m, BLOCK_N=tiles.dq_n, DSN_CODE=codes["grad"])),
    }


def main() -> None:
    print("BF16 mode at the MX default tiles (what the MX kernels would be without their quantization)")
    for name, (fn, constants) in _launches(DEFAULT_MX_TILES, dict(fwd=0, grad=0)).items():
        print(
            f"bf16            {name:<8} {constants['BLOCK_M']}x{constants['BLOCK_N']} w{DEFAULT_MX_TILES.num_warps}  "
            f"{_compile(fn, {**_shared_constants(False), **constants}, DEFAULT_MX_TILES.num_warps, DEFAULT_MX_TILES.num_stages)}"
        )
    print("default tiles, head_dim 64 (the h200 model)")
    for arm in ("bf16", "mxfp8-rceil", "mxfp8-rceil-sr", "mxfp4-all"):
        quant = arm != "bf16"
        tiles = DEFAULT_MX_TILES if quant else DEFAULT_TILES
        for name, (fn, constants) in _launches(tiles, _arm_codes(arm) if quant else dict(fwd=0, grad=0)).items():
            print(
                f"{arm:<15} {name:<8} {constants['BLOCK_M']}x{constants['BLOCK_N']} w{tiles.num_warps}  "
                f"{_compile(fn, {**_shared_constants(quant), **constants}, tiles.num_warps, tiles.num_stages)}"
            )
    print("BF16 mode at other tiles and warps (the defaults spill)")
    for m, n, warps in ((128, 64, 8), (64, 64, 4), (128, 32, 4), (64, 32, 4), (32, 64, 4)):
        tiles = TileSizes(fwd_m=m, fwd_n=n, dkdv_m=m, dkdv_n=n, dq_m=m, dq_n=n, num_warps=warps, num_stages=2)
        for name, (fn, constants) in _launches(tiles, dict(fwd=0, grad=0)).items():
            print(
                f"bf16            {name:<8} {m}x{n} w{warps}  {_compile(fn, {**_shared_constants(False), **constants}, warps, 2)}"
            )


if __name__ == "__main__":
    main()
