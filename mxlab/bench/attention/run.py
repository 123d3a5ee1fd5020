"""The run of `mxlab bench attention`: every shape, the kernel's rows (BF16, MX, their variants), the baselines'
rows, and the speed-ups, printed as they come and written as JSON after every shape."""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mxlab.bench.attention.baselines import flex_document_mask, padded_sdpa
from mxlab.bench.attention.precompile import mx_tile_candidates, sweep_candidates
from mxlab.bench.attention.shapes import (
    HEAD_DIM,
    HEADS,
    LOOP_STEPS,
    SHAPES,
    AttentionBenchResult,
    Measurement,
    Shape,
    fwd_bwd,
    mx_policy,
    offsets_of,
    sample_lengths,
    tiles_text,
    useful_flops,
)
from mxlab.bench.timing import events_ms, graph_ms, loop_ms
from mxlab.io import write_json


@dataclass
class _Recorder:
    """Appends measurements to the result and prints each as it comes."""

    result: AttentionBenchResult
    warmup: int
    repeat: int
    print_fn: Callable[[str], None]

    def time(self, shape: Shape, method: str, step: Callable[[], object], flops: float, note: str = "") -> None:
        """Median events time of `step` (forward + backward, or the forward alone with flops / 3.5)."""
        self.record(shape, method, events_ms(step, self.warmup, self.repeat), flops, note)

    def record(
        self, shape: Shape, method: str, ms: float | None, flops: float, note: str = "", host_ms: float | None = None
    ) -> None:
        tflops = flops / (ms * 1e-3) / 1e12 if ms else None
        self.result.measurements.append(Measurement(shape.name, method, ms, tflops, note, host_ms))
        shown = f"{ms:9.3f} ms {tflops:7.1f} useful TFLOP/s" if ms else f"{'-':>9}    {'':>7}"
        self.print_fn(f"  {shape.name:<12} {method:<24} {shown} {note}")

    def host_split(self, shape: Shape, method: str, step: Callable[[], None], flops: float) -> None:
        """`method loop`: N back-to-back steps, one sync (note: host enqueue ms per step);
        `method graph`: the same step replayed from a CUDA graph (device time only)."""
        try:
            wall_ms, host_ms = loop_ms(step, self.warmup, LOOP_STEPS)
            self.record(
                shape,
                f"{method} loop",
                wall_ms,
                flops,
                f"{LOOP_STEPS} steps, one sync; host enqueue {host_ms:.3f} ms/step",
                host_ms,
            )
        except Exception as error:  # report, keep the other numbers
            self.record(shape, f"{method} loop", None, flops, f"failed: {type(error).__name__}: {error}"[:200])
        try:
            self.record(
                shape,
                f"{method} graph",
                graph_ms(step, self.warmup, self.repeat),
                flops,
                "CUDA graph replay: device time",
            )
        except Exception as error:
            torch.cuda.synchronize()
            self.record(shape, f"{method} graph", None, flops, f"failed: {type(error).__name__}: {error}"[:200])


def _kernel_rows(
    rec: _Recorder,
    shape: Shape,
    kernel: Callable[..., torch.Tensor],
    step: Callable[..., Callable[[], None]],
    flops: float,
    sweep_tiles: bool,
) -> None:
    """The kernel's rows on one shape: BF16 and MX everywhere; on the self shape also the integer convert,
    stochastic gradients, other MX tiles, the BF16 kernel with MX tiles, the host split and the sweep."""
    from mxlab.kernels.attention import DEFAULT_MX_TILES, mx_tiles_problem

    mx, sr = mx_policy(), mx_policy(grad_rounding="stochastic")
    rec.time(shape, "kernel bf16", step(), flops)
    rec.time(shape, "kernel mxfp8", step(mx), flops)
    if shape.name == "self":  # what the hardware FP8 convert saves, what stochastic gradients cost
        rec.time(
            shape,
            "kernel mxfp8 integer convert",
            step(mx, hw_fp8=False),
            flops,
            "integer quantization steps, no FP8 convert instructions",
        )
        rec.time(shape, "kernel mxfp8 SR grads", step(sr), flops, "dO and dS rounded stochastically")
        for tiles in mx_tile_candidates():
            rec.time(shape, "kernel mxfp8 tiles", step(mx, tiles), flops, tiles_text(tiles))
            rec.time(
                shape, "kernel mxfp8 tiles fwd only", lambda t=tiles: kernel(mx, t), flops / 3.5, tiles_text(tiles)
            )
        rec.time(shape, "kernel bf16 MX tiles", step(None, DEFAULT_MX_TILES), flops, tiles_text(DEFAULT_MX_TILES))
        rec.time(
            shape,
            "kernel bf16 MX tiles fwd only",
            lambda: kernel(None, DEFAULT_MX_TILES),
            flops / 3.5,
            tiles_text(DEFAULT_MX_TILES),
        )
    if shape.name in ("self", "self-causal"):  # forward alone: where the time goes
        rec.time(shape, "kernel bf16 fwd only", kernel, flops / 3.5)
        rec.time(shape, "kernel mxfp8 fwd only", lambda: kernel(mx), flops / 3.5)
    if shape.name == "self":  # host overhead apart from device time
        rec.host_split(shape, "kernel bf16", step(), flops)
        rec.host_split(shape, "kernel mxfp8", step(mx), flops)
        rec.host_split(shape, "kernel bf16 fwd only", kernel, flops / 3.5)
    if sweep_tiles and shape.name == "self":
        for tiles in sweep_candidates():
            for mode, policy in (("bf16", None), ("mxfp8", mx)):
                if policy is not None and mx_tiles_problem(tiles, softmax=True) is not None:
                    continue
                try:
                    ms = events_ms(step(policy, tiles), 1, 5)
                    fwd_ms = events_ms(lambda: kernel(policy, tiles), 1, 5)
                except Exception as error:  # a tile that does not fit shared memory: report it, go on
                    rec.record(
                        shape, f"  sweep {mode}", None, flops, f"{tiles_text(tiles)} failed: {type(error).__name__}"
                    )
                    continue
                rec.record(shape, f"  sweep {mode}", ms, flops, f"{tiles_text(tiles)} fwd {fwd_ms:.3f} ms")


