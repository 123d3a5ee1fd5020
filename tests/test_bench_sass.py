"""`mxlab bench attention-sass` compiles the MX attention's launches for sm_90 on a machine without a GPU.

Run in a fresh process: the kernel tests decorate the kernels under TRITON_INTERPRET=1, which the
compile-only stand-ins cannot take."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def test_attention_sass_with_stochastic_gradients_runs_without_a_gpu():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "mxlab.cli", "bench", "attention-sass", "--stochastic-gradients"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.strip()}
    # the head-dim casts (cast kernels) and the pre-quantizations are compiled too, not launched
    assert {"_mx_kernel", "_prequantize", "_jagged_attention_fwd", "_jagged_attention_bwd_dkdv",
            "_jagged_attention_bwd_dq"} <= set(rows), result.stdout
    for name in ("_jagged_attention_fwd", "_jagged_attention_bwd_dkdv", "_jagged_attention_bwd_dq"):
        loops = rows[name].split("  ")[-1]
        assert loops != "-" and "(0 " not in loops, rows[name]  # each loop's path has its MMAs
