import json
import math

import numpy as np
import pytest
import torch

from mxlab.nn import qmatmul as qmatmul_module
from mxlab.nn.linear import QLinear
from mxlab.nn.operands import fake_quantize_operand
from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant
from mxlab.recipe.diagnostics import NumericsMonitor, append_jsonl, operand_stats, sqnr_db


def mx_layer(in_features=32, out_features=32, scale_mode="floor", fmt="e4m3"):
    operand = OperandQuant(fmt, scale_mode=scale_mode)
    gemm = GemmQuant(operand, operand)
    precision = MatmulPrecision(gemm, gemm, gemm, labels=("fwd", "dgrad", "wgrad"), name="layer")
    return QLinear(in_features, out_features, bias=False, precision=precision)


@pytest.mark.parametrize("autocast", [False, True])
def test_exactly_representable_operands_give_infinite_sqnr_and_no_saturation(autocast):
    layer = mx_layer()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # small integers times powers of two: exact in E4M3 with any block scale here
        layer.weight.copy_(torch.randint(-8, 9, (32, 32), generator=generator).float() / 4)
    x = (torch.randint(-8, 9, (64, 32), generator=generator).float() * 2).requires_grad_()
    monitor = NumericsMonitor(layer, every=1)
    with monitor.sampling(0):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # the shadow stays FP32 too
            out = layer(x)
        out.backward(torch.randint(-4, 5, (64, 32), generator=generator).float())
    records = {record["gemm"]: record for record in monitor.drain()}
    assert set(records) == {"fwd", "dgrad", "wgrad"}
    for record in records.values():
        assert record["sqnr_db"] == math.inf
        assert record["saturated_frac"] == 0 and record["flushed_frac"] == 0
        assert record["module"] == "layer" and record["step"] == 0
    # 64x32 activations and 32x32 weights in blocks of 32 along K: 64 + 32 blocks in the forward
    assert sum(records["fwd"]["scale_exp_hist"].values()) == 64 + 32


def test_planted_overflow_is_counted_as_saturation_and_lowers_sqnr():
    layer = mx_layer(scale_mode="floor")
    with torch.no_grad():
        layer.weight.copy_(torch.eye(32))
    x = torch.ones(64, 32)
    x[0, 0] = 500.0  # floor scale of its block: 2^(8 - 8) = 1, and 500 > 448: clipped to 448
    x[1, 0] = 1e-9  # a non-zero far below the block's smallest subnormal: flushed
    x[1, 1] = 256.0
    monitor = NumericsMonitor(layer, every=5)
    with monitor.sampling(10) as sampled:
        assert sampled
        out = layer(x)
    (record,) = monitor.drain()
    quantized_elements = 64 * 32 + 32 * 32
    assert record["saturated_frac"] == pytest.approx(1 / quantized_elements)
    assert record["flushed_frac"] == pytest.approx(1 / quantized_elements)
    assert out[0, 0].item() == 448.0
    reference = x @ torch.eye(32)
    expected_sqnr = 10 * np.log10(
        (reference.double() ** 2).sum().item() / ((out.double() - reference.double()) ** 2).sum().item()
    )
    assert record["sqnr_db"] == pytest.approx(expected_sqnr)
    assert record["amax_a"] == 500.0
    # rceil picks a scale with no saturation for the same block
    rceil = mx_layer(scale_mode="rceil")
    with torch.no_grad():
        rceil.weight.copy_(torch.eye(32))
    with monitor.sampling(15):
        rceil(x)
    assert monitor.drain()[0]["saturated_frac"] == 0


def test_subnormals_and_scale_exponents_of_one_operand():
    quant = OperandQuant("e4m3", scale_mode="floor")
    x = torch.zeros(1, 32)
    x[0, 0] = 448.0  # amax in [256, 512): scale exponent 8 - 8 = 0
    x[0, 1] = 2.0**-8  # below E4M3's min normal 2^-6 at scale 1: a subnormal element
    x_q = fake_quantize_operand(x, quant, -1, 0)
    stats = operand_stats(x, x_q, quant, -1)
    assert stats.subnormal == 1 and stats.saturated == 0 and stats.flushed == 0
    assert stats.scale_exponents == {0: 1}
    with pytest.raises(ValueError, match="high precision"):
        operand_stats(x, x, OperandQuant("bf16"), -1)


