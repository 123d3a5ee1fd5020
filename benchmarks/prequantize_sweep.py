"""How fast the attention's `_prequantize` runs at the h200 step's history shape, against a copy, per launch shape.

An exploration for the training-step issue (not imported by the library). `benchmarks/step_anatomy.py` at the
h200 preset (batch 4096, histories up to 1024) puts 44 ms of the MX step in `_prequantize` (35 launches),
about 1.1 TB/s. This builds jagged (tokens, 4, 64) bfloat16 tensors with the bench's history lengths (uniform
1..1024, the synthetic data's mean is about 362), and times each launch the attention makes (forward: Q, K
along the head dim, V along the tokens; backward: Q, K along both, V along the head dim, dO along both with
the row dots) under num_warps 2-16, against `copy_` of the same bytes, with `triton.testing.do_bench`.

    python3 benchmarks/prequantize_sweep.py --json $OUT/prequantize_sweep.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from mxlab.kernels._mx_device import operand_code
from mxlab.kernels.attention.device import _prequantize
from mxlab.kernels.attention.tiles import _tiles
from mxlab.kernels.cast import hardware_fp8_applies
from mxlab.numerics.formats import get_format


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--mean-length", type=int, default=362)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2 * args.mean_length, (args.sequences,), generator=generator).clamp(max=args.max_length)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
    tokens = int(lengths.sum())
    x = torch.randn(tokens, 4, 64, device=device).bfloat16()
    other = torch.randn_like(x)
    code = operand_code("e4m3", "rceil", "nearest_even", hw_fp8=hardware_fp8_applies(device, get_format("e4m3"), "nearest_even"))
    seq, start = _tiles(offsets, tokens, None, 32)
    width = 256
    out_d, out_t = torch.empty_like(x), torch.empty_like(x)
    row_dots = torch.empty(4, tokens, device=device)
    element_bytes = x.numel() * 2
    copy_ms = triton.testing.do_bench(lambda: out_d.copy_(x))
    print(f"{tokens} tokens x 256, {element_bytes / 2**30:.2f} GiB per tensor; copy {copy_ms:.3f} ms "
          f"({2 * element_bytes / copy_ms / 1e6:.0f} GB/s)")
    launches = {  # name: (ALONG_D, ALONG_T, ROW_DOT, tensors read, tensors written)
        "along head dim (Q, K fwd; V bwd)": (True, False, False, 1, 1),
        "along tokens (V fwd)": (False, True, False, 1, 1),
        "both (Q, K bwd)": (True, True, False, 1, 2),
        "both + row dots (dO bwd)": (True, True, True, 2, 2),
    }
    rows = []
    for name, (along_d, along_t, row_dot, reads, writes) in launches.items():
        for warps in (2, 4, 8, 16):
            def launch() -> None:
                _prequantize[(seq.numel(), 1)](
                    x, out_d, out_t, other, row_dots, offsets, seq, start, width, width, tokens, 0, 0,
                    COLS=256, D_CODE=code, T_CODE=code, ALONG_D=along_d, ALONG_T=along_t, ROW_DOT=row_dot, HEAD_DIM=64,
                    num_warps=warps)
            ms = triton.testing.do_bench(launch)
            moved = (reads + writes) * element_bytes
            rows.append({"launch": name, "num_warps": warps, "ms": ms, "gb_per_s": moved / ms / 1e6,
                         "x_copy_time": ms / (copy_ms * (reads + writes) / 2)})
            print(f"{name:<34} warps {warps:>2}: {ms:7.3f} ms  {moved / ms / 1e6:6.0f} GB/s  "
                  f"{rows[-1]['x_copy_time']:.2f}x a copy of the same bytes")
    if args.json is not None:
        args.json.write_text(json.dumps({"tokens": tokens, "copy_ms": copy_ms, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
