"""Static sm_90 machine-code counts of the MX cast and jagged attention kernels, compiled on any machine (no
GPU needed): the one place that compiles launches for sm_90 and reads their SASS.

`mxlab bench sass` compiles the launches that `mxlab bench quant` times (BF16 input, e4m3, floor scales,
nearest even, the hardware FP8 path as on an H200) with Triton's bundled ptxas, disassembles them with
cuobjdump, and prints per kernel: SASS instructions per element (loop bodies weighted by their trip
counts), registers per thread, spill bytes, and how many global loads each loop body issues before the
first instruction that reads a loaded register (loads in flight per thread). These are static counts, not
timings: they tell which variant does less work per element and keeps more loads in flight, so the
H200 bench has fewer variants to time.

The launch is `mxlab.kernels.cast.launch.launch_cast` itself, with the kernels' `[grid](...)` replaced by a
compile for GPUTarget("cuda", 90, 32), so argument specialization (alignment, divisibility by 16,
strides of 1) and every constexpr are the ones a real launch on an H200 gets.

The attention kernels' counts (`mxlab bench attention-sass`) are in `mxlab.bench.attention.sass`.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mxlab.io import write_json

DEFAULT_SHAPE = (512, 8192)  # same specialization as the bench's 16384 x 8192 (sizes divisible by 16, stride 1)
ARCH = 90


@dataclass(frozen=True)
class SassCount:
    """Static counts of one compiled kernel."""

    name: str
    kernel: str
    instructions: int  # static SASS instructions, NOP padding excluded
    per_element: float  # dynamic instructions per element, loop bodies times their trip counts
    registers: int
    spill_bytes: int  # local memory (stack frame) per thread; > 0 means spills
    loops: list[dict] = field(default_factory=list)  # per loop: instructions, trips, loads before first use
    straight_loads_before_use: int = 0  # global loads issued before the first use, outside loops
    fp8_converts_per_element: float = 0.0  # F2FP on the counted path (0.5: one cvt ...x2 per element pair)
    shared_per_element: float = 0.0  # shared-memory loads/stores and barriers (layout conversions) on the path
    note: str = ""  # why the path was not counted, if it was not


@dataclass(frozen=True)
class _Instruction:
    opcode: str
    operands: str
    predicated: bool
    labels: tuple[str, ...]  # the labels at this instruction


_LABEL = re.compile(r"^\s*([.\w]+):\s*$")
_REGISTER = re.compile(r"\bR(\d+)\b(\.64|\.128)?")


def cuda_tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise RuntimeError(f"{name} not found at {path}; it ships with Triton's NVIDIA backend")
    return str(path)


def _parse_sass(text: str) -> list[_Instruction]:
    """Instructions of Triton's SASS listing (lines `control<TAB>OPCODE operands;`, labels `NAME:`), NOPs left out."""
    instructions: list[_Instruction] = []
    labels: list[str] = []
    for line in text.splitlines():
        label_match = _LABEL.match(line)
        if label_match and not line.startswith("Function"):
            labels.append(label_match.group(1))
            continue
        if "\t" not in line or not line.rstrip().endswith(";"):
            continue
        body = line.split("\t", 1)[1].rstrip().rstrip(";").strip()
        guard = re.match(r"^@!?U?P[T\d]+\s+", body)
        if guard:
            body = body[guard.end() :]
        opcode, _, operands = body.partition(" ")
        if opcode == "NOP":
            continue
        instructions.append(_Instruction(opcode, operands, guard is not None, tuple(labels)))
        labels = []
    return instructions


def _registers_of(operand_text: str, opcode: str = "", destination: bool = False) -> set[int]:
    registers: set[int] = set()
    for match in _REGISTER.finditer(operand_text):
        first = int(match.group(1))
        width = {".64": 2, ".128": 4}.get(match.group(2) or "", 1)
        if destination:
            width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
        registers.update(range(first, first + width))
    return registers


