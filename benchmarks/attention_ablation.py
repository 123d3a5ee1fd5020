"""Where the MX jagged attention's extra backward time goes. An exploration, not imported by the library.

On `mxlab bench attention`'s self shape (512 jagged histories, mean about 309, max 1024, 4 heads x 64, BF16
inputs) it times forward + backward under torch.profiler and prints each kernel's device time per call for:

- `bf16`: the BF16 kernels;
- `mxfp8`: e4m3 operands and gradients, rceil scales, nearest even (the attention of the mxfp8-rceil recipe);
- `mxfp8 shared operands`: the same, except that the kernels are handed the head-dim-quantized Q, K and dO
  where they read the token-axis-quantized copies (QT, KT, DOT). The values are wrong, the quantization
  work is the same (both copies are still computed), so the difference to `mxfp8` is
  what reading two tensors instead of one costs the dK/dV and dQ kernels.

The library is patched only inside this process (the attention's autograd backward and the two
quantization launches it calls).

    python3 benchmarks/attention_ablation.py --json ablation.json
    TRITON_INTERPRET=1 python3 benchmarks/attention_ablation.py --device cpu --sequences 3 \
        --max-length 40 --warmup 1 --repeat 1   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from mxlab.bench.attention.shapes import HEAD_DIM, HEADS, fwd_bwd, mx_policy, offsets_of, sample_lengths
from mxlab.kernels.attention import autograd as attention_autograd
from mxlab.kernels.attention import jagged_attention
from mxlab.nn.attention import call_seeds


@contextlib.contextmanager
def shared_operands():
    """Inside: in the attention's backward, `_prequantized` hands back the head-dim copy of the same tensor (made
    just before by `_head_dim_quantized`) in place of its token-axis copy, so the kernels read one tensor for
    both roles."""
    function = attention_autograd._JaggedAttentionFunction
    original_backward = function.backward
    original_head_dim, original_tokens = attention_autograd._head_dim_quantized, attention_autograd._prequantized
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(x) -> (x, its head-dim copy), one backward's

    def head_dim(x, cast, launch):
        copy = original_head_dim(x, cast, launch)
        copies[id(x)] = (x, copy)
        return copy

    def tokens(x, *args, **kwargs):
        along_tokens, row_term = original_tokens(x, *args, **kwargs)
        source, copy = copies.get(id(x), (None, None))
        return (copy if source is x else along_tokens), row_term

    def backward(ctx, grad_out):
        copies.clear()
        attention_autograd._head_dim_quantized, attention_autograd._prequantized = head_dim, tokens
        try:
            return original_backward(ctx, grad_out)
        finally:
            attention_autograd._head_dim_quantized, attention_autograd._prequantized = (
                original_head_dim,
                original_tokens,
            )
            copies.clear()

    function.backward = staticmethod(backward)
    try:
        yield
    finally:
        function.backward = original_backward


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
    q, k, v = (
        torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=generator)
    mx = mx_policy(scale_mode="rceil")

    def attend(policy):
        return jagged_attention(q, k, v, offsets, offsets, policy=policy, seeds=call_seeds(policy))

    print(
        f"jagged self-attention fwd + bwd: {args.sequences} sequences, "
        f"{total} tokens, {HEADS} x {HEAD_DIM}, on {device}"
    )
    tables = {}
    for name, policy, context in (
        ("bf16", None, contextlib.nullcontext()),
        ("mxfp8", mx, contextlib.nullcontext()),
        ("mxfp8 shared operands", mx, shared_operands()),
    ):
        with context:
            tables[name] = kernel_ms(fwd_bwd(lambda: attend(policy), [q, k, v], grad), device, args.warmup, args.repeat)
        print(f"== {name}")
        for kernel, ms in list(tables[name].items())[: args.top]:
            print(f"   {ms:9.3f} ms  {kernel}")

    # Engaged? Along the head dim and along the tokens e4m3 keeps the same 4 significant bits of every element
    # that is normal in its block, so the check scales each token by its own power of two (2^-24..2^0): along
    # the tokens most elements then fall below their block's normal range, along the head dim none do.
    token_scale = torch.exp2(-torch.randint(0, 25, (total, 1, 1), device=device, generator=generator)).to(
        torch.bfloat16
    )
    with torch.no_grad():
        q.mul_(token_scale), k.mul_(token_scale)
    with shared_operands():
        shared = torch.autograd.grad(attend(mx), [q, k], grad * token_scale)
    engaged = any(
        not torch.equal(a, b) for a, b in zip(torch.autograd.grad(attend(mx), [q, k], grad * token_scale), shared)
    )
    print(f"the shared-operands patch changes dQ or dK (so the kernels read the substituted copies): {engaged}")
    tables["patch engaged"] = engaged
    if args.json:
        with open(args.json, "w") as f:
            json.dump(tables, f, indent=1)


if __name__ == "__main__":
    main()
