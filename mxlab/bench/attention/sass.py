"""Static sm_90 machine-code counts of the jagged attention kernels (`mxlab bench attention-sass`), compiled on
any machine: the launches of one MX forward + backward of the attention bench's self shape, compiled as
`mxlab.bench.sass` compiles the casts, and per kernel registers, spills and per loop the instructions of one
iteration by opcode class.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mxlab.bench.sass import CompileOnly, cuda_tool, hardware_fp8_as_on_sm90, resource_usage

# Opcode classes counted per loop body (prefix match on the SASS opcode).
_OPCODE_CLASSES = {
    "mma": ("HMMA", "HGMMA", "WARPGROUP"),
    "mufu": ("MUFU",),
    "fp8/bf16 convert": ("F2FP",),
    "shuffle": ("SHFL",),
    "shared": ("LDS", "STS", "LDSM", "STSM"),
    "barrier": ("BAR",),
    "global": ("LDG", "STG", "LDGSTS", "RED", "ATOM"),
    "local (spill)": ("LDL", "STL"),
}
ATTENTION_KERNELS = ("_jagged_attention_fwd", "_jagged_attention_bwd_dkdv", "_jagged_attention_bwd_dq")
ATTENTION_LAUNCHES = ("_prequantize", "_row_dot")


@dataclass
class KernelSassCount:
    """Static sm_90 counts of one compiled attention kernel (no GPU needed)."""

    kernel: str
    registers: int
    spill_bytes: int  # local memory per thread (stack + local); > 0 means spills
    instructions: int  # static SASS instructions, NOPs left out
    loops: list[dict[str, int]] = field(default_factory=list)  # per loop (back edge): `_loop_counts`
    constexprs: dict[str, Any] = field(default_factory=dict)


def _sass_listing(cubin: bytes) -> list[tuple[int, str, bool]]:
    """(byte offset, instruction text without its guard, guarded) of every non-NOP instruction of the first
    function in `cubin`, from `cuobjdump -sass` itself (Triton's asm["sass"] stops at 4096 instructions)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.check_output([cuda_tool("cuobjdump"), "-sass", handle.name], text=True)
    listing = []
    for match in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", text):
        body = match.group(2).strip()
        guard = re.match(r"^@!?U?P[T\d]+\s+", body)
        instruction = body[guard.end() :] if guard else body
        if not instruction.startswith("NOP"):
            listing.append((int(match.group(1), 16), instruction, guard is not None))
    return listing


def _branch_target(instruction: str) -> int | None:
    branch = re.match(r"BRA(?:\.\w+)*\s+(0x[0-9a-f]+)", instruction)
    return int(branch.group(1), 16) if branch else None


def _loop_counts(listing: list[tuple[int, str, bool]]) -> list[dict[str, int]]:
    """For each backward branch (a loop's back edge): `static`, the instructions from its target to it, and
    `path` with the opcode classes, the instructions one iteration runs when every forward conditional branch
    inside falls through and every unconditional one is taken (in the attention loops: the hardware FP8 path of
    P and dS, past their integer fallback)."""
    position_of = {offset: position for position, (offset, _, _) in enumerate(listing)}
    loops = []
    for last, (offset, instruction, _) in enumerate(listing):
        target = _branch_target(instruction)
        if target is None or target >= offset:
            continue
        first = position_of.get(target, next(p for p, (o, _, _) in enumerate(listing) if o >= target))
        path, position = [], first
        while first <= position <= last:
            _, text, guarded = listing[position]
            path.append(text)
            jump = _branch_target(text)
            if position == last:
                break
            forward_jump = jump is not None and jump > listing[position][0] and not guarded
            position = position_of.get(jump, last) if forward_jump else position + 1
        classes = {
            name: sum(text.split()[0].startswith(prefixes) for text in path)
            for name, prefixes in _OPCODE_CLASSES.items()
        }
        loops.append({"static": last - first + 1, "path": len(path), **classes})
    return loops


def attention_sass_counts(
    tiles: Any = None,
    hw_fp8: bool = True,
    fmt: str = "e4m3",
    grad_rounding: str = "nearest_even",
    scale_mode: str = "floor",
) -> list[KernelSassCount]:
    """Static sm_90 counts (registers, spills, instructions, per-loop instruction classes) of every kernel one
    MX forward + backward of the attention bench's self shape launches (BF16 4 x 64, softmax, not causal, `fmt`
    with `scale_mode` scales, operands nearest-even and gradients (dO, dS) `grad_rounding`, the hardware FP8 path as on
    an H200 where it applies unless hw_fp8=False). The launches are the real ones
    with each `[grid](...)` replaced by a compile for GPUTarget("cuda", 90, 32), so specialization and constexprs
    are what an H200 run gets. Refuses (RuntimeError) to run under TRITON_INTERPRET=1 or without Triton's ptxas."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("attention_sass_counts compiles for sm_90; unset TRITON_INTERPRET=1")
    from mxlab.bench.attention.shapes import HEAD_DIM, HEADS, mx_policy, offsets_of
    from mxlab.bench.cast_kernels import cast_kernels_replaced
    from mxlab.kernels import attention
    from mxlab.kernels.attention import autograd, codes, launch
    from mxlab.nn.attention import call_seeds

    lengths = torch.tensor([300, 17, 64])
    offsets = offsets_of(lengths)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(int(offsets[-1]), HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    policy = mx_policy(fmt, scale_mode=scale_mode, grad_rounding=grad_rounding)
    record: list = []
    replaced = [(autograd, name) for name in ATTENTION_KERNELS] + [(launch, name) for name in ATTENTION_LAUNCHES]
    saved = [(module, name, getattr(module, name)) for module, name in replaced] + [
        (codes, "hardware_fp8_applies", codes.hardware_fp8_applies)
    ]
    try:
        for module, name in replaced:
            setattr(module, name, CompileOnly(getattr(module, name), record))
        codes.hardware_fp8_applies = hardware_fp8_as_on_sm90(hw_fp8)
        # the head-dim casts of Q, K, dO run the cast kernels: compiled and counted too
        with cast_kernels_replaced(
            lambda kernel: CompileOnly(kernel, record), hardware_fp8_applies=hardware_fp8_as_on_sm90(hw_fp8)
        ):
            out = attention.jagged_attention(
                q,
                k,
                v,
                offsets,
                offsets,
                policy=policy,
                seeds=call_seeds(policy),
                _launch=attention.AttentionLaunch(tiles=tiles or attention.DEFAULT_MX_TILES),
            )
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    counts = []
    read: dict[bytes, tuple[list, tuple[int, int]]] = {}  # a launch compiled to the same cubin is disassembled once
    for _grid, constexprs, compiled in record:
        cubin = compiled.asm["cubin"]
        if cubin not in read:
            read[cubin] = (_sass_listing(cubin), resource_usage(cubin))
        listing, (registers, spill) = read[cubin]
        shown = {key: value for key, value in constexprs.items() if key in ("BLOCK_M", "BLOCK_N", "COLS", "num_warps")}
        counts.append(KernelSassCount(compiled.name, registers, spill, len(listing), _loop_counts(listing), shown))
    return counts


def print_attention_sass_counts(counts: list[KernelSassCount], print_fn: Callable[[str], None] = print) -> None:
    """One line per kernel: registers, spill bytes, static instructions, and per loop its instructions with the
    mma / MUFU / convert / shuffle / shared / barrier / spill counts."""
    print_fn(
        f"{'kernel':<28} {'regs':>4} {'spill B':>7} {'static':>6}  "
        f"loops: static/path instr (path: mma mufu cvt shfl smem bar local)"
    )
    for count in counts:
        loops = "; ".join(
            f"{row['static']}/{row['path']} ({row['mma']} {row['mufu']} "
            f"{row['fp8/bf16 convert']} {row['shuffle']} {row['shared']} "
            f"{row['barrier']} {row['local (spill)']})"
            for row in count.loops
        )
        print_fn(
            f"{count.kernel:<28} {count.registers:>4} {count.spill_bytes:>7} {count.instructions:>6}  {loops or '-'}"
        )
