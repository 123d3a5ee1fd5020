"""Where the stochastic-rounding arms' attention backward spends its instructions, by static sm_90 counts
(`mxlab bench attention-sass`, no GPU needed). An exploration, not imported by the library.

Each variant compiles the MX attention's forward + backward launches (e4m3, floor) in a fresh process and
prints the dK/dV and dQ kernels' registers and instructions per loop iteration:

- `nearest`: gradients rounded to nearest even (the hardware FP8 conversion), the mxfp8 arms;
- `stochastic`: gradients rounded stochastically, as the -sr recipes do (the library as it is: since
  session 19 `_mx_device._stochastic_scaled`, with no tile-wide range test);
- `stochastic, no hash`: the same with the score counters' mix32 replaced by a plain xor (not random: what
  the hash costs).

At 1877b8d (the tile-wide test of the fast path's range, the integer steps behind it) `stochastic` counted
2605/1809 (dK/dV, 238 registers) and 2045/1251 (dQ, 211 registers); compiling the test out gave 1701 and
1170. On the H200 the instructions per iteration tracked these kernels' times then (session 13 anatomy: dQ
62 ms stochastic against 21 nearest, dK/dV 93 against 54).

    python3 benchmarks/sr_sass_variants.py
"""

from __future__ import annotations

import subprocess
import sys

import triton
import triton.language as tl

VARIANTS = {
    "nearest": ("nearest_even", False),
    "stochastic": ("stochastic", False),
    "stochastic, no hash": ("stochastic", True),
}


def _compile_and_print(rounding: str, no_hash: bool) -> None:
    """In this process: patch the counter hash out if asked, compile, print the backward kernels' rows."""
    if no_hash:
        import mxlab.kernels.attention.device as attention_device

        @triton.jit
        def score_random_bits(query_rows, head, heads, keys, seed_key, KEYS_FIRST: tl.constexpr):
            row_key = (query_rows.to(tl.int64) * heads + head).to(tl.uint32) ^ seed_key.to(tl.uint32)
            if KEYS_FIRST:
                hashed = row_key[None, :] ^ keys.to(tl.uint32)[:, None]
            else:
                hashed = row_key[:, None] ^ keys.to(tl.uint32)[None, :]
            return (hashed >> 8).to(tl.int32)

        attention_device.score_random_bits = score_random_bits
    from mxlab.bench.attention.sass import attention_sass_counts, print_attention_sass_counts

    print_attention_sass_counts(
        [count for count in attention_sass_counts(grad_rounding=rounding) if "_bwd_" in count.kernel]
    )


def main() -> None:
    if len(sys.argv) == 3:  # one variant, in a fresh process (the kernels compile once per process)
        _compile_and_print(sys.argv[1], sys.argv[2] == "1")
        return
    for name, (rounding, no_hash) in VARIANTS.items():
        result = subprocess.run([sys.executable, __file__, rounding, str(int(no_hash))], capture_output=True, text=True)
        print(f"== {name}")
        print(result.stdout.rstrip() if result.returncode == 0 else result.stderr.rstrip()[-2000:])


if __name__ == "__main__":
    main()