def _loads_before_first_use(body: list[_Instruction]) -> int:
    """Global loads issued before the first instruction that reads or overwrites a register one of them loads."""
    pending: set[int] = set()
    count = 0
    for ins in body:
        if pending and _registers_of(ins.operands) & pending:
            return count
        if ins.opcode.startswith("LDG"):
            destination = ins.operands.split(",", 1)[0]
            pending |= _registers_of(destination, ins.opcode, destination=True)
            count += 1
    return count


def _likely_path(
    instructions: list[_Instruction], loop_trips: tuple[int, ...]
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Indices executed along the first path, in fall-through-first order, from the entry to an unconditional
    EXIT that meets exactly len(loop_trips) loops (a branch back to an earlier label), the k-th of them running
    loop_trips[k] times. Conditional exits are not taken; at a forward conditional branch the fall-through is
    tried first, the branch target when the fall-through leads to no such path (on the MX kernels: past the
    rarely taken paths, which hold loops of their own, to the fast path with every mask true). Returns
    (executed indices, [(first, last, trips)] of the loops met). Refuses (ValueError) a kernel without such a path."""
    index_of_label = {label: i for i, ins in enumerate(instructions) for label in ins.labels}

    def target_of(ins: _Instruction) -> int:
        return index_of_label.get(ins.operands.split()[-1], len(instructions))  # a label the listing lost: past the end

    def walk(i: int, path: list[int], loops: list[tuple[int, int, int]], taken: dict[int, int]):
        while i < len(instructions):
            ins = instructions[i]
            path.append(i)
            if ins.opcode == "EXIT" and not ins.predicated:
                return (path, loops) if len(loops) == len(loop_trips) else None
            if ins.opcode.startswith("BRA"):
                target = target_of(ins)
                if target == i:
                    return None  # the trap loop after the last EXIT
                if target < i:  # a loop's back edge
                    if i not in taken:
                        if len(loops) == len(loop_trips):
                            return None
                        loops = loops + [(target, i, loop_trips[len(loops)])]
                        taken = {**taken, i: 0}
                    trips = next(trips for first, last, trips in loops if last == i)
                    taken = {**taken, i: taken[i] + 1}
                    if taken[i] < trips:
                        i = target
                        continue
                    if not ins.predicated:
                        return (path, loops) if len(loops) == len(loop_trips) else None  # ends with the loop
                elif not ins.predicated:
                    i = target
                    continue
                else:
                    found = walk(i + 1, list(path), loops, taken)
                    if found:
                        return found
                    i = target
                    continue
            i += 1
        return None

    found = walk(0, [], [], {})
    if found is None:
        raise ValueError(f"no path from the entry to an EXIT meets {len(loop_trips)} loops")
    return found


def resource_usage(cubin: bytes) -> tuple[int, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.check_output([cuda_tool("cuobjdump"), "-res-usage", handle.name], text=True)
    registers = int(re.search(r"REG:(\d+)", text).group(1))
    stack = int(re.search(r"STACK:(\d+)", text).group(1))
    local = int(re.search(r"LOCAL:(\d+)", text).group(1))
    return registers, stack + local


def count_compiled(name: str, compiled, elements_per_thread: int, loop_trips: tuple[int, ...] = ()) -> SassCount:
    """SassCount of a triton CompiledKernel along `_likely_path` (on the MX kernels: the fast path of a tile
    without NaN/Inf, every mask true). `loop_trips`: the trip count of each loop that path meets, in order.
    A kernel without such a path (e.g. one whose fast path the compiler turned into a loop) gets per-element
    counts NaN and a `note`."""
    instructions = _parse_sass(compiled.asm["sass"])
    note = ""
    try:
        path, loops = _likely_path(instructions, loop_trips)
    except ValueError as error:
        path, loops, note = [], [], f"not counted: {error}"
    loop_rows = []
    in_loop: set[int] = set()
    for first, last, trips in loops:
        body = instructions[first : last + 1]
        in_loop.update(range(first, last + 1))
        loop_rows.append(
            dict(
                instructions=len(body),
                trips=trips,
                loads=sum(ins.opcode.startswith("LDG") for ins in body),
                loads_before_first_use=_loads_before_first_use(body),
            )
        )
    executed = [instructions[i] for i in path]
    registers, spill = resource_usage(compiled.asm["cubin"])
    per_element = len(path) / elements_per_thread if path else float("nan")
    return SassCount(
        name=name,
        kernel=compiled.name,
        instructions=len(instructions),
        note=note,
        per_element=per_element,
        registers=registers,
        spill_bytes=spill,
        loops=loop_rows,
        straight_loads_before_use=_loads_before_first_use([instructions[i] for i in path if i not in in_loop]),
        fp8_converts_per_element=sum(ins.opcode.startswith("F2FP") for ins in executed) / elements_per_thread
        if path
        else float("nan"),
        shared_per_element=sum(ins.opcode[:3] in ("STS", "LDS") or ins.opcode.startswith("BAR") for ins in executed)
        / elements_per_thread
        if path
        else float("nan"),
    )


class CompileOnly:
    """Stands in for a @triton.jit kernel: `[grid](*args, **options)` compiles for sm_90, records, returns it."""

    def __init__(self, kernel, record: list):
        self.kernel = kernel
        self.record = record

    def __getitem__(self, grid):
        def compile_for_sm90(*args, **kwargs):
            import triton
            from triton.backends.compiler import GPUTarget
            from triton.compiler import ASTSource, make_backend
            from triton.runtime.jit import create_function_from_signature

            target = GPUTarget("cuda", ARCH, 32)
            backend = make_backend(target)
            binder = create_function_from_signature(self.kernel.signature, self.kernel.params, backend)
            bound_args, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = self.kernel._pack_args(
                backend, kwargs, bound_args, specialization, options
            )
            source = ASTSource(self.kernel, signature, constexprs, attrs)
            compiled = triton.compile(source, target=target, options=options.__dict__)
            self.record.append((grid, kwargs, compiled))
            return compiled

        return compile_for_sm90


def hardware_fp8_as_on_sm90(enabled: bool = True) -> Callable[..., bool]:
    """A stand-in for `hardware_fp8_applies` that answers as an sm_90 GPU would (False everywhere unless enabled)."""
    from mxlab.kernels.cast.launch import HARDWARE_FP8_FORMATS

    return lambda device, fmt, rounding: enabled and fmt.name in HARDWARE_FP8_FORMATS and rounding == "nearest_even"


def _compile_launch(call: Callable[[], object]) -> list:
    """Run `call` (which launches the cast kernels) with every launch compiled for sm_90 instead; returns
    [(grid, options, CompiledKernel)]."""
    from mxlab.bench.cast_kernels import cast_kernels_replaced

    record: list = []
    with cast_kernels_replaced(
        lambda kernel: CompileOnly(kernel, record), hardware_fp8_applies=hardware_fp8_as_on_sm90()
    ):
        call()
    return record


def _elements_per_thread(options: dict, kernel_name: str) -> int:
    threads = 32 * options["num_warps"]
    if "column_tile" in kernel_name:
        return 32 * options["CB"] * 32 // threads
    return options.get("RB", 1) * options.get("RS", 1) * options["CB"] * 32 // threads


def bench_operations(
    shape: tuple[int, int] = DEFAULT_SHAPE, tile=None, hw_fp8: bool = True
) -> dict[str, Callable[[], object]]:
    """name -> call, for the casts `mxlab bench quant` times, on a CPU BF16 tensor of `shape` (`tile`: a
    TileConfig passed to every call, None for the defaults)."""
    from mxlab.kernels import cast
    from mxlab.numerics.formats import get_format

    x = torch.zeros(shape, dtype=torch.bfloat16)
    fmt = get_format("e4m3")
    launch = cast.CastLaunch(tile=tile, hw_fp8=hw_fp8)
    return {
        "row cast": lambda: cast.quantize(x, fmt, _launch=launch),
        "row fake-quantize": lambda: cast.fake_quantize(x, fmt, _launch=launch),
        "column cast": lambda: cast.quantize(x, fmt, axis=0, _launch=launch),
        "column fake-quantize": lambda: cast.fake_quantize(x, fmt, axis=0, _launch=launch),
        "both cast (one read)": lambda: cast.quantize_rowcol(x, fmt, _launch=launch),
        "(32,32) tile cast": lambda: cast.quantize(x, fmt, block=(32, 32), _launch=launch),
        "row stochastic cast": lambda: cast.quantize(x, fmt, rounding="stochastic", seed=1, _launch=launch),
        "row stochastic fake-quantize": lambda: cast.fake_quantize(
            x, fmt, rounding="stochastic", seed=1, _launch=launch
        ),
    }


def count_operations(
    operations: dict[str, Callable[[], object]], loop_trips: Callable[[str, dict], tuple[int, ...]] | None = None
) -> list[SassCount]:
    """SassCount of every kernel each operation launches. `loop_trips(kernel name, options)` gives the trip
    counts of the SASS loops on the counted path (default: none; the cast kernels' common path has no loop)."""
    counts = []
    for name, call in operations.items():
        for _grid, options, compiled in _compile_launch(call):
            trips = loop_trips(compiled.name, options) if loop_trips else ()
            counts.append(count_compiled(name, compiled, _elements_per_thread(options, compiled.name), trips))
    return counts


def parse_tile(text: str):
    """TileConfig from "ROWSxCOL_BLOCKSxWARPS" (e.g. "16x8x4"). Refuses (ValueError) other text, naming the
    accepted form, and what TileConfig refuses."""
    from mxlab.kernels.cast import TileConfig

    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        raise ValueError(f"tile {text!r}; accepted: ROWSxCOL_BLOCKSxWARPS, e.g. 16x8x4")
    return TileConfig(*(int(part) for part in parts))


def run_sass_bench(
    hw_fp8: bool = True, shape: tuple[int, int] = DEFAULT_SHAPE, tile=None, json_path: Path | None = None
) -> list[SassCount]:
    """Compile and count the bench's casts (`tile`: a TileConfig for every cast, None for the defaults);
    prints a table, writes the counts as JSON to `json_path` if given, and returns them. Raises RuntimeError
    when Triton's ptxas/cuobjdump are missing."""
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    counts = count_operations(bench_operations(shape, tile=tile, hw_fp8=hw_fp8))
    table = Table(
        title=f"sm_{ARCH} SASS, BF16 {shape[0]}x{shape[1]} e4m3 floor nearest_even, hw_fp8={hw_fp8}, "
        f"tile={tile or 'default'}"
    )
    for column in (
        "cast",
        "kernel",
        "instr/elem",
        "cvt/elem",
        "smem/elem",
        "static",
        "regs",
        "spill B",
        "loops (instr x trips, loads, before use)",
    ):
        table.add_column(column)
    for count in counts:
        loops = "; ".join(
            f"{row['instructions']}x{row['trips']}, {row['loads']}, {row['loads_before_first_use']}"
            for row in count.loops
        )
        table.add_row(
            count.name,
            count.kernel,
            f"{count.per_element:.2f}",
            f"{count.fp8_converts_per_element:.2f}",
            f"{count.shared_per_element:.2f}",
            str(count.instructions),
            str(count.registers),
            str(count.spill_bytes),
            loops or count.note or "-",
        )
    Console(width=160).print(table)
    if json_path is not None:
        write_json(Path(json_path), [asdict(count) for count in counts])
    return counts
