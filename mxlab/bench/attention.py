"""`mxlab bench attention`: the jagged attention kernel against padded SDPA and FlexAttention.

Shapes (the H200 GEM model: 4 heads of 64): 512 sequences with log-normal lengths (mu 5.5,
sigma 0.8, rounded and clipped to [8, 1024]); self-attention over the history (softmax, causal
and not; SiLU), cross-attention (5 tokens per example attend to its history) and pooled
attention (4 seed queries per example attend to its history). Everything runs forward +
backward in BF16, timed with CUDA events after warm-up; the baselines run in the same process.
For the self shape, "loop" rows time 50 back-to-back steps with one synchronization (a training
loop's throughput; the note gives the host's enqueue time per step) and "graph" rows replay the
step from a CUDA graph (device time alone): their gap is the host overhead.

Useful FLOPs count only pairs inside a sequence: 4 * Lq * Lk * D per head forward (causal: the
pairs j <= i), x 3.5 for forward + backward ("fwd only" rows: the forward's share alone). The kernel's MX mode (MXFP8 e4m3 operands, floor
scales, nearest-even) is timed on the same shapes; its useful FLOPs are the same. On the self shape
two more MX rows: "integer convert" (hw_fp8=False: the integer quantization steps where the GPU's FP8
convert would run; the same bits) and "SR grads" (dO and dS rounded stochastically, in the kernel).

"kernel mxfp8 ablate: NAME" rows (self shape, fwd+bwd and fwd only) time the MX kernel with one cost
removed (`jagged_attention(..., _ablate=...)`, benchmark-only, wrong results by design, same memory
traffic): "no P quant" (P rounded to bfloat16 only, forward and dK/dV), "no dS quant" (dK/dV and dQ),
"one softmax pass" (the forward's statistics pass folded into the PV pass), "no P split" (the row term
from one bfloat16 part of P), "no row term" (no P @ quant(V) in the forward), "no prequantize" (no Q, K,
V, dO quantization launches), and three sums: "no quantization", "no MX softmax structure" (one pass,
no row term), "everything". Their gap to "kernel mxfp8" is what that part costs; "kernel bf16 MX tiles"
is the BF16 kernel with the MX tile sizes, "kernel mxfp8 tiles" the MX kernel with other tile sizes (the note
names them). `attention_sass_counts` (`mxlab bench attention-sass`)
gives the static sm_90 counts of the same kernels without a GPU.
"""
from __future__ import annotations

import platform
import tempfile
import time
import warnings
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from mxlab.io import write_json

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


@dataclass
class Measurement:
    """Timing of one method on one shape (ms for forward + backward; None when it did not run)."""

    shape: str
    method: str
    ms: Optional[float]
    useful_tflops: Optional[float]
    note: str = ""
    host_ms: Optional[float] = None  # loop rows: host time to enqueue one step


@dataclass
class AttentionBenchResult:
    """Everything `mxlab bench attention` prints, for --json."""

    environment: dict[str, Any]
    lengths: dict[str, float]
    measurements: list[Measurement] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    checks: dict[str, float] = field(default_factory=dict)


def _jagged_kernels() -> Any:
    """mxlab.kernels.jagged_attention (refuses with ImportError when Triton is missing)."""
    import importlib

    return importlib.import_module("mxlab.kernels.jagged_attention")


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


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


