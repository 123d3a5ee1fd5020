"""The precision of an emulated GEMM: how each operand is rounded (OperandQuant), the three GEMMs of a
product (GemmQuant for fwd, grad_a, grad_b) and a product's precision with its stochastic-rounding call
counter (MatmulPrecision). mxlab.nn.qmatmul runs products under them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mxlab.numerics.formats import FORMATS
from mxlab.numerics.hadamard import HADAMARD_BLOCKS
from mxlab.numerics.per_tensor import PER_TENSOR_FP8
from mxlab.numerics.quant import HIGH_PRECISION as HIGH_PRECISION_FORMATS
from mxlab.numerics.quant import SQUARE_BLOCK
from mxlab.numerics.reference import BLOCK_SIZE
from mxlab.numerics.seeding import SEED_SLOTS, derive_seed
from mxlab.numerics.vocab import Rounding, ScaleMode

UNUSED_SEEDS = (0,) * len(SEED_SLOTS)  # the seeds of a call that draws none
MX_FORMATS = tuple(FORMATS)
TENSOR_FORMATS = tuple(PER_TENSOR_FP8)
OPERAND_FORMATS = MX_FORMATS + TENSOR_FORMATS + HIGH_PRECISION_FORMATS
BLOCKS = (BLOCK_SIZE, SQUARE_BLOCK)


@dataclass(frozen=True)
class OperandQuant:
    """How one GEMM operand is rounded: element format, block, scale mode and rounding.

    `fmt` is an MX element format (blocks of `block` with an E8M0 scale), a per-tensor FP8
    format (`fp8_tensor_e4m3`, `fp8_tensor_e5m2`: current scaling; block and scale mode do not
    apply, rounding must be nearest_even), or `bf16`/`fp32` (high precision: the operand is
    used unmodified; block, scale mode and rounding do not apply). Refuses unknown values.
    """

    fmt: str
    block: int | tuple[int, int] = 32
    scale_mode: str = "floor"
    rounding: str = "nearest_even"

    def __post_init__(self) -> None:
        if self.fmt not in OPERAND_FORMATS:
            raise ValueError(f"unknown operand format {self.fmt!r}; accepted: {', '.join(OPERAND_FORMATS)}")
        block = tuple(self.block) if isinstance(self.block, (list, tuple)) else self.block
        if block not in BLOCKS:
            raise ValueError(f"unknown block {self.block!r}; accepted: 32 or (32, 32)")
        object.__setattr__(self, "block", block)
        ScaleMode.check(self.scale_mode)
        Rounding.check(self.rounding)
        if self.fmt in TENSOR_FORMATS and self.rounding != "nearest_even":
            raise ValueError(
                f"{self.fmt} (per-tensor FP8, a float8 cast) rounds to nearest even only, not {self.rounding!r}"
            )

    @property
    def high_precision(self) -> bool:
        return self.fmt in HIGH_PRECISION_FORMATS

    @property
    def block_scaled(self) -> bool:
        return self.fmt in MX_FORMATS

    def describe(self) -> str:
        """A short description, e.g. `e4m3 b32 rceil stochastic` or `fp8_tensor_e5m2`."""
        if not self.block_scaled:
            rounding = "" if self.high_precision or self.rounding == "nearest_even" else f" {self.rounding}"
            return f"{self.fmt}{rounding}"
        block = "32x32" if self.block == (32, 32) else "b32"
        rounding = "" if self.rounding == "nearest_even" else f" {self.rounding}"
        return f"{self.fmt} {block} {self.scale_mode}{rounding}"


@dataclass(frozen=True)
class GemmQuant:
    """Precision of one GEMM: its left operand `a`, right operand `b`, and an optional random
    Hadamard transform of block size `hadamard` applied to both along the contraction dimension."""

    a: OperandQuant
    b: OperandQuant
    hadamard: int | None = None

    def __post_init__(self) -> None:
        if self.hadamard is not None and (
            isinstance(self.hadamard, bool)
            or not isinstance(self.hadamard, int)
            or self.hadamard not in HADAMARD_BLOCKS
        ):
            raise ValueError(
                f"hadamard block {self.hadamard!r} is not supported; accepted: None (off) or one of {HADAMARD_BLOCKS}"
            )

    @property
    def high_precision(self) -> bool:
        return self.a.high_precision and self.b.high_precision and self.hadamard is None

    def describe(self) -> str:
        """The operands' precisions joined by ` x ` (one of them when both are the same), e.g.
        `e4m3 b32 rceil`, `e4m3 b32 rceil x e4m3 32x32 rceil`, `bf16`, plus ` +hadamardN`."""
        a, b = self.a.describe(), self.b.describe()
        text = a if a == b else f"{a} x {b}"
        return text + (f" +hadamard{self.hadamard}" if self.hadamard else "")


def _all_fp32() -> GemmQuant:
    return GemmQuant(OperandQuant("fp32"), OperandQuant("fp32"))


@dataclass
class MatmulPrecision:
    """Precision of a product a @ b and of its two gradients, plus the run-time state that the
    product needs: seeds for stochastic rounding, the optional per-layer gradient scale, and its
    statistics.

    `fwd` has operands (a, b); `grad_a` has operands (g, b) and computes g @ b^T; `grad_b` has
    operands (a, g) and computes a^T @ g. `labels` name the three GEMMs in diagnostics
    (QLinear: fwd, dgrad, wgrad). `name` is the module's qualified name.
    `grad_scale` (None: off) multiplies the incoming gradient before it is quantized and divides
    both gradients after their GEMMs; the backward then accumulates `grad_stats`.
    """

    fwd: GemmQuant = field(default_factory=_all_fp32)
    grad_a: GemmQuant = field(default_factory=_all_fp32)
    grad_b: GemmQuant = field(default_factory=_all_fp32)
    labels: tuple[str, str, str] = ("fwd", "grad_a", "grad_b")
    name: str = ""
    seed: int = 0
    calls: int = 0
    grad_scale: float | None = None
    grad_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def high_precision(self) -> bool:
        return self.fwd.high_precision and self.grad_a.high_precision and self.grad_b.high_precision

    def __repr__(self) -> str:
        gemms = ", ".join(f"{label}={gemm.describe()}" for label, gemm in self.gemms().items())
        scale = "" if self.grad_scale is None else f", grad_scale={self.grad_scale:g}"
        return f"MatmulPrecision({self.name or '?'}: {gemms}, seed={self.seed}, calls={self.calls}{scale})"

    def gemms(self) -> dict[str, GemmQuant]:
        """The three GEMMs keyed by their labels."""
        return dict(zip(self.labels, (self.fwd, self.grad_a, self.grad_b)))

    @property
    def draws_per_call(self) -> bool:
        """Whether a call uses its seeds: stochastic rounding or a random Hadamard transform in any GEMM."""
        return any(
            gemm.hadamard is not None or "stochastic" in (gemm.a.rounding, gemm.b.rounding)
            for gemm in (self.fwd, self.grad_a, self.grad_b)
        )

    def next_call_seeds(self) -> tuple[int, ...]:
        """Seeds of every SEED_SLOTS slot (indexed by slot number) for the next call; advances the call counter
        (a product that draws nothing gets UNUSED_SEEDS, and its counter does not advance inside torch.compile).
        Refuses (RuntimeError) a call that uses its seeds while a CUDA graph is being captured: every replay
        would repeat the captured call's random bits (deterministic recipes capture and replay exactly)."""
        if self.draws_per_call and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{self.name or 'an emulated product'} rounds stochastically "
                "or uses a random Hadamard transform, whose "
                "seeds change every call; captured in a CUDA graph, every replay would repeat the same random bits. "
                "Capture only deterministic recipes, or run this one eagerly"
            )
        if not self.draws_per_call:  # unused seeds; a compiled graph does not count (nor specialize on) its calls
            if not torch.compiler.is_compiling():
                self.calls += 1
            return UNUSED_SEEDS
        seeds = tuple(derive_seed(self.seed, self.calls, slot) for slot in range(len(SEED_SLOTS)))
        self.calls += 1
        return seeds

    def reset_grad_stats(self) -> dict[str, Any]:
        """Return the gradient statistics gathered since the last reset and start new ones."""
        stats, self.grad_stats = self.grad_stats, {}
        return stats
