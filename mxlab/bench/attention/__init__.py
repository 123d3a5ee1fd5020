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
pairs j <= i), x 3.5 for forward + backward ("fwd only" rows: the forward's share alone).
The kernel's MX mode (MXFP8 e4m3 operands, floor
scales, nearest-even) is timed on the same shapes; its useful FLOPs are the same. On the self shape
two more MX rows: "integer convert" (`AttentionLaunch(hw_fp8=False)`: the integer quantization steps where the GPU's FP8
convert would run; the same bits) and "SR grads" (dO and dS rounded stochastically, in the kernel).

On the self shape, "kernel bf16 MX tiles" is the BF16 kernel with the MX tile sizes, "kernel mxfp8 tiles" the
MX kernel with other tile sizes (the note names them). `mxlab.bench.attention.sass.attention_sass_counts`
(`mxlab bench attention-sass`) gives the static sm_90 counts of the same kernels without a GPU.

Modules: `shapes` (shapes, records, lengths, FLOPs, the MX policy, padding), `baselines` (FlexAttention,
padded SDPA), `run` (the run), `precompile` (tile candidates, compiling ahead).
"""

from mxlab.bench.attention.precompile import precompile_kernels
from mxlab.bench.attention.run import run_attention_bench
from mxlab.bench.attention.shapes import AttentionBenchResult, Measurement, Shape, sample_lengths, useful_flops

__all__ = [
    "AttentionBenchResult",
    "Measurement",
    "Shape",
    "precompile_kernels",
    "run_attention_bench",
    "sample_lengths",
    "useful_flops",
]
