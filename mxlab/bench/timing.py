"""Timing of the benches, in one place: CUDA events around single calls, back-to-back loops with one
synchronization, CUDA graph replays, Triton's `do_bench` (with and without a graph), and host time on the CPU.
Every function runs `step` for warm-up first and returns milliseconds (host: microseconds)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def events_ms(step: Callable[[], object], warmup: int = 3, repeat: int = 20) -> float:
    """Median milliseconds of one call of `step` on the current CUDA stream (CUDA events around each call)."""
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
    return float(statistics.median(times))


def loop_ms(step: Callable[[], object], warmup: int, steps: int) -> tuple[float, float]:
    """(wall ms per step, host ms per step) over `steps` back-to-back steps with one synchronization at the
    end: the throughput of a training loop. The wall time equals the host time when the host cannot enqueue
    work faster than the device runs it."""
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


def graph_ms(step: Callable[[], object], warmup: int, repeat: int) -> float:
    """Median ms of one replay of `step` captured in a CUDA graph: the device time alone, no host overhead.
    `step` must not synchronize with the host once warmed up."""
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
        return events_ms(graph.replay, warmup, repeat)
    finally:
        del graph


def do_bench_ms(step: Callable[[], object]) -> float:
    """Median ms of `step` by `triton.testing.do_bench` (10 ms warm-up, 100 ms of repetitions)."""
    import triton.testing

    step()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(step, warmup=10, rep=100, return_mode="median"))


def do_bench_graph_ms(step: Callable[[], object]) -> float:
    """Median ms of `step` replayed from a CUDA graph (`triton.testing.do_bench_cudagraph`); `do_bench_ms`
    for a callable that cannot be captured."""
    import triton.testing

    step()  # compile outside the graph
    torch.cuda.synchronize()
    try:
        return float(triton.testing.do_bench_cudagraph(step, rep=100, return_mode="median"))
    except Exception:  # noqa: BLE001 - some callables cannot be captured; time them with events instead
        return do_bench_ms(step)


def best_host_us(
    step: Callable[[], object], steps: int, loops: int, excluded: Callable[[], float] | None = None
) -> float:
    """Microseconds per call of `step` on the host, the best of `loops` loops of `steps` calls (after one
    warm-up call). `excluded`: a running total of seconds spent in work the figure leaves out, read before
    and after each loop."""
    step()
    best = float("inf")
    for _ in range(loops):
        left_out = excluded() if excluded is not None else 0.0
        start = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - start - ((excluded() - left_out) if excluded is not None else 0.0)
        best = min(best, elapsed / steps * 1e6)
    return best
