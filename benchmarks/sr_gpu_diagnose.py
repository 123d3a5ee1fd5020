"""Where the MX attention with stochastic rounding differs from the reference at the benchmark's size (GPU).

    python3 benchmarks/sr_gpu_diagnose.py [--n 512]

For each failing policy of test_benchmark_size_stochastic_rounding_matches_reference_on_gpu: per output, the
share of elements beyond one ulp, the relative norm of the difference, and where those elements lie (by
sequence length, token tile, head)."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "kernels", "attention"))
os.environ["MXLAB_BACKEND"] = "reference"
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
import test_jagged_attention as t  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    args = parser.parse_args()
    lengths, q, k, v, grad = t._benchmark_inputs(args.n)
    offsets = t._offsets(lengths)
    seq_of_token = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(q.device)
    pos_of_token = torch.cat([torch.arange(n) for n in lengths]).to(q.device)
    length_of_token = torch.tensor(lengths, device=q.device)[seq_of_token]
    print(f"n={args.n} tokens={q.shape[0]} max length={max(lengths)}")
    for policy_id, arguments in t.SR_GPU_POLICIES + [("rceil-nearest", dict(scale_mode="rceil"))]:
        for activation, causal in [("softmax", False), ("softmax", True), ("silu", False)]:
            call = (q, k, v, grad, offsets, offsets, causal, activation)
            kernel = t._run_kernel(*call, t._policy(**arguments))
            reference = t._run_reference(*call, t._policy(**arguments))
            for name, a, e in zip(("out", "dq", "dk", "dv"), kernel, reference):
                a, e = a.float(), e.float()
                beyond = (a - e).abs() > t._ulp(torch.maximum(a.abs(), e.abs()), torch.bfloat16)
                share = beyond.float().mean().item()
                ratio = ((a - e).norm() / e.norm()).item()
                flag = "FAIL" if share > t.FLIP_SHARE or ratio > 2.0**-3 else "ok"
                line = f"{policy_id:15s} {activation:7s} causal={causal!s:5s} {name:3s} share={share:.4f} norm={ratio:.3e} {flag}"
                if share > 0.02 or ratio > 2.0**-5:
                    token_share = beyond.float().mean((1, 2))
                    by_len = {}
                    for lo, hi in [(0, 32), (32, 64), (64, 128), (128, 256), (256, 512), (512, 100000)]:
                        mask = (length_of_token >= lo) & (length_of_token < hi)
                        if mask.any():
                            by_len[f"{lo}-{hi}"] = round(token_share[mask].mean().item(), 3)
                    by_tile = [
                        round(token_share[pos_of_token // 32 == i].mean().item(), 3)
                        for i in range(min(8, int(pos_of_token.max()) // 32 + 1))
                    ]
                    by_head = [round(x, 3) for x in beyond.float().mean((0, 2)).tolist()]
                    line += f"\n    by length {by_len}\n    by token tile {by_tile}\n    by head {by_head}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
