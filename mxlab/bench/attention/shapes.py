"""What `mxlab bench attention` measures: its shapes, its records, the jagged histories it draws, useful FLOPs,
the MX policy it times, and the padding of the padded-SDPA baseline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

N_SEQUENCES = 512
HEADS = 4
HEAD_DIM = 64
LENGTH_MU, LENGTH_SIGMA, LENGTH_MIN, LENGTH_MAX = 5.5, 0.8, 8, 1024
CROSS_TOKENS = 5  # candidate + 3 other fields + dense token of the synthetic source
PMA_SEEDS = 4
LOOP_STEPS = 50  # back-to-back steps of the "loop" rows


@dataclass
class Shape:
    """One benchmarked attention shape over the same jagged histories."""

    name: str
    kind: str  # self | cross
    causal: bool
    activation: str
    queries_per_example: int = 0  # cross shapes only


SHAPES = (
    Shape("self", "self", False, "softmax"),
    Shape("self-causal", "self", True, "softmax"),
    Shape(f"cross-{CROSS_TOKENS}", "cross", False, "softmax", CROSS_TOKENS),
    Shape(f"pma-{PMA_SEEDS}", "cross", False, "softmax", PMA_SEEDS),
    Shape("self-silu", "self", False, "silu"),
)


@dataclass
class Measurement:
    """Timing of one method on one shape (ms for forward + backward; None when it did not run)."""

    shape: str
    method: str
    ms: float | None
    useful_tflops: float | None
    note: str = ""
    host_ms: float | None = None  # loop rows: host time to enqueue one step


@dataclass
class AttentionBenchResult:
    """Everything `mxlab bench attention` prints, for --json."""

    environment: dict[str, Any]
    lengths: dict[str, float]
    measurements: list[Measurement] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    checks: dict[str, float] = field(default_factory=dict)


def sample_lengths(n: int = N_SEQUENCES, seed: int = 0) -> torch.Tensor:
    """Log-normal history lengths (mu 5.5, sigma 0.8) rounded and clipped to [8, 1024], int64."""
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=generator, dtype=torch.float64)
    lengths = torch.exp(LENGTH_MU + LENGTH_SIGMA * normal).round().clamp(LENGTH_MIN, LENGTH_MAX)
    return lengths.to(torch.int64)


def useful_flops(q_lengths: torch.Tensor, k_lengths: torch.Tensor, causal: bool, heads: int, head_dim: int) -> float:
    """Forward + backward FLOPs of the (query, key) pairs inside each sequence: 3.5 x 4 x pairs x D x heads."""
    if causal:
        pairs = float((q_lengths * (q_lengths + 1) // 2).sum())
    else:
        pairs = float((q_lengths * k_lengths).sum())
    return 3.5 * 4.0 * pairs * head_dim * heads


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """(batch + 1,) offsets of packed runs of `lengths`."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


def fwd_bwd(fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
    """One forward + backward step. Gradients come from `torch.autograd.grad`, not `.backward()`:
    no accumulation into the leaves' `.grad`, whose AccumulateGrad nodes would tie the step to
    the stream they were created on and break CUDA graph capture on a side stream."""

    def step() -> None:
        torch.autograd.grad(fn(), inputs, grad)

    return step


def mx_policy(fmt: str = "e4m3", scale_mode: str = "floor", grad_rounding: str = "nearest_even") -> Any:
    """MX attention policy: every operand `fmt` in blocks of 32; gradients (dO, dS) rounded `grad_rounding`."""
    from mxlab.nn.qmatmul import OperandQuant
    from mxlab.recipe import AttentionPolicy, AttentionRecipe

    operand = OperandQuant(fmt, 32, scale_mode, "nearest_even")
    grad = OperandQuant(fmt, 32, scale_mode, grad_rounding)
    recipe = AttentionRecipe(operand, grad, operand, grad)
    return AttentionPolicy(qk=recipe.product_precision("qk", "bench", 0), pv=recipe.product_precision("pv", "bench", 0))


def tiles_text(tiles: Any) -> str:
    """A TileSizes in one line, for notes."""
    return (
        f"fwd {tiles.fwd_m}x{tiles.fwd_n} dkdv {tiles.dkdv_m}x{tiles.dkdv_n} dq {tiles.dq_m}x{tiles.dq_n} "
        f"w{tiles.num_warps} s{tiles.num_stages}{' fused-dq' if tiles.fused_dq else ''}"
    )


def padding_slots(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Row of each packed token in a (len(lengths) * width) padded layout: sequence * width + position."""
    total = int(lengths.sum())
    sequence = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=total)
    return sequence * width + torch.arange(total, device=lengths.device) - offsets_of(lengths)[:-1][sequence]


def padded(x: torch.Tensor, slots: torch.Tensor, batch: int, width: int) -> torch.Tensor:
    """(total, H, D) packed -> (batch, H, width, D) zero padded (differentiable). Each token is copied to
    its own slot (`padding_slots`), so the backward is a gather; a gather-based padding whose padding
    positions all read token 0 makes the backward accumulate into one row (365 ms per call at the
    bench shape on the H200)."""
    out = x.new_zeros(batch * width, *x.shape[1:]).index_copy(0, slots, x)
    return out.reshape(batch, width, *x.shape[1:]).transpose(1, 2)
