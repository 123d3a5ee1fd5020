"""The bytes the casts of one emulated MX training step must move, and the step ratio they allow.

An exactly emulated MX GEMM on a GPU without MX tensor cores (sm_90) multiplies fake-quantized BF16
copies on cuBLAS: per linear layer of M rows, K inputs and N outputs the step writes the input
quantized along K (forward) and along M (weight gradient) and the output gradient along N (input
gradient) and along M (weight gradient), and reads what they are quantized from. This script counts
those bytes for the model a spec trains (rows of every nn.Linear from a forward hook on a small slice
of the spec's first batch, scaled to the timed batches' history tokens and examples) under three
designs, and turns each into milliseconds at a given memory bandwidth:

- library: today's casts (input read twice, output gradient once for both of its copies, every copy written);
- producer-fused: every copy written by the kernel that produces its source (no reads but the saved
  input's second one, for the weight-gradient copy);
- writes only: no reads at all, the copies' writes alone.

Each design's step ratio is (bf16_ms + cast_ms + other_ms) / bf16_ms, where other_ms is the MX step's
cost beyond its casts (the attention's MX work, less any BF16 work the MX step does inside its casts)
measured by step_anatomy.py. Weight casts are left out (a weight is a few MB). An analytic bound, not
a measurement: it shows which targets a design can reach at all, and at what share of copy speed.

    python3 benchmarks/cast_traffic.py [--spec experiments/gem-synthetic.toml] [--bandwidth-gbs 4241]
        [--bf16-ms 197.0] [--other-ms 11.4] [--measured-cast-ms 47.6] [--linear MxKxN=BF16_MS ...]

`--linear` does the same for one linear layer's forward + backward (`mxlab bench linear`'s shapes), against
the BF16 time given for it; there the casts' time adds to the BF16 GEMMs' directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from mxlab.bench.step import DEFAULT_SPEC, bench_spec, device_batches
from mxlab.models import build_model

BFLOAT16_BYTES = 2
PROBE_EXAMPLES = 32
# H200, 6fb8af0: git show d1a37a9:reports/benchmarks/bench_linear.txt
DEFAULT_LINEAR = ("65536x512x512=0.246", "65536x1024x1024=0.623", "65536x4096x4096=9.531")


def linear_rows(spec, info, batch) -> list[tuple[str, int, int, int]]:
    """(name, rows, in_features, out_features) of every nn.Linear in one forward of `batch` (CPU, no grad)."""
    torch.manual_seed(0)
    model = build_model(spec.model, info).eval()
    seen: list[tuple[str, int, int, int]] = []
    hooks = [
        module.register_forward_hook(
            lambda module, inputs, output, name=name: seen.append(
                (name, inputs[0].numel() // module.in_features, module.in_features, module.out_features)
            )
        )
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    with torch.no_grad():
        model(batch)
    for hook in hooks:
        hook.remove()
    return seen


def design_elements(rows: float, fan_in: int, fan_out: int) -> dict[str, float]:
    """bfloat16 elements the casts of one linear layer's step move, per design (see the module docstring)."""
    a, g = rows * fan_in, rows * fan_out
    writes = 2 * a + 2 * g
    return {"library": writes + 2 * a + g, "producer-fused": writes + a, "writes only": writes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--preset", default="h200")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--max-history", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=2, help="batches averaged, as bench step times them")
    parser.add_argument(
        "--bandwidth-gbs",
        type=float,
        default=4241.0,
        help="device-to-device copy bandwidth (H200: reports/benchmarks/bench_quant.h200.txt)",
    )
    parser.add_argument(
        "--bf16-ms", type=float, default=197.0, help="the BF16 step (reports/benchmarks/bench_step.h200.txt)"
    )
    parser.add_argument(
        "--other-ms",
        type=float,
        default=11.4,
        help="the MX step's cost beyond its casts (rceil 256.0 - BF16 197.0 - casts 47.6 ms)",
    )
    parser.add_argument(
        "--measured-cast-ms",
        type=float,
        default=47.6,
        help="the cast kernels' time per step (reports/benchmarks/anatomy_mx_arms.h200.txt, rceil)",
    )
    parser.add_argument(
        "--linear",
        action="append",
        default=None,
        metavar="MxKxN=BF16_MS",
        help="a linear layer and its BF16 fwd+bwd ms (default: the H200's bench linear at 6fb8af0, three shapes)",
    )
    args = parser.parse_args()

    spec = bench_spec(
        args.spec, preset=args.preset, batch_size=args.batch, max_history=args.max_history, batches=args.batches
    )
    batches, info = device_batches(spec, args.batches, torch.device("cpu"))
    tokens = sum(float(batch.history_lengths().sum()) for batch in batches) / len(batches)
    examples = float(args.batch)
    probe = batches[0].slice(0, PROBE_EXAMPLES)
    probe_tokens = int(probe.history_lengths().sum())
    print(
        f"{args.spec} at preset {args.preset}, batch {args.batch}, histories up to {args.max_history}: "
        f"{tokens:,.0f} history tokens per batch (mean of {args.batches}); probe: {PROBE_EXAMPLES} examples, "
        f"{probe_tokens} tokens"
    )

    totals = {"library": 0.0, "producer-fused": 0.0, "writes only": 0.0}
    print(f"{'linear':40s} {'rows':>12s} {'K':>5s} {'N':>5s} " + " ".join(f"{d + ' GB':>18s}" for d in totals))
    for name, rows, fan_in, fan_out in linear_rows(spec, info, probe):
        if rows == probe_tokens:
            scaled = tokens
        elif rows % PROBE_EXAMPLES == 0:
            scaled = rows // PROBE_EXAMPLES * examples
        else:
            raise SystemExit(f"{name}: {rows} rows are neither the probe's tokens nor a multiple of its examples")
        gigabytes = {d: e * BFLOAT16_BYTES / 1e9 for d, e in design_elements(scaled, fan_in, fan_out).items()}
        for design, value in gigabytes.items():
            totals[design] += value
        print(
            f"{name:40s} {scaled:12,.0f} {fan_in:5d} {fan_out:5d} " + " ".join(f"{v:18.2f}" for v in gigabytes.values())
        )

    allowed = 0.15 * args.bf16_ms - args.other_ms
    print(
        f"\nat {args.bandwidth_gbs:.0f} GB/s; step ratio = (BF16 {args.bf16_ms} + casts + other {args.other_ms} ms) "
        f"/ BF16; 1.15x allows {allowed:.1f} ms of casts"
    )
    for design, gigabytes in totals.items():
        ms = gigabytes / args.bandwidth_gbs * 1e3
        needed = f"needs >= {ms / allowed:.2f} of copy speed for 1.15x" if allowed > 0 else "1.15x out of reach"
        print(
            f"  {design:16s} {gigabytes:7.1f} GB  {ms:6.1f} ms  step "
            f"{(args.bf16_ms + ms + args.other_ms) / args.bf16_ms:.3f}x  {needed}"
        )
    library_ms = totals["library"] / args.bandwidth_gbs * 1e3
    print(
        f"  measured casts   {args.measured_cast_ms:.1f} ms (all GEMMs, weights included): "
        f"{library_ms / args.measured_cast_ms:.2f} of the library design's copy-speed time"
    )

    print("\none linear layer, forward + backward: ratio = (BF16 ms + casts at copy speed) / BF16 ms")
    for item in args.linear or DEFAULT_LINEAR:
        shape, _, bf16_ms = item.partition("=")
        try:
            rows, fan_in, fan_out = (int(v) for v in shape.split("x"))
            bf16_ms = float(bf16_ms)
        except ValueError:
            raise SystemExit(f"--linear {item!r}: expected MxKxN=BF16_MS, e.g. 65536x512x512=0.246") from None
        for design, elements in design_elements(rows, fan_in, fan_out).items():
            ms = elements * BFLOAT16_BYTES / (args.bandwidth_gbs * 1e9) * 1e3
            print(f"  {shape:18s} BF16 {bf16_ms:6.3f} ms  {design:16s} {ms:6.3f} ms  {1 + ms / bf16_ms:.2f}x")


if __name__ == "__main__":
    main()
