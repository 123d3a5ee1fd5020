"""`mxlab bench linear`'s torchao arm: chosen only where torchao imports; torchao's emulated MXFP8 RCEIL layer
computes mxlab's mxfp8-rceil bits (CPU, where torchao is installed); the arm timed on CUDA (gpu)."""

from __future__ import annotations

import importlib

import pytest
import torch

from mxlab.bench import torchao_arm
from mxlab.bench.linear import LinearMeasurement, _arm_steps
from mxlab.bench.torchao_arm import TORCHAO_ARM, BitCheck, load_torchao, summary_lines, torchao_summary


def _mxfp8_rceil_layer(weight: torch.Tensor) -> torch.nn.Module:
    from mxlab.nn.linear import QLinear
    from mxlab.recipe import load_recipe

    recipe = load_recipe("mxfp8-rceil")
    layer = QLinear(
        weight.shape[1],
        weight.shape[0],
        bias=False,
        precision=recipe.policies[recipe.default].to_precision("layer"),
        dtype=weight.dtype,
    )
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def _case(m: int = 64, k: int = 128, n: int = 96) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=generator).bfloat16()
    x[0, :32] *= 2.0**-20  # a block far below the rest, a block with one large outlier
    x[1, -1] = 3e4
    weight = (torch.randn(n, k, generator=generator) / k**0.5).bfloat16()
    return x, weight, torch.randn(m, n, generator=generator).bfloat16()


def test_without_torchao_the_arm_is_omitted_with_one_line_saying_so(monkeypatch):
    real = importlib.import_module

    def import_module(name, package=None):
        if name == "torchao" or name.startswith("torchao."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(torchao_arm.importlib, "import_module", import_module)
    handle, line = load_torchao()
    assert handle is None
    assert "\n" not in line and line.startswith("torchao arm omitted") and "mxlab[torchao]" in line
    x, weight, grad = _case(32, 32, 32)
    steps, check = _arm_steps(32, 32, weight, x.requires_grad_(True), grad, torchao=handle)
    assert TORCHAO_ARM not in steps and check is None
    assert "mxlab mxfp8 (emulated)" in steps and steps["torch bf16"][0] is not None


def test_an_api_other_than_the_expected_one_is_omitted_too(monkeypatch):
    real = importlib.import_module

    def import_module(name, package=None):
        if name == "torchao.prototype.moe_training.mxfp8_linear":
            raise AttributeError("module has no attribute 'MXFP8Linear'")
        return real(name, package) if name != "torchao" else type("torchao", (), {"__version__": "0.99"})

    monkeypatch.setattr(torchao_arm.importlib, "import_module", import_module)
    handle, line = load_torchao()
    assert handle is None and "AttributeError" in line


def test_a_torchao_that_refuses_this_torch_is_omitted_before_the_bench(monkeypatch):
    """torchao 0.18's MXFP8 training asserts a torch newer than some (2.11 on the GPU machine): a layer that cannot
    be built omits the arm with the assertion's message, instead of failing the bench mid-run."""

    class Refusing:
        KernelPreference = type("KernelPreference", (), {"EMULATED": "emulated"})
        ScaleCalculationMode = type("ScaleCalculationMode", (), {"RCEIL": "rceil"})

        def MXFP8Linear(*args, **kwargs):  # noqa: N802  (torchao's class name)
            raise AssertionError("Please install the latest torch nightly build to use MXFP8 training")

    def import_module(name, package=None):
        return Refusing if name.endswith("mxfp8_linear") else type("torchao", (), {"__version__": "0.18.0"})

    monkeypatch.setattr(torchao_arm.importlib, "import_module", import_module)
    handle, line = load_torchao()
    assert handle is None and "AssertionError: Please install the latest torch nightly" in line


def _row(arm: str, ms: float | None, m: int = 16, base: float = 1.0) -> LinearMeasurement:
    return LinearMeasurement(m, 32, 32, arm, ms, None if ms is None else ms / base)


def test_summary_says_per_shape_whether_mxlab_is_ahead_and_carries_the_bit_check():
    results = [
        _row("torch bf16", 1.0),
        _row("mxlab mxfp8 (emulated)", 3.0),
        _row("mxlab mxfp8 (emulated) compiled", 2.0),
        _row(TORCHAO_ARM, 2.5),
        _row("torch bf16", 1.0, m=32),
        _row("mxlab mxfp8 (emulated)", 3.0, m=32),
        _row(TORCHAO_ARM, None, m=32),
        _row("torch bf16", 1.0, m=48),  # no torchao row: no summary
    ]
    rows = torchao_summary(results, {(16, 32, 32): BitCheck(True, 0.0), (32, 32, 32): BitCheck(False, 0.5)})
    assert [(r["m"], r["mxlab_ahead"], r["same_bits"]) for r in rows] == [(16, True, True), (32, None, False)]
    assert rows[0]["mxlab_arm"] == "mxlab mxfp8 (emulated) compiled" and rows[0]["torchao_ratio_to_bf16"] == 2.5
    lines = summary_lines(rows)
    assert "mxlab ahead" in lines[0] and "same bits: yes" in lines[0]
    assert "not compared" in lines[1] and "same bits: no (max |diff| 0.5)" in lines[1]


def test_torchao_emulated_mxfp8_rceil_computes_mxlabs_bits_on_the_cpu():
    pytest.importorskip("torchao")
    handle, line = load_torchao()
    assert handle is not None, line
    x, weight, grad = _case()
    theirs = torchao_arm.torchao_linear(weight, handle)
    ours = _mxfp8_rceil_layer(weight)
    assert bit_check_is_exact(theirs, ours, x)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = theirs(xa), ours(xb)
    assert torch.equal(ya.view(torch.int16), yb.view(torch.int16))
    ya.backward(grad)
    yb.backward(grad)
    assert torch.equal(xa.grad.view(torch.int16), xb.grad.view(torch.int16))  # dgrad
    assert torch.equal(theirs.weight.grad.view(torch.int16), ours.weight.grad.view(torch.int16))  # wgrad


def bit_check_is_exact(theirs: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor) -> bool:
    check = torchao_arm.bit_check(theirs, ours, x)
    return check.same_bits and check.max_abs_diff == 0.0 and check.note() == "same bits: yes"


def test_torchao_quantizer_is_mxlabs_rceil_quantizer():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    from mxlab.numerics.quant import fake_quantize

    x, _, _ = _case(64, 256)
    theirs = MXTensor.to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL, KernelPreference.EMULATED)
    ours = fake_quantize(x, "e4m3", scale_mode="rceil")
    assert torch.equal(theirs.dequantize(torch.bfloat16).view(torch.int16), ours.view(torch.int16))