def _baseline_rows(
    rec: _Recorder,
    shape: Shape,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad: torch.Tensor,
    q_lengths: torch.Tensor,
    q_offsets: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    kernel_out: torch.Tensor,
    compiled_flex: Callable[..., torch.Tensor],
    flops: float,
) -> None:
    """FlexAttention and padded SDPA on one softmax shape; records kernel-vs-flex differences as checks."""
    inputs = [q, k, v]
    try:
        flex = flex_document_mask(q, k, v, q_lengths, q_offsets, lengths, offsets, shape.causal, compiled_flex)
        with torch.no_grad():
            flex_out = flex()
        rec.time(shape, "flex document mask", fwd_bwd(flex, inputs, grad), flops)
        if shape.name in ("self", "self-causal"):
            rec.time(shape, "flex fwd only", flex, flops / 3.5)
        if shape.name == "self":
            rec.host_split(shape, "flex document mask", fwd_bwd(flex, inputs, grad), flops)
        difference = float((flex_out.detach().float() - kernel_out.detach().float()).abs().max())
        rec.result.checks[f"{shape.name}: max |kernel bf16 - flex|"] = difference
    except Exception as error:  # report, keep the other numbers
        rec.record(shape, "flex document mask", None, flops, f"failed: {type(error).__name__}: {error}"[:200])
    try:
        sdpa = padded_sdpa(q, k, v, q_lengths, lengths, shape.causal)
        rec.time(shape, "padded sdpa key mask", fwd_bwd(sdpa, inputs, grad), flops)
    except Exception as error:
        rec.record(shape, "padded sdpa key mask", None, flops, f"failed: {type(error).__name__}: {error}"[:200])


def _summarize(result: AttentionBenchResult, shapes: tuple[Shape, ...]) -> None:
    """Fill result.ratios from the measurements so far."""
    by_key = {(m.shape, m.method): m.ms for m in result.measurements}
    for shape in shapes:
        flex_ms = by_key.get((shape.name, "flex document mask"))
        sdpa_ms = by_key.get((shape.name, "padded sdpa key mask"))
        for method in ("kernel bf16", "kernel mxfp8"):
            ms = by_key.get((shape.name, method))
            if ms and flex_ms:
                result.ratios[f"{shape.name}: {method} / flex speed-up"] = flex_ms / ms
            if ms and sdpa_ms:
                result.ratios[f"{shape.name}: {method} / padded sdpa speed-up"] = sdpa_ms / ms
            for timing in ("loop", "graph"):  # both sides timed the same way
                kernel_ms = by_key.get((shape.name, f"{method} {timing}"))
                flex_timed_ms = by_key.get((shape.name, f"flex document mask {timing}"))
                if kernel_ms and flex_timed_ms:
                    result.ratios[f"{shape.name}: {method} {timing} / flex {timing} speed-up"] = (
                        flex_timed_ms / kernel_ms
                    )


