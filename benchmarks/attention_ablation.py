"""Where the MX jagged attention's extra backward time goes. An exploration, not imported by the library.

On `mxlab bench attention`'s self shape (512 jagged histories, mean about 309, max 1024, 4 heads x 64, BF16
inputs) it times forward + backward under torch.profiler and prints each kernel's device time per call for:

- `bf16`: the BF16 kernels;
- `mxfp8`: e4m3 operands and gradients, rceil scales, nearest even (the attention of the mxfp8-rceil recipe);
- `mxfp8 shared operands`: the same, except that the kernels are handed the head-dim-quantized Q, K and dO
  where they read the token-axis-quantized copies (QT, KT, DOT). The values are wrong, the quantization
  work is the same (the pre-quantization still computes both copies), so the difference to `mxfp8` is
  what reading two tensors instead of one costs the dK/dV and dQ kernels.

The library is patched only inside this process (`_prequantized` of the attention's autograd module).

    python3 benchmarks/attention_ablation.py --json ablation.json
    TRITON_INTERPRET=1 python3 benchmarks/attention_ablation.py --device cpu --sequences 3 --max-length 40 --warmup 1 --repeat 1   # smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import json

import torch

from mxlab.bench.attention.shapes import HEAD_DIM, HEADS, fwd_bwd, mx_policy, offsets_of, sample_lengths
from mxlab.kernels.attention import jagged_attention
from mxlab.kernels.attention import autograd as attention_autograd
from mxlab.nn.attention import call_seeds


@contextlib.contextmanager
def shared_operands():
    """Inside: `_prequantized` returns its head-dim copy in place of its token-axis copy (where both exist
    with one shape), so the kernels read one tensor for both roles."""
    original = attention_autograd._prequantized

    def patched(*args, **kwargs):
        along_d, along_tokens, row_term = original(*args, **kwargs)
        if along_d is not None and along_tokens is not None and along_d.shape == along_tokens.shape:
            along_tokens = along_d
        return along_d, along_tokens, row_term

    attention_autograd._prequantized = patched
    try:
        yield
    finally:
        attention_autograd._prequantized = original


def kernel_ms(step, device: torch.device, warmup: int, repeat: int) -> dict[str, float]:
    """Device (or CPU) ms per step of each kernel or op that `step` runs, over `repeat` profiled steps."""
    for _ in range(warmup):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(repeat):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    attribute = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = {event.key[:70]: getattr(event, attribute) / 1e3 / repeat for event in profiler.key_averages()}
    return {name: ms for name, ms in sorted(rows.items(), key=lambda item: -item[1]) if ms > 0.001}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--max-length", type=int, default=1024, help="clip the sampled lengths here (smoke tests)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--top", type=int, default=8, help="kernels printed per variant")
    parser.add_argument("--json", help="also write every variant's table here")
    args = parser.parse_args()
    device = torch.device(args.device)
    lengths = sample_lengths(args.sequences).clamp(max=args.max_length).to(device)
    offsets = offsets_of(lengths)
    generator = torch.Generator(device=device).manual_seed(0)
    total = int(offsets[-1])
    q, k, v = (torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
               for _ in range(3))
    grad = torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=generator)
    mx = mx_policy(scale_mode="rceil")

    def attend(policy):
        return jagged_attention(q, k, v, offsets, offsets, policy=policy, seeds=call_seeds(policy))

    print(f"jagged self-attention fwd + bwd: {args.sequences} sequences, {total} tokens, {HEADS} x {HEAD_DIM}, on {device}")
    tables = {}
    for name, policy, context in (("bf16", None, contextlib.nullcontext()), ("mxfp8", mx, contextlib.nullcontext()),
                                  ("mxfp8 shared operands", mx, shared_operands())):
        with context:
            tables[name] = kernel_ms(fwd_bwd(lambda: attend(policy), [q, k, v], grad), device, args.warmup, args.repeat)
        print(f"== {name}")
        for kernel, ms in list(tables[name].items())[:args.top]:
            print(f"   {ms:9.3f} ms  {kernel}")

    with shared_operands():
        shared = torch.autograd.grad(attend(mx), [q, k], grad)
    engaged = any(not torch.equal(a, b) for a, b in zip(torch.autograd.grad(attend(mx), [q, k], grad), shared))
    print(f"the shared-operands patch changes dQ or dK (so the kernels read the substituted copies): {engaged}")
    tables["patch engaged"] = engaged
    if args.json:
        with open(args.json, "w") as f:
            json.dump(tables, f, indent=1)


if __name__ == "__main__":
    main()
