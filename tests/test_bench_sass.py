"""`mxlab bench attention-sass` compiles the MX attention's launches for sm_90 on a machine without a GPU.

Run in a fresh process: the kernel tests decorate the kernels under TRITON_INTERPRET=1, which the
compile-only stand-ins cannot take."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def _attention_sass_rows(*arguments: str) -> tuple[dict[str, str], str]:
    """`mxlab bench attention-sass ARGUMENTS` in a fresh process: its rows by kernel name (the last of each),
    and stdout."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "mxlab.cli", "bench", "attention-sass", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.strip()}, result.stdout


def test_attention_sass_with_stochastic_gradients_runs_without_a_gpu():
    rows, stdout = _attention_sass_rows("--stochastic-gradients")
    # the head-dim casts (cast kernels) and the pre-quantizations are compiled too, not launched
    assert {
        "_mx_kernel",
        "_prequantize",
        "_jagged_attention_fwd",
        "_jagged_attention_bwd_dkdv",
        "_jagged_attention_bwd_dq",
    } <= set(rows), stdout
    for name in ("_jagged_attention_fwd", "_jagged_attention_bwd_dkdv", "_jagged_attention_bwd_dq"):
        loops = rows[name].split("  ")[-1]
        assert loops != "-" and "(0 " not in loops, rows[name]  # each loop's path has its MMAs


@pytest.mark.parametrize("arguments", [("--scale-mode", "rceil"), ("--scale-mode", "rceil", "--stochastic-gradients")])
def test_mx_dkdv_kernel_stays_under_its_register_cap(arguments):
    """The MX dK/dV kernel stays under its register cap (three 4-warp blocks per SM) and spills nothing, for the
    recipes whose uncapped build crossed it (rceil 171, rceil-sr 194, MXFP4 196 registers); dQ (uncapped) has no
    spill traffic in its loop."""
    from mxlab.kernels.attention import DEFAULT_MX_TILES

    rows, stdout = _attention_sass_rows(*arguments)
    _, registers, spill = rows["_jagged_attention_bwd_dkdv"].split()[:3]
    assert int(registers) <= DEFAULT_MX_TILES.dkdv_max_registers and int(spill) == 0, stdout
    assert 65536 // (int(registers) + -int(registers) % 8) // (32 * DEFAULT_MX_TILES.num_warps) >= 3
    row = rows["_jagged_attention_bwd_dq"]
    assert row.rstrip(")").split()[-1] == "0", stdout  # no spill traffic inside its loop