def test_monitor_is_off_between_samples_and_records_attention_products():
    monitor = NumericsMonitor(None, every=4)
    layer = mx_layer()
    x = torch.randn(8, 32)
    with monitor.sampling(3) as sampled:
        assert not sampled and qmatmul_module._observer is None
        layer(x)
    assert monitor.drain() == []
    operand = OperandQuant("e4m3")
    gemm = GemmQuant(operand, operand)
    qk = MatmulPrecision(gemm, gemm, gemm, labels=("qk", "qk_grad_a", "qk_grad_b"), name="attn")
    q = torch.randn(2, 2, 8, 16)
    with monitor.sampling(4):
        qmatmul_module.qmatmul(q, q.transpose(-1, -2), qk)
        qmatmul_module.qmatmul(q, q.transpose(-1, -2), qk)  # a second bucket folds into the same record
    (record,) = monitor.drain()
    assert (record["module"], record["gemm"], record["calls"]) == ("attn", "qk", 2)
    assert qmatmul_module._observer is None


def test_records_survive_a_json_lines_round_trip(tmp_path):
    path = tmp_path / "numerics.jsonl"
    append_jsonl([{"step": 0, "sqnr_db": math.inf}, {"step": 1, "sqnr_db": 31.5}], path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["sqnr_db"] == math.inf and lines[1]["sqnr_db"] == 31.5
    assert sqnr_db(0.0, 0.0) == math.inf and math.isnan(sqnr_db(math.inf, 1.0))
    with pytest.raises(ValueError, match="every"):
        NumericsMonitor(None, every=0)


def _stats_fields(stats):
    return stats.saturated / stats.elements, stats.flushed / stats.elements, stats.subnormal / stats.elements


@pytest.mark.parametrize("axis, block", [(-1, 32), (-2, 32), (-1, (32, 32))])
def test_a_large_operand_with_identical_row_groups_gives_the_full_figures_from_the_bounded_rows(axis, block):
    quant = OperandQuant("e4m3", block=block, scale_mode="floor")
    height = 1 if axis == -1 and block == 32 else 32  # a sampled unit: one row, or a block of 32 rows
    generator = torch.Generator().manual_seed(3)
    group = torch.randn(height, 96, generator=generator) * 4
    group[0, 0], group[-1, 1], group[0, 2] = 500.0, 1e-9, 2.0**-9  # saturates, flushes, subnormal at its scale
    x = group.repeat(2048 // height, 1)  # 2048 rows: identical groups
    x_q = fake_quantize_operand(x, quant, axis, 0)
    bounded = operand_stats(x, x_q, quant, axis, sample_rows=64)
    full = operand_stats(x, x_q, quant, axis, sample_rows=10**9)
    assert (bounded.rows, bounded.rows_total, bounded.elements) == (64, 2048, 64 * 96)
    assert (full.rows, full.elements) == (2048, 2048 * 96)
    assert _stats_fields(bounded) == pytest.approx(_stats_fields(full)) and bounded.saturated > 0
    assert bounded.amax == full.amax == 500.0
    assert {e: 32 * c for e, c in bounded.scale_exponents.items()} == dict(full.scale_exponents)
    assert bounded.flushed >= 64 // height


def test_rows_along_blocks_are_taken_whole_blocks_and_the_partial_last_block_counts_its_real_rows():
    quant = OperandQuant("e4m3", scale_mode="floor")
    x = torch.ones(1000, 8)  # blocks of 32 along the 1000 rows: 31 full blocks and one of 8 rows
    x[992, 3] = 1000.0  # in the partial block: its floor scale is 2^(9 - 8) = 2, 1000 / 2 > 448 saturates
    x_q = fake_quantize_operand(x, quant, -2, 0)
    stats = operand_stats(x, x_q, quant, -2, sample_rows=10**6)
    assert (stats.rows, stats.elements, stats.saturated) == (1000, 8000, 1)
    assert sum(stats.scale_exponents.values()) == 32 * 8
    few = operand_stats(x, x_q, quant, -2, sample_rows=64)  # 2 of the 32 blocks: rows 0-31 and 512-543
    assert (few.rows, few.saturated, sum(few.scale_exponents.values())) == (64, 0, 2 * 8)


def test_long_rows_are_bounded_by_elements_too(monkeypatch):
    import mxlab.recipe.diagnostics as diagnostics

    monkeypatch.setattr(diagnostics, "MAX_SAMPLE_ELEMENTS", 4096)
    quant = OperandQuant("e4m3")
    x = torch.randn(100, 1024)
    stats = operand_stats(x, fake_quantize_operand(x, quant, -1, 0), quant, -1, sample_rows=50)
    assert (stats.rows, stats.elements) == (4, 4 * 1024)


def test_a_monitor_record_says_how_many_rows_it_read_and_its_sqnr_is_that_of_those_rows():
    layer = mx_layer(in_features=64, out_features=32)
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    monitor = NumericsMonitor(layer, every=1, sample_rows=64)
    with monitor.sampling(0):
        out = layer(x)
    (record,) = monitor.drain()
    # input: 64 of 4096 rows; weight (64 x 32 as multiplied, blocks of 32 along its 64 rows): all 64
    assert (record["rows_sampled"], record["rows"]) == (64 + 64, 4096 + 64)
    assert (record["out_rows_sampled"], record["out_rows"]) == (64, 4096)
    rows = torch.arange(64) * 4096 // 64
    reference = (x[rows] @ layer.weight.detach().T).double()
    noise = ((out.detach()[rows].double() - reference) ** 2).sum()
    assert record["sqnr_db"] == pytest.approx(10 * math.log10(float((reference**2).sum() / noise)))
    assert record["amax_a"] == float(x.abs().max())
    with pytest.raises(ValueError, match="sample_rows"):
        NumericsMonitor(layer, every=1, sample_rows=0)


def test_sampled_product_rows_of_a_batched_product_are_those_rows_of_the_full_product(monkeypatch):
    import mxlab.recipe.diagnostics as diagnostics

    monkeypatch.setattr(diagnostics, "MAX_SAMPLE_ELEMENTS", 40)  # forces slices along the contraction
    generator = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 3, 8, 16, generator=generator), torch.randn(2, 3, 16, 8, generator=generator)
    c, d = torch.randn(2, 3, 8, 16, generator=generator), torch.randn(2, 3, 16, 8, generator=generator)
    (first, second), rows, total = diagnostics.sampled_product_rows([(a, b), (c, d)], sample_rows=5)
    chosen = torch.arange(5) * 48 // 5
    assert (rows, total) == (5, 48)
    assert torch.allclose(first, (a @ b).reshape(48, 8)[chosen], atol=1e-5)
    assert torch.allclose(second, (c @ d).reshape(48, 8)[chosen], atol=1e-5)


@pytest.mark.gpu
def test_a_sampled_step_of_a_large_layer_costs_at_most_five_percent_more_memory_on_cuda():
    import contextlib

    layer = mx_layer(1024, 1024).cuda()
    x = torch.randn(1 << 20, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def peak(monitor):
        x.grad = None
        layer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with monitor.sampling(0) if monitor is not None else contextlib.nullcontext():
            out = layer(x)
            checksum = out.float().sum()
            checksum.backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, (checksum, x.grad.clone(), layer.weight.grad.clone())

    plain, unobserved = peak(None)
    monitor = NumericsMonitor(layer, every=1)
    sampled, observed = peak(monitor)
    assert all(torch.equal(p, q) for p, q in zip(unobserved, observed)), "observing changed the step's values"
    records = monitor.drain()
    assert {record["gemm"] for record in records} == {"fwd", "dgrad", "wgrad"}
    assert all(record["rows_sampled"] <= 2 * 1024 for record in records)
    assert sampled <= 1.05 * plain, f"sampled step peak {sampled / 2**30:.2f} GiB vs {plain / 2**30:.2f} GiB"


def test_sampled_product_rows_broadcast_leading_dims_like_matmul():
    import mxlab.recipe.diagnostics as diagnostics

    generator = torch.Generator().manual_seed(4)
    a, b = torch.randn(16, 8, generator=generator), torch.randn(3, 8, 4, generator=generator)
    (got,), rows, total = diagnostics.sampled_product_rows([(a, b)], sample_rows=7)
    chosen = torch.arange(7) * 48 // 7
    assert (rows, total) == (7, 48)
    assert torch.allclose(got, (a @ b).reshape(48, 4)[chosen], atol=1e-5)