def _new_result(lengths: torch.Tensor, warmup: int, repeat: int, seed: int) -> AttentionBenchResult:
    total, max_length = int(lengths.sum()), int(lengths.max())
    return AttentionBenchResult(
        environment={
            "device": torch.cuda.get_device_name(lengths.device),
            "torch": torch.__version__,
            "triton": __import__("triton").__version__,
            "python": platform.python_version(),
            "warmup": warmup,
            "repeat": repeat,
            "seed": seed,
        },
        lengths={
            "n": float(lengths.numel()),
            "mean": float(lengths.double().mean()),
            "max": float(max_length),
            "min": float(lengths.min()),
            "total_tokens": float(total),
            "padded_fraction_useful": float((lengths.double() ** 2).sum() / (lengths.numel() * max_length**2)),
        },
    )


def run_attention_bench(
    json_path: Path | None = None,
    *,
    seed: int = 0,
    warmup: int = 3,
    repeat: int = 10,
    sweep_tiles: bool = False,
    print_fn: Callable[[str], None] = print,
) -> AttentionBenchResult:
    """Time the kernel (BF16 and MX) and the baselines on every shape; return (and optionally
    write as JSON) the measurements. Refuses to run without CUDA (RuntimeError)."""
    if not torch.cuda.is_available():
        raise RuntimeError("mxlab bench attention needs a CUDA device")
    from torch.nn.attention.flex_attention import flex_attention

    from mxlab.kernels.attention import AttentionLaunch, jagged_attention
    from mxlab.nn.attention import call_seeds

    device, dtype = torch.device("cuda"), torch.bfloat16
    lengths = sample_lengths(seed=seed).to(device)
    offsets = offsets_of(lengths)
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator).requires_grad_()

    total = int(offsets[-1])
    history_q, history_k, history_v = (
        randn(total, HEADS, HEAD_DIM),
        randn(total, HEADS, HEAD_DIM),
        randn(total, HEADS, HEAD_DIM),
    )
    compiled_flex = torch.compile(flex_attention)
    result = _new_result(lengths, warmup, repeat, seed)
    rec = _Recorder(result, warmup, repeat, print_fn)
    print_fn(
        f"jagged attention bench: {lengths.numel()} sequences, lengths "
        f"mean {result.lengths['mean']:.1f} max {int(lengths.max())}, "
        f"{HEADS} heads x {HEAD_DIM}, BF16, forward + backward ({result.environment['device']})"
    )
    for shape in SHAPES:
        if shape.kind == "self":
            q, k, v, q_lengths, q_offsets = history_q, history_k, history_v, lengths, offsets
        else:
            q_lengths = torch.full_like(lengths, shape.queries_per_example)
            q_offsets = offsets_of(q_lengths)
            q, k, v = randn(int(q_offsets[-1]), HEADS, HEAD_DIM), history_k, history_v
        flops = useful_flops(q_lengths, lengths, shape.causal, HEADS, HEAD_DIM)
        grad = torch.randn(q.shape, device=device, dtype=dtype, generator=generator)

        def kernel(
            policy: Any = None,
            tiles: Any = None,
            hw_fp8: bool = True,
            shape: Shape = shape,
            q: torch.Tensor = q,
            q_offsets: torch.Tensor = q_offsets,
        ) -> torch.Tensor:
            return jagged_attention(
                q,
                k,
                v,
                q_offsets,
                offsets,
                causal=shape.causal,
                activation=shape.activation,
                policy=policy,
                seeds=call_seeds(policy),
                _launch=AttentionLaunch(tiles=tiles, hw_fp8=hw_fp8),
            )

        def step(policy: Any = None, tiles: Any = None, hw_fp8: bool = True, q: torch.Tensor = q) -> Callable[[], None]:
            return fwd_bwd(lambda: kernel(policy, tiles, hw_fp8), [q, k, v], grad)

        with torch.no_grad():  # a kept output must not hold the leaves' AccumulateGrad nodes (CUDA graph capture)
            kernel_out = kernel()
        _kernel_rows(rec, shape, kernel, step, flops, sweep_tiles)
        if shape.activation == "softmax":
            _baseline_rows(
                rec, shape, q, k, v, grad, q_lengths, q_offsets, lengths, offsets, kernel_out, compiled_flex, flops
            )
        del kernel_out
        torch.cuda.empty_cache()
        _summarize(result, SHAPES)
        if json_path is not None:  # after every shape, so an interrupted run keeps what it measured
            write_json(Path(json_path), asdict(result))

    print_fn("speed-ups (time of the baseline / time of the kernel, same run):")
    for name, ratio in result.ratios.items():
        print_fn(f"  {name:<48} {ratio:6.2f}x")
    for name, value in result.checks.items():
        print_fn(f"  check {name}: {value:.3e}")
    if json_path is not None:
        print_fn(f"wrote {json_path}")
    return result
