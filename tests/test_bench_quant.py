"""`mxlab bench quant --size`: the sizes it takes and refuses, and its refusal without CUDA (no timing asserts)."""

import pytest
import torch
from typer.testing import CliRunner

from mxlab.bench.quant import parse_size, run_quant_bench
from mxlab.cli import app


def test_sizes_are_rows_by_columns_in_whole_blocks():
    assert parse_size("1482752x256") == (1482752, 256)
    with pytest.raises(ValueError, match=r"shape '64x64x64': expected ROWSxCOLS"):
        parse_size("64x64x64")
    with pytest.raises(ValueError, match=r"size '100x64': rows and columns must be multiples of 32"):
        parse_size("100x64")
    with pytest.raises(ValueError, match="at least one size"):
        run_quant_bench(sizes=())


def test_bench_quant_refuses_a_bad_size_and_a_machine_without_cuda(monkeypatch):
    result = CliRunner().invoke(app, ["bench", "quant", "--size", "100x64"])
    assert result.exit_code == 2 and "multiples of 32" in result.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["bench", "quant", "--size", "64x64", "--no-compile"])
    assert result.exit_code == 2 and "needs a CUDA device" in result.output
