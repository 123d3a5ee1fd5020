"""Where one emulated MX linear layer's forward + backward spends its wall time at recsys widths, where
`mxlab bench linear` found 512 and 1024 columns costing the same (a fixed cost per call binds).

For each shape: the wall time of one synchronized fwd+bwd, the host time of enqueueing it (no sync), the
CUDA-graph replay time (device alone), then torch.profiler over a few calls: the CPU ops by self time and
the GPU kernels by time, and the host syncs of one call (torch.cuda.set_sync_debug_mode). Not imported by
the library.

    python3 benchmarks/linear_trace.py --shape 65536x512x512 --shape 65536x1024x1024 --recipe mxfp8-rceil
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn

from mxlab.bench.timing import events_ms, graph_ms
from mxlab.recipe import apply_recipe, load_recipe


def layer_and_step(m: int, k: int, n: int, recipe: str | None):
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(k, n, bias=False)).cuda().to(torch.bfloat16)
    if recipe:
        apply_recipe(layer, load_recipe(recipe), seed=0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        layer(x).backward(grad)

    return step


def host_us(step, repeat: int = 50) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        step()
    host = (time.perf_counter() - start) / repeat * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--recipe", default="mxfp8-rceil")
    parser.add_argument("--rows", type=int, default=18)
    args = parser.parse_args()
    shapes = args.shape or ["65536x512x512", "65536x1024x1024"]
    for text in shapes:
        m, k, n = (int(v) for v in text.split("x"))
        for recipe in (None, args.recipe):
            step = layer_and_step(m, k, n, recipe)
            for _ in range(5):
                step()
            wall = events_ms(step, warmup=3, repeat=20)
            host = host_us(step)
            try:
                graph = graph_ms(step, warmup=3, repeat=20)
            except Exception as error:  # noqa: BLE001  a step that syncs cannot be captured
                graph = float("nan")
                print(f"  graph capture failed: {type(error).__name__}: {str(error)[:200]}")
            print(
                f"{text} {recipe or 'bf16'}: synced call {wall:.3f} ms, "
                f"host enqueue {host:.0f} us, graph replay {graph:.3f} ms"
            )
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step()
            torch.cuda.set_sync_debug_mode(0)
            print(f"  host syncs in one call: {sum('synchroniz' in str(w.message) for w in caught)}")
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            ) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            table = prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60
            )
            print("  by self CPU time (5 calls):\n" + table)
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60)
            print("  by self CUDA time (5 calls):\n" + table)


if __name__ == "__main__":
    main()
