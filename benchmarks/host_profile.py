"""Where the host time of an emulated MX layer's forward + backward goes on a GPU machine: cProfile over
`--calls` calls of one QLinear (and of the jagged attention at the bench's self shape, BF16 and MXFP8), printed by
internal time and by cumulative time, with the total split into mxlab's own Python, Triton's launch
path and the rest. `benchmarks/linear_trace.py` found the MXFP8 linear layer at 65536x512x512 spending
2.3 ms of host time per call against 0.37 ms of device time. Not imported by the library.

    python3 benchmarks/host_profile.py --calls 200
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
from torch import nn

from mxlab.recipe import apply_recipe, load_recipe


def linear_step(m: int, k: int, n: int, recipe: str):
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(k, n, bias=False)).cuda().to(torch.bfloat16)
    apply_recipe(layer, load_recipe(recipe), seed=0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    return lambda: layer(x).backward(grad)


def attention_step(policy):
    """fwd+bwd of the Triton jagged self-attention at the bench's self shape (512 sequences, 4 heads x 64),
    through `jagged_attention_checked` as the model calls it; policy None is BF16 mode."""
    from mxlab.bench.attention.shapes import fwd_bwd, offsets_of, sample_lengths
    from mxlab.kernels.attention import jagged_attention_checked

    lengths = sample_lengths()
    offsets = offsets_of(lengths).cuda()
    total = int(lengths.sum())
    q, k, v = (torch.randn(total, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(total, 4, 64, device="cuda", dtype=torch.bfloat16)
    seeds = None
    if policy is not None:
        seeds = (policy.qk.next_call_seeds(), policy.pv.next_call_seeds())
    return fwd_bwd(
        lambda: jagged_attention_checked(
            q, k, v, offsets, offsets, causal=False, activation="softmax", policy=policy, seeds=seeds
        ),
        [q, k, v],
        grad,
    )


def profile(name: str, step, calls: int, rows: int) -> None:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    parts = {"mxlab": 0.0, "kernels": 0.0, "triton": 0.0, "torch": 0.0, "other": 0.0}
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        key = (
            "kernels"
            if "/kernels/" in filename
            else "mxlab"
            if "/mxlab/" in filename
            else "triton"
            if "triton" in filename
            else "torch"
            if "torch" in filename
            else "other"
        )
        parts[key] += tottime
    split = ", ".join(f"{key} {value / calls * 1e6:.0f} us" for key, value in parts.items())
    print(f"== {name}: {total / calls * 1e6:.0f} us of profiled host time per call ({split})")
    for order in ("tottime", "cumulative"):
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats(order).print_stats(rows)
        print("\n".join(line[:220] for line in buffer.getvalue().splitlines() if line.strip())[:20000])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--recipe", default="mxfp8-rceil")
    args = parser.parse_args()
    from mxlab.bench.attention.shapes import mx_policy

    profile(
        f"QLinear {args.recipe} 65536x512x512 fwd+bwd", linear_step(65536, 512, 512, args.recipe), args.calls, args.rows
    )
    profile("jagged attention BF16 self shape fwd+bwd", attention_step(None), args.calls // 4, args.rows)
    profile("jagged attention MXFP8 self shape fwd+bwd", attention_step(mx_policy()), args.calls // 4, args.rows)


if __name__ == "__main__":
    main()