def _time_ms(step: Callable[[], None], warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _time_loop_ms(step: Callable[[], None], warmup: int, steps: int) -> tuple[float, float]:
    """(wall ms per step, host ms per step) over `steps` back-to-back steps with one
    synchronization at the end: the throughput of a training loop. The wall time equals the
    host time when the host cannot enqueue work faster than the device runs it."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    host_started = time.perf_counter()
    for _ in range(steps):
        step()
    host_ms = (time.perf_counter() - host_started) * 1e3 / steps
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps, host_ms


def _time_graph_ms(step: Callable[[], None], warmup: int, repeat: int) -> float:
    """Median ms of one replay of `step` captured in a CUDA graph: the device time alone, no
    host overhead. `step` must not synchronize with the host once warmed up."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 2)):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    try:
        return _time_ms(graph.replay, warmup, repeat)
    finally:
        del graph


def _fwd_bwd(fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
    """One forward + backward step. Gradients come from `torch.autograd.grad`, not `.backward()`:
    no accumulation into the leaves' `.grad`, whose AccumulateGrad nodes would tie the step to
    the stream they were created on and break CUDA graph capture on a side stream."""
    def step() -> None:
        torch.autograd.grad(fn(), inputs, grad)

    return step


def _mx_policy(fmt: str = "e4m3", scale_mode: str = "floor", grad_rounding: str = "nearest_even") -> Any:
    """MX attention policy: every operand `fmt` in blocks of 32; gradients (dO, dS) rounded `grad_rounding`."""
    from mxlab.nn.qmatmul import OperandQuant
    from mxlab.recipe import AttentionPolicy, AttentionRecipe

    operand = OperandQuant(fmt, 32, scale_mode, "nearest_even")
    grad = OperandQuant(fmt, 32, scale_mode, grad_rounding)
    recipe = AttentionRecipe(operand, grad, operand, grad)
    return AttentionPolicy(qk=recipe.product_precision("qk", "bench", 0), pv=recipe.product_precision("pv", "bench", 0))


def _padding_slots(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Row of each packed token in a (len(lengths) * width) padded layout: sequence * width + position."""
    total = int(lengths.sum())
    sequence = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=total)
    return sequence * width + torch.arange(total, device=lengths.device) - _offsets(lengths)[:-1][sequence]


def _padded(x: torch.Tensor, slots: torch.Tensor, batch: int, width: int) -> torch.Tensor:
    """(total, H, D) packed -> (batch, H, width, D) zero padded (differentiable). Each token is copied to
    its own slot (`_padding_slots`), so the backward is a gather; a gather-based padding whose padding
    positions all read token 0 makes the backward accumulate into one row (365 ms per call at the
    bench shape on the H200)."""
    padded = x.new_zeros(batch * width, *x.shape[1:]).index_copy(0, slots, x)
    return padded.reshape(batch, width, *x.shape[1:]).transpose(1, 2)


def run_attention_bench(
    json_path: Optional[Path] = None,
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
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    kernels = _jagged_kernels()
    TileSizes, jagged_attention = kernels.TileSizes, kernels.jagged_attention

    device = torch.device("cuda")
    dtype = torch.bfloat16
    lengths = sample_lengths(seed=seed).to(device)
    offsets = _offsets(lengths)
    total = int(offsets[-1])
    max_length = int(lengths.max())
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator).requires_grad_()

    history_q, history_k, history_v = randn(total, HEADS, HEAD_DIM), randn(total, HEADS, HEAD_DIM), randn(total, HEADS, HEAD_DIM)
    compiled_flex = torch.compile(flex_attention)
    mx_policy = _mx_policy()
    sr_policy = _mx_policy(grad_rounding="stochastic")
    result = AttentionBenchResult(
        environment={
            "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "python": platform.python_version(),
            "warmup": warmup, "repeat": repeat, "seed": seed,
        },
        lengths={
            "n": float(lengths.numel()), "mean": float(lengths.double().mean()), "max": float(max_length),
            "min": float(lengths.min()), "total_tokens": float(total),
            "padded_fraction_useful": float((lengths.double() ** 2).sum() / (lengths.numel() * max_length**2)),
        },
    )
    print_fn(
        f"jagged attention bench: {lengths.numel()} sequences, lengths mean {result.lengths['mean']:.1f} max {max_length}, "
        f"{HEADS} heads x {HEAD_DIM}, BF16, forward + backward ({result.environment['device']})"
    )

    shapes = [
        Shape("self", "self", False, "softmax"),
        Shape("self-causal", "self", True, "softmax"),
        Shape(f"cross-{CROSS_TOKENS}", "cross", False, "softmax", CROSS_TOKENS),
        Shape(f"pma-{PMA_SEEDS}", "cross", False, "softmax", PMA_SEEDS),
        Shape("self-silu", "self", False, "silu"),
    ]

    def record(shape: Shape, method: str, ms: Optional[float], flops: float, note: str = "", host_ms: Optional[float] = None) -> None:
        tflops = flops / (ms * 1e-3) / 1e12 if ms else None
        result.measurements.append(Measurement(shape.name, method, ms, tflops, note, host_ms))
        shown = f"{ms:9.3f} ms {tflops:7.1f} useful TFLOP/s" if ms else f"{'-':>9}    {'':>7}"
        print_fn(f"  {shape.name:<12} {method:<24} {shown} {note}")

    def record_host_split(shape: Shape, method: str, step: Callable[[], None], flops: float) -> None:
        """`method loop`: N back-to-back steps, one sync (note: host enqueue ms per step);
        `method graph`: the same step replayed from a CUDA graph (device time only)."""
        try:
            loop_ms, host_ms = _time_loop_ms(step, warmup, LOOP_STEPS)
            record(shape, f"{method} loop", loop_ms, flops, f"{LOOP_STEPS} steps, one sync; host enqueue {host_ms:.3f} ms/step", host_ms)
        except Exception as error:  # report, keep the other numbers
            record(shape, f"{method} loop", None, flops, f"failed: {type(error).__name__}: {error}"[:200])
        try:
            record(shape, f"{method} graph", _time_graph_ms(step, warmup, repeat), flops, "CUDA graph replay: device time")
        except Exception as error:
            torch.cuda.synchronize()
            record(shape, f"{method} graph", None, flops, f"failed: {type(error).__name__}: {error}"[:200])

    for shape in shapes:
        if shape.kind == "self":
            q, k, v = history_q, history_k, history_v
            q_lengths, q_offsets = lengths, offsets
        else:
            q_lengths = torch.full_like(lengths, shape.queries_per_example)
            q_offsets = _offsets(q_lengths)
            q = randn(int(q_offsets[-1]), HEADS, HEAD_DIM)
            k, v = history_k, history_v
        flops = useful_flops(q_lengths, lengths, shape.causal, HEADS, HEAD_DIM)
        grad = torch.randn(q.shape, device=device, dtype=dtype, generator=generator)
        inputs = [q, k, v]

        def kernel(policy: Any = None, tiles: Optional[TileSizes] = None, hw_fp8: bool = True) -> torch.Tensor:
            return jagged_attention(q, k, v, q_offsets, offsets, causal=shape.causal, activation=shape.activation, policy=policy,
                                    tiles=tiles, hw_fp8=hw_fp8)

        with torch.no_grad():  # a kept output must not hold the leaves' AccumulateGrad nodes (CUDA graph capture)
            kernel_out = kernel()
        record(shape, "kernel bf16", _time_ms(_fwd_bwd(kernel, inputs, grad), warmup, repeat), flops)
        record(shape, "kernel mxfp8", _time_ms(_fwd_bwd(lambda: kernel(mx_policy), inputs, grad), warmup, repeat), flops)
        if shape.name == "self":  # what the hardware FP8 convert saves, what stochastic gradients cost
            record(shape, "kernel mxfp8 integer convert",
                   _time_ms(_fwd_bwd(lambda: kernel(mx_policy, hw_fp8=False), inputs, grad), warmup, repeat), flops,
                   "integer quantization steps, no FP8 convert instructions")
            record(shape, "kernel mxfp8 SR grads",
                   _time_ms(_fwd_bwd(lambda: kernel(sr_policy), inputs, grad), warmup, repeat), flops,
                   "dO and dS rounded stochastically")
        if shape.name == "self":  # what each part of the MX kernels costs (benchmark-only ablations, wrong results)
            for ablation, ablate in _ablation_rows(kernels.ABLATIONS).items():
                def ablated(ablate: int = ablate) -> torch.Tensor:
                    return jagged_attention(q, k, v, q_offsets, offsets, causal=shape.causal, activation=shape.activation,
                                            policy=mx_policy, _ablate=ablate)

                record(shape, f"kernel mxfp8 ablate: {ablation}", _time_ms(_fwd_bwd(ablated, inputs, grad), warmup, repeat), flops,
                       f"_ablate={ablate}")
                record(shape, f"kernel mxfp8 ablate: {ablation} fwd only", _time_ms(ablated, warmup, repeat), flops / 3.5,
                       f"_ablate={ablate}")
            for tiles in _mx_tile_candidates():
                record(shape, "kernel mxfp8 tiles", _time_ms(_fwd_bwd(lambda: kernel(mx_policy, tiles), inputs, grad), warmup, repeat),
                       flops, _tiles_text(tiles))
                record(shape, "kernel mxfp8 tiles fwd only", _time_ms(lambda: kernel(mx_policy, tiles), warmup, repeat), flops / 3.5,
                       _tiles_text(tiles))
            bf16_mx_tiles = kernels.DEFAULT_MX_TILES
            record(shape, "kernel bf16 MX tiles", _time_ms(_fwd_bwd(lambda: kernel(None, bf16_mx_tiles), inputs, grad), warmup, repeat),
                   flops, _tiles_text(bf16_mx_tiles))
            record(shape, "kernel bf16 MX tiles fwd only", _time_ms(lambda: kernel(None, bf16_mx_tiles), warmup, repeat), flops / 3.5,
                   _tiles_text(bf16_mx_tiles))
        if shape.name in ("self", "self-causal"):  # forward alone: where the time goes
            record(shape, "kernel bf16 fwd only", _time_ms(kernel, warmup, repeat), flops / 3.5)
            record(shape, "kernel mxfp8 fwd only", _time_ms(lambda: kernel(mx_policy), warmup, repeat), flops / 3.5)
        if shape.name == "self":  # host overhead apart from device time
            record_host_split(shape, "kernel bf16", _fwd_bwd(kernel, inputs, grad), flops)
            record_host_split(shape, "kernel mxfp8", _fwd_bwd(lambda: kernel(mx_policy), inputs, grad), flops)
            record_host_split(shape, "kernel bf16 fwd only", kernel, flops / 3.5)
        if sweep_tiles and shape.name == "self":
            for tiles in _sweep_candidates():
                for mode, policy in (("bf16", None), ("mxfp8", mx_policy)):
                    if policy is not None and any(getattr(tiles, n) % 32 for n in ("fwd_m", "fwd_n", "dkdv_m", "dkdv_n", "dq_m", "dq_n")):
                        continue
                    try:
                        ms = _time_ms(_fwd_bwd(lambda: kernel(policy, tiles), inputs, grad), 1, 5)
                        fwd_ms = _time_ms(lambda: kernel(policy, tiles), 1, 5)
                    except Exception as error:  # a tile that does not fit shared memory: report it, go on
                        record(shape, f"  sweep {mode}", None, flops, f"{_tiles_text(tiles)} failed: {type(error).__name__}")
                        continue
                    record(shape, f"  sweep {mode}", ms, flops, f"{_tiles_text(tiles)} fwd {fwd_ms:.3f} ms")

        # FlexAttention with a document mask over the packed tokens (one batch entry).
        if shape.activation == "softmax":
            q_doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), q_lengths)
            k_doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
            k_pos = torch.arange(total, device=device) - offsets[:-1][k_doc]
            q_pos = torch.arange(q.shape[0], device=device) - q_offsets[:-1][q_doc]
            causal = shape.causal

            def document_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
                same = q_doc[q_idx] == k_doc[kv_idx]
                if causal:
                    same = same & (k_pos[kv_idx] <= q_pos[q_idx])
                return same

            def flex() -> torch.Tensor:
                out = compiled_flex(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=block_mask)
                return out[0].transpose(0, 1)

            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    block_mask = create_block_mask(document_mask, None, None, q.shape[0], total, device=device, _compile=True)
                with torch.no_grad():
                    flex_out = flex()
                record(shape, "flex document mask", _time_ms(_fwd_bwd(flex, inputs, grad), warmup, repeat), flops)
                if shape.name in ("self", "self-causal"):
                    record(shape, "flex fwd only", _time_ms(flex, warmup, repeat), flops / 3.5)
                if shape.name == "self":
                    record_host_split(shape, "flex document mask", _fwd_bwd(flex, inputs, grad), flops)
                difference = float((flex_out.detach().float() - kernel_out.detach().float()).abs().max())
                result.checks[f"{shape.name}: max |kernel bf16 - flex|"] = difference
            except Exception as error:  # report, keep the other numbers
                record(shape, "flex document mask", None, flops, f"failed: {type(error).__name__}: {error}"[:200])

            # Padded SDPA with a key mask, as an additive BF16 bias (SDPA picks its cuDNN kernel for it).
            q_width = int(q_lengths.max())
            batch = lengths.numel()
            q_slots, k_slots = _padding_slots(q_lengths, q_width), _padding_slots(lengths, max_length)
            key_mask = (torch.arange(max_length, device=device)[None, :] < lengths[:, None])[:, None, None, :]
            if causal:
                key_mask = key_mask & torch.ones(q_width, max_length, dtype=torch.bool, device=device).tril()[None, None]
            key_mask = torch.zeros(key_mask.shape, device=device, dtype=dtype).masked_fill(~key_mask, float("-inf"))

            def padded_sdpa() -> torch.Tensor:
                qp = _padded(q, q_slots, batch, q_width)
                kp, vp = _padded(k, k_slots, batch, max_length), _padded(v, k_slots, batch, max_length)
                out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=key_mask)
                return out.transpose(1, 2).reshape(batch * q_width, *out.shape[1:2], out.shape[-1]).index_select(0, q_slots)

            try:
                record(shape, "padded sdpa key mask", _time_ms(_fwd_bwd(padded_sdpa, inputs, grad), warmup, repeat), flops)
            except Exception as error:
                record(shape, "padded sdpa key mask", None, flops, f"failed: {type(error).__name__}: {error}"[:200])
        del kernel_out
        torch.cuda.empty_cache()
        _summarize(result, shapes)
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


def _summarize(result: AttentionBenchResult, shapes: list[Shape]) -> None:
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
                    result.ratios[f"{shape.name}: {method} {timing} / flex {timing} speed-up"] = flex_timed_ms / kernel_ms


def _mx_tile_candidates() -> list[Any]:
    """MX tile sizes timed next to the default on the self shape: the same 16 scores per thread as the default
    at 8 warps (twice the rows per program: half the key/value loads per query row), without spills on sm_90
    (`mxlab bench attention-sass`)."""
    TileSizes = _jagged_kernels().TileSizes
    return [TileSizes(128, 32, 32, 128, 128, 32, 8, 2), TileSizes(128, 32, 32, 64, 128, 32, 8, 2)]


def _ablation_rows(ablations: dict[str, int]) -> dict[str, int]:
    """Bench rows of the MX ablations: each single one, every quantization removed (P, dS, prequantize), the MX
    softmax structure removed (statistics pass, row term), and everything removed."""
    quantization = ablations["no P quant"] | ablations["no dS quant"] | ablations["no prequantize"]
    structure = ablations["one softmax pass"] | ablations["no row term"]
    return {**ablations, "no quantization": quantization, "no MX softmax structure": structure,
            "everything": quantization | structure}


def _compile_one(mode: str, causal: bool, activation: str, tile_fields: Optional[tuple], ablate: int = 0) -> str:
    """Run the kernel once, forward + backward, on a tiny batch with the benchmark's heads and head
    dim, so that its compiled variants land in Triton's on-disk cache. Returns what it did.
    (Tiles travel as a tuple of TileSizes fields: a worker imports the kernels only here.)"""
    kernels = _jagged_kernels()
    jagged_attention = kernels.jagged_attention
    tiles = kernels.TileSizes(*tile_fields) if tile_fields is not None else None

    device = torch.device("cuda")
    lengths = torch.tensor([40, 70, 5], device=device)
    offsets = _offsets(lengths)
    q, k, v = (torch.randn(int(offsets[-1]), HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = jagged_attention(q, k, v, offsets, offsets, causal=causal, activation=activation,
                           policy=_mx_policy() if mode == "mxfp8" else None, tiles=tiles, _ablate=ablate)
    out.backward(torch.ones_like(out))
    if ablate:
        torch.cuda.synchronize()
        return f"{mode} causal={causal} {activation} _ablate={ablate}"
    q_cross = torch.randn(3 * CROSS_TOKENS, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, requires_grad=True)
    if not causal:
        cross = jagged_attention(q_cross, k, v, _offsets(torch.full_like(lengths, CROSS_TOKENS)), offsets, activation=activation,
                                 policy=_mx_policy() if mode == "mxfp8" else None, tiles=tiles)
        cross.backward(torch.ones_like(cross))
    torch.cuda.synchronize()
    return f"{mode} causal={causal} {activation} {_tiles_text(tiles) if tiles is not None else 'default tiles'}"


def precompile_kernels(sweep: bool = False, processes: int = 12, print_fn: Callable[[str], None] = print) -> None:
    """Compile every kernel variant the tests and the bench use (the MX ablation rows included), in parallel
    processes (Triton compiles one variant at a time per process; its cache on disk is shared)."""
    import concurrent.futures
    import multiprocessing

    jobs: list[tuple] = [
        (mode, causal, activation, None)
        for mode in ("bf16", "mxfp8") for causal in (False, True) for activation in ("softmax", "silu")
    ]
    jobs += [("mxfp8", False, "softmax", None, ablate) for ablate in _ablation_rows(_jagged_kernels().ABLATIONS).values()]
    jobs += [("bf16", False, "softmax", astuple(_jagged_kernels().DEFAULT_MX_TILES))]
    jobs += [("mxfp8", False, "softmax", astuple(tiles)) for tiles in _mx_tile_candidates()]
    if sweep:
        jobs += [(mode, False, "softmax", astuple(tiles)) for tiles in _sweep_candidates() for mode in ("bf16", "mxfp8")
                 if mode == "bf16" or all(getattr(tiles, n) % 32 == 0 for n in ("fwd_m", "fwd_n", "dkdv_m", "dkdv_n", "dq_m", "dq_n"))]
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(processes, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(_compile_one, *job) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            try:
                print_fn(f"compiled {future.result()}")
            except Exception as error:  # report and go on: the timed run will show the failure too
                print_fn(f"compile failed: {type(error).__name__}: {str(error)[:300]}")
    print_fn(f"precompiled {len(jobs)} configurations in {time.perf_counter() - started:.1f} s")


def _tiles_text(tiles: Any) -> str:
    return (f"fwd {tiles.fwd_m}x{tiles.fwd_n} dkdv {tiles.dkdv_m}x{tiles.dkdv_n} dq {tiles.dq_m}x{tiles.dq_n} "
            f"w{tiles.num_warps} s{tiles.num_stages}{' fused-dq' if tiles.fused_dq else ''}")


def _sweep_candidates() -> list[Any]:
    TileSizes = _jagged_kernels().TileSizes

    return [
        TileSizes(128, 64, 128, 64, 128, 64, 8, 2),
        TileSizes(128, 64, 64, 64, 64, 64, 4, 2),  # the BF16 default
        TileSizes(128, 64, 64, 64, 64, 64, 4, 3),
        TileSizes(128, 128, 64, 64, 64, 64, 8, 3),
        TileSizes(128, 128, 64, 64, 64, 64, 8, 2),
        TileSizes(128, 128, 64, 128, 128, 64, 8, 2),
        TileSizes(128, 64, 128, 64, 128, 64, 8, 3),
        TileSizes(64, 32, 32, 64, 64, 32, 4, 2),  # the MX default
        TileSizes(64, 64, 64, 64, 64, 64, 8, 2),
        TileSizes(128, 32, 32, 128, 128, 32, 8, 2),
        TileSizes(64, 32, 32, 64, 64, 32, 4, 3),
        TileSizes(128, 64, 128, 64, 128, 64, 8, 2, fused_dq=True),
        TileSizes(64, 32, 32, 64, 64, 32, 4, 2, fused_dq=True),
    ]


# ----------------------------------------------------------------------------- static sm_90 counts
SASS_ARCH = 90
# Opcode classes counted per loop body (prefix match on the SASS opcode).
_OPCODE_CLASSES = {
    "mma": ("HMMA", "HGMMA", "WARPGROUP"), "mufu": ("MUFU",), "fp8/bf16 convert": ("F2FP",), "shuffle": ("SHFL",),
    "shared": ("LDS", "STS", "LDSM", "STSM"), "barrier": ("BAR",), "global": ("LDG", "STG", "LDGSTS", "RED", "ATOM"),
    "local (spill)": ("LDL", "STL"),
}


@dataclass
class KernelSassCount:
    """Static sm_90 counts of one compiled attention kernel (no GPU needed)."""

    variant: str  # the ablation (or "kernel") it was compiled for
    kernel: str
    registers: int
    spill_bytes: int  # local memory per thread (stack + local); > 0 means spills
    instructions: int  # static SASS instructions, NOPs left out
    loops: list[dict[str, int]] = field(default_factory=list)  # per loop (back edge): `_loop_counts`
    constexprs: dict[str, Any] = field(default_factory=dict)


def _sass_listing(cubin: bytes) -> list[tuple[int, str, bool]]:
    """(byte offset, instruction text without its guard, guarded) of every non-NOP instruction of the first
    function in `cubin`, from `cuobjdump -sass` itself (Triton's asm["sass"] stops at 4096 instructions)."""
    import re
    import subprocess

    from mxlab.bench.sass import _tool

    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.check_output([_tool("cuobjdump"), "-sass", handle.name], text=True)
    listing = []
    for match in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", text):
        body = match.group(2).strip()
        guard = re.match(r"^@!?U?P[T\d]+\s+", body)
        instruction = body[guard.end():] if guard else body
        if not instruction.startswith("NOP"):
            listing.append((int(match.group(1), 16), instruction, guard is not None))
    return listing


def _branch_target(instruction: str) -> Optional[int]:
    import re

    branch = re.match(r"BRA(?:\.\w+)*\s+(0x[0-9a-f]+)", instruction)
    return int(branch.group(1), 16) if branch else None


def _classes(body: list[str]) -> dict[str, int]:
    return {name: sum(text.split()[0].startswith(prefixes) for text in body) for name, prefixes in _OPCODE_CLASSES.items()}


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
            position = position_of.get(jump, last) if jump is not None and jump > listing[position][0] and not guarded else position + 1
        loops.append({"static": last - first + 1, "path": len(path), **_classes(path)})
    return loops


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    from mxlab.bench.sass import _resource_usage as usage

    return usage(cubin)


def attention_sass_counts(ablations: Optional[dict[str, int]] = None, tiles: Any = None, hw_fp8: bool = True,
                          fmt: str = "e4m3") -> list[KernelSassCount]:
    """Static sm_90 counts (registers, spills, instructions, per-loop instruction classes) of every kernel one
    MX forward + backward of the bench's self shape launches (BF16 4 x 64, softmax, not causal, `fmt` floor
    nearest-even, the hardware FP8 path as on an H200 unless hw_fp8=False), for each ablation mask in
    `ablations` (name -> `_ablate`; default: the kernel alone). The launches are the real ones with each
    `[grid](...)` replaced by a compile for GPUTarget("cuda", 90, 32), so specialization and constexprs are
    what an H200 run gets. Refuses (RuntimeError) to run under TRITON_INTERPRET=1 or without Triton's ptxas."""
    import importlib
    import os

    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("attention_sass_counts compiles for sm_90; unset TRITON_INTERPRET=1")
    from mxlab.bench.sass import _CompileOnly
    from mxlab.kernels import mx_quant

    module = importlib.import_module("mxlab.kernels.jagged_attention")
    tiles = tiles or module.DEFAULT_MX_TILES
    ablations = ablations or {"kernel": 0}
    lengths = torch.tensor([300, 17, 64])
    offsets = _offsets(lengths)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(int(offsets[-1]), HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16).requires_grad_()
               for _ in range(3))
    policy = _mx_policy(fmt)
    names = ("_jagged_attention_fwd", "_jagged_attention_bwd_dkdv", "_jagged_attention_bwd_dq", "_prequantize", "_row_dot")
    counts = []
    for variant, ablate in ablations.items():
        record: list = []
        replaced: dict[str, Any] = {name: _CompileOnly(getattr(module, name), record) for name in names}
        replaced["hardware_fp8_applies"] = lambda device, element, rounding: (
            hw_fp8 and element.name in mx_quant.HARDWARE_FP8_FORMATS and rounding == "nearest_even")
        saved = {name: getattr(module, name) for name in replaced}
        try:
            for name, value in replaced.items():
                setattr(module, name, value)
            out = module.jagged_attention(q, k, v, offsets, offsets, policy=policy, tiles=tiles, _ablate=ablate)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        finally:
            for name, value in saved.items():
                setattr(module, name, value)
        for _grid, constexprs, compiled in record:
            cubin = compiled.asm["cubin"]
            listing = _sass_listing(cubin)
            registers, spill = _resource_usage(cubin)
            shown = {key: value for key, value in constexprs.items() if key in ("BLOCK_M", "BLOCK_N", "COLS", "ABLATE", "num_warps")}
            counts.append(KernelSassCount(variant, compiled.name, registers, spill, len(listing), _loop_counts(listing), shown))
    return counts


def print_attention_sass_counts(counts: list[KernelSassCount], print_fn: Callable[[str], None] = print) -> None:
    """One line per kernel and variant: registers, spill bytes, static instructions, and per loop its
    instructions with the mma / MUFU / convert / shuffle / shared / barrier / spill counts."""
    print_fn(f"{'variant':<18} {'kernel':<28} {'regs':>4} {'spill B':>7} {'static':>6}  "
             f"loops: static/path instr (path: mma mufu cvt shfl smem bar local)")
    for count in counts:
        loops = "; ".join(
            f"{row['static']}/{row['path']} ({row['mma']} {row['mufu']} {row['fp8/bf16 convert']} {row['shuffle']} {row['shared']} "
            f"{row['barrier']} {row['local (spill)']})" for row in count.loops)
        print_fn(f"{count.variant:<18} {count.kernel:<28} {count.registers:>4} {count.spill_bytes:>7} {count.instructions:>6}  {loops or '-'}")


__all__ = ["run_attention_bench", "sample_lengths", "useful_flops", "AttentionBenchResult", "Measurement", "Shape",
           "attention_sass_counts", "print_attention_sass_counts", "KernelSassCount"]