@pytest.mark.gpu
def test_gpu_bench_linear_times_the_torchao_arm_and_compares_it(tmp_path):
    pytest.importorskip("torchao")
    import json

    from mxlab.bench.linear import BASELINE, run_linear_bench

    lines: list[str] = []
    results = {
        r.arm: r
        for r in run_linear_bench([(16384, 1024, 1024)], repeat=3, echo=lines.append, json_path=tmp_path / "b.json")
    }
    assert results[BASELINE].ratio_to_bf16 == 1.0
    assert results[TORCHAO_ARM].ms is not None and results[TORCHAO_ARM].ratio_to_bf16 is not None
    assert "same bits:" in results[TORCHAO_ARM].note
    (shape,) = json.loads((tmp_path / "b.json").read_text())["torchao"]["shapes"]
    assert shape["mxlab_ahead"] in (True, False) and shape["same_bits"] in (True, False)
    assert shape["max_abs_diff"] < 0.05  # the same MX operands; at most the GEMM's accumulation order differs
    assert any(line.startswith("torchao vs mxlab MXFP8 at 16384 x 1024 x 1024") for line in lines)


@pytest.mark.slow
def test_the_compiled_torchao_arm_is_built_and_bit_checked_on_the_cpu():
    pytest.importorskip("torchao")
    handle, line = load_torchao()
    assert handle is not None, line
    x, weight, grad = _case(64, 64, 32)
    steps, check = _arm_steps(64, 32, weight, x.requires_grad_(True), grad, torchao=handle)
    step, note = steps[TORCHAO_ARM]
    assert check == BitCheck(True, 0.0) and note.endswith("same bits: yes") and "torch.compile" in note
    step()  # forward + backward of the compiled layer
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
