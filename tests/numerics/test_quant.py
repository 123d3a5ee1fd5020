import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxlab.numerics.formats import FORMATS, decode_scales, get_format
from mxlab.numerics.quant import MXTensor, dequantize, fake_quantize, fake_quantize_rowcol, quantize
from tests.mx_oracle import oracle_round, oracle_scale_exponent

E4M3 = "e4m3"


def block_of(*values, size=32, dtype=torch.float32):
    x = torch.zeros(size, dtype=dtype)
    x[: len(values)] = torch.tensor(values, dtype=dtype)
    return x


# ----------------------------------------------------------------------------- worked cases
@pytest.mark.parametrize(
    "amax, scale_mode, scale_byte, dequantized",
    [
        (448.0, "floor", 127, 448.0),
        (448.0, "rceil", 127, 448.0),
        (448.0, "ceil", 128, 448.0),
        (3584.0, "floor", 130, 3584.0),
        (3584.0, "ceil", 131, 3584.0),
        (480.0, "floor", 127, 448.0),
        (480.0, "even", 127, 448.0),
        (480.0, "rceil", 128, 480.0),
        (449.0, "floor", 127, 448.0),
        (449.0, "rceil", 128, 448.0),
    ],
)
def test_worked_scale_cases(amax, scale_mode, scale_byte, dequantized):
    mxt = quantize(block_of(amax), E4M3, scale_mode=scale_mode)
    assert mxt.scales.item() == scale_byte
    assert dequantize(mxt)[0].item() == dequantized


def test_449_under_rceil_goes_through_224_5():
    mxt = quantize(block_of(449.0), E4M3, scale_mode="rceil")
    element = dequantize(MXTensor(mxt.codes, torch.tensor([127], dtype=torch.uint8), E4M3, 32, 0, (32,)))
    assert element[0].item() == 224.0


@pytest.mark.parametrize("rounding, expected", [("nearest_even", 16.0), ("nearest_away", 18.0), ("toward_zero", 16.0)])
def test_worked_rounding_case(rounding, expected):
    mxt = quantize(block_of(256.0, 17.0, 0.0), E4M3, rounding=rounding)
    assert mxt.scales.item() == 127
    assert dequantize(mxt)[:3].tolist() == [256.0, expected, 0.0]


def test_all_zero_block():
    mxt = quantize(torch.zeros(2, 32), E4M3)
    assert mxt.scales.tolist() == [[0], [0]]
    assert mxt.codes.eq(0).all()
    assert dequantize(mxt).eq(0).all()


@pytest.mark.parametrize("special", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_block_is_nan(special):
    x = torch.randn(2, 32)
    x[0, 7] = special
    mxt = quantize(x, E4M3)
    assert mxt.scales[0].item() == 0xFF and mxt.scales[1].item() != 0xFF
    out = dequantize(mxt)
    assert out[0].isnan().all() and out[1].isfinite().all()
    assert fake_quantize(x, E4M3)[0].isnan().all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_floor_equals_rceil_exactly_when_fraction_at_most_1_75(fmt):
    fractions = torch.linspace(1.0, 1.999, 2000)
    amax = fractions * 2.0**3
    x = torch.zeros(2000, 32)
    x[:, 0] = amax
    floor = quantize(x, fmt, scale_mode="floor").scales.squeeze(1)
    rceil = quantize(x, fmt, scale_mode="rceil").scales.squeeze(1)
    assert torch.equal(floor == rceil, fractions <= 1.75)


# ----------------------------------------------------------------------------- against the oracle
def _random_blocks(generator, n_blocks, with_subnormals=False):
    magnitudes = torch.exp2(torch.randint(-20, 20, (n_blocks, 1), generator=generator).float())
    x = torch.randn(n_blocks, 32, generator=generator) * magnitudes
    x[:, 3] = 0.0
    x[:, 4] = -0.0
    if with_subnormals:
        x[0] = torch.randn(32, generator=generator) * 2.0**-135
        x[1, :8] = torch.tensor([2.0**-149, -(2.0**-140), 2.0**-127, 1e-39, -3e-40, 2.0**-126, 0.0, 2.0**-130])
    return x


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("scale_mode", ["floor", "ceil", "rceil", "even"])
def test_scales_match_oracle(fmt, scale_mode):
    x = _random_blocks(torch.Generator().manual_seed(1), 48, with_subnormals=True)
    scales = quantize(x, fmt, scale_mode=scale_mode).scales.squeeze(1).tolist()
    expected = [oracle_scale_exponent(float(row.abs().max()), get_format(fmt), scale_mode) + 127 for row in x]
    assert scales == expected


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away", "toward_zero"])
def test_elements_match_oracle(fmt, rounding):
    x = _random_blocks(torch.Generator().manual_seed(2), 12, with_subnormals=True)
    out = fake_quantize(x, fmt, rounding=rounding, scale_mode="rceil")
    scale_exp = quantize(x, fmt, scale_mode="rceil").scales.long() - 127
    element_format = get_format(fmt)
    for row in range(x.shape[0]):
        for col in range(32):
            expected = oracle_round(float(x[row, col]), int(scale_exp[row, 0]), element_format, rounding)
            got = float(out[row, col])
            assert got == expected and math.copysign(1, got) == math.copysign(1, expected), (
                row,
                col,
                float(x[row, col]),
            )


def test_ties_round_to_even_and_away():
    # e4m3 at scale 1: 17 lies between 16 and 18 (quantum 2), 19 between 18 and 20
    x = block_of(256.0, 17.0, 19.0, -17.0, 0.5 * 2.0**-9, 1.5 * 2.0**-9)
    assert fake_quantize(x, E4M3)[:6].tolist() == [256.0, 16.0, 20.0, -16.0, 0.0, 2.0 * 2.0**-9]
    assert fake_quantize(x, E4M3, rounding="nearest_away")[:6].tolist() == [
        256.0,
        18.0,
        20.0,
        -18.0,
        2.0**-9,
        2.0 * 2.0**-9,
    ]


def test_beyond_max_saturates_with_sign():
    x = block_of(448.0, -1000.0, 1000.0)
    x[:3] = torch.tensor([1.0, -1000.0, 1000.0])
    x[3] = 448.0 * 1.0
    # amax 1000: floor scale 2^(9-8) = 2, max representable 896
    out = fake_quantize(x, E4M3)
    assert out[1].item() == -896.0 and out[2].item() == 896.0


def test_fp32_subnormal_block_is_quantized_not_flushed():
    x = block_of(2.0**-130, 2.0**-133)
    mxt = quantize(x, E4M3)
    assert mxt.scales.item() == 0  # 2^-127, the smallest scale
    assert dequantize(mxt)[:2].tolist() == [2.0**-130, 2.0**-133]


# ----------------------------------------------------------------------------- properties
finite_floats = st.floats(min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(finite_floats, min_size=64, max_size=64),
    st.sampled_from(list(FORMATS)),
    st.sampled_from(["floor", "rceil", "even"]),
    st.sampled_from(["nearest_even", "nearest_away"]),
)
def test_nearest_modes_are_idempotent(values, fmt, scale_mode, rounding):
    # (ceil scales, and toward_zero with rceil/even, can move amax across a scale boundary)
    x = torch.tensor(values, dtype=torch.float32).view(2, 32)
    once = fake_quantize(x, fmt, scale_mode=scale_mode, rounding=rounding)
    assert torch.equal(fake_quantize(once, fmt, scale_mode=scale_mode, rounding=rounding), once)


def _neighbours(x, mxt):
    """The representable values just below and above each element at its block's scale."""
    from mxlab.numerics.formats import decode_table

    table = decode_table(mxt.format)
    grid = torch.unique(table[torch.isfinite(table)]).double()
    scale = decode_scales(mxt.scales).double()
    scaled = x.double() / scale
    upper_index = torch.searchsorted(grid, scaled).clamp(max=len(grid) - 1)
    lower_index = torch.searchsorted(grid, scaled, right=True).sub(1).clamp(min=0)
    return grid[lower_index] * scale, grid[upper_index] * scale, grid[-1] * scale


@settings(max_examples=60, deadline=None)
@given(
    st.lists(finite_floats, min_size=64, max_size=64),
    st.sampled_from(list(FORMATS)),
    st.sampled_from(["floor", "ceil", "rceil", "even"]),
    st.integers(0, 2**40),
)
def test_error_bounds_and_stochastic_neighbours(values, fmt, scale_mode, seed):
    x = torch.tensor(values, dtype=torch.float32).view(2, 32)
    mxt = quantize(x, fmt, scale_mode=scale_mode)
    lower, upper, top = _neighbours(x, mxt)
    saturated = x.double().abs() > top
    inside = ~saturated
    nearest = fake_quantize(x, fmt, scale_mode=scale_mode).double()
    assert torch.all(((nearest - x.double()).abs() <= (upper - lower) / 2)[inside])
    assert torch.equal(nearest[saturated].abs(), top.expand_as(x)[saturated])
    stochastic = fake_quantize(x, fmt, scale_mode=scale_mode, rounding="stochastic", seed=seed).double()
    assert torch.all(((stochastic == lower) | (stochastic == upper))[inside])
    toward_zero = fake_quantize(x, fmt, scale_mode=scale_mode, rounding="toward_zero").double()
    assert torch.all((toward_zero.abs() <= x.double().abs())[inside])


def test_stochastic_same_seed_reproduces_other_seed_differs():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    a = fake_quantize(x, E4M3, rounding="stochastic", seed=7)
    assert torch.equal(a, fake_quantize(x, E4M3, rounding="stochastic", seed=7))
    assert not torch.equal(a, fake_quantize(x, E4M3, rounding="stochastic", seed=8))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "int8"])
def test_stochastic_rounding_is_unbiased(fmt):
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(32, generator=generator) * 4 - 2
    x[0] = 4.0  # pins the block scale
    draws = torch.stack([fake_quantize(x, fmt, rounding="stochastic", seed=s) for s in range(4000)])
    mean = draws.double().mean(0)
    standard_error = draws.double().std(0) / math.sqrt(draws.shape[0])
    exact = draws.double().std(0) == 0
    assert torch.all(((mean - x.double()).abs() <= 4 * standard_error + 1e-12) | exact)
    assert (~exact).sum() > 20  # most elements really were rounded at random


# ----------------------------------------------------------------------------- layouts and dtypes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_roundtrip_and_are_preserved(dtype):
    x = torch.randn(4, 64).to(dtype)
    out = fake_quantize(x, E4M3)
    assert out.dtype == dtype
    assert torch.equal(out.float(), fake_quantize(x.float(), E4M3))


def test_any_axis_equals_moving_that_axis_last():
    x = torch.randn(3, 64, 5, 32)
    for axis in (1, 3, -3):
        moved = fake_quantize(x.movedim(axis, -1).contiguous(), E4M3)
        assert torch.equal(fake_quantize(x, E4M3, axis=axis), moved.movedim(-1, axis))
        assert quantize(x, E4M3, axis=axis).scales.shape[axis] == x.shape[axis] // 32


def test_non_contiguous_view():
    base = torch.randn(64, 96)
    view = base.t()  # (96, 64), non-contiguous
    assert torch.equal(fake_quantize(view, E4M3), fake_quantize(view.contiguous(), E4M3))
    assert torch.equal(
        fake_quantize(view, E4M3, rounding="stochastic", seed=1),
        fake_quantize(view.contiguous(), E4M3, rounding="stochastic", seed=1),
    )


def test_square_blocks_are_transpose_invariant():
    x = torch.randn(2, 64, 96)
    mxt = quantize(x, E4M3, block=(32, 32))
    assert mxt.scales.shape == (2, 2, 3)
    transposed = fake_quantize(x.transpose(-1, -2).contiguous(), E4M3, block=(32, 32))
    assert torch.equal(fake_quantize(x, E4M3, block=(32, 32)), transposed.transpose(-1, -2))
    tile = x[0, 32:64, 64:96]
    assert mxt.scales[0, 1, 2].item() == oracle_scale_exponent(float(tile.abs().max()), get_format(E4M3), "floor") + 127


def test_pad_restores_shape_and_matches_manual_padding():
    x = torch.randn(5, 70)
    mxt = quantize(x, E4M3, pad=True)
    assert mxt.codes.shape == (5, 96) and mxt.scales.shape == (5, 3)
    assert dequantize(mxt).shape == x.shape
    manual = fake_quantize(torch.nn.functional.pad(x, (0, 26)), E4M3)[:, :70]
    assert torch.equal(fake_quantize(x, E4M3, pad=True), manual)
    square = fake_quantize(x, E4M3, block=(32, 32), pad=True)
    assert square.shape == x.shape


def test_rowcol_quantizes_each_orientation_from_the_input():
    x = torch.randn(64, 96)
    rows, cols = fake_quantize_rowcol(x, E4M3, scale_mode="rceil")
    assert torch.equal(rows, fake_quantize(x, E4M3, scale_mode="rceil"))
    assert torch.equal(cols, fake_quantize(x, E4M3, scale_mode="rceil", axis=0))
    rows_again, cols_again, sums = fake_quantize_rowcol(x, E4M3, scale_mode="rceil", column_sums=True)
    assert torch.equal(rows_again, rows) and torch.equal(cols_again, cols)
    assert sums.dtype == torch.float32 and torch.equal(sums, x.sum(0, dtype=torch.float32))


def test_high_precision_and_per_tensor_fp8():
    x = torch.randn(8, 40) * 10
    assert torch.equal(fake_quantize(x, "fp32"), x)
    assert torch.equal(fake_quantize(x, "bf16"), x.bfloat16().float())
    fp8 = fake_quantize(x, "fp8_tensor_e4m3")
    scale = 448.0 / x.abs().max()
    assert torch.equal(fp8, (x * scale).to(torch.float8_e4m3fn).float() * (1 / scale))
    assert fp8.abs().max() <= x.abs().max() * (1 + 2**-3)
    tiny = torch.tensor([1e-39, 0.0, -5e-40])  # 448 / amax overflows float32: the scale is capped
    tiny_out = fake_quantize(tiny, "fp8_tensor_e4m3")
    assert torch.isfinite(tiny_out).all() and tiny_out[1] == 0 and tiny_out[0] > 0 and tiny_out[2] < 0


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quantize(torch.randn(4, 40), E4M3), r"dimension 1 .* size 40.*pad=True"),
        (lambda: quantize(torch.randn(4, 32), "e4m4"), "accepted: e4m3"),
        (lambda: fake_quantize(torch.randn(4, 32), "fp16"), "accepted: e4m3"),
        (lambda: quantize(torch.randn(4, 32), E4M3, block=16), "unsupported block 16"),
        (
            lambda: quantize(torch.randn(4, 32), E4M3, scale_mode="round"),
            "scale_mode 'round'.*floor, ceil, rceil, even",
        ),
        (lambda: quantize(torch.randn(4, 32), E4M3, rounding="up"), "rounding 'up'.*nearest_even"),
        (lambda: quantize(torch.randn(4, 32), E4M3, rounding="stochastic"), "needs an integer seed"),
        (lambda: quantize(torch.randn(4, 32).double(), E4M3), "dtype torch.float64"),
        (lambda: quantize(torch.randn(4, 32), E4M3, axis=2), "axis 2 out of range"),
        (lambda: quantize(torch.randn(32), E4M3, block=(32, 32)), "last two dims"),
        (lambda: quantize([1.0] * 32, E4M3), "torch.Tensor"),
        (lambda: fake_quantize_rowcol(torch.randn(2, 32, 32), E4M3), "2-D"),
    ],
)
def test_bad_input_is_refused_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fake_quantize_counted_with_linear_index_counters_is_stochastic_fake_quantize():
    from mxlab.numerics.quant import fake_quantize_counted

    x = torch.randn(5, 70, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for block, axis in ((32, -1), (32, 0), ((32, 32), -1)):
        options = dict(block=block, axis=axis, scale_mode="rceil", pad=True)
        linear = torch.arange(x.numel()).view(x.shape)
        counted = fake_quantize_counted(x, "e4m3", counter=linear, seed=11, **options)
        assert counted.dtype == x.dtype
        assert torch.equal(counted, fake_quantize(x, "e4m3", rounding="stochastic", seed=11, **options))
        shifted = fake_quantize_counted(x, "e4m3", counter=linear + 1, seed=11, **options)
        assert not torch.equal(shifted, counted)  # the bits follow the counter, not the layout


def test_fake_quantize_counted_refuses_bad_counters():
    from mxlab.numerics.quant import fake_quantize_counted

    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="int64"):
        fake_quantize_counted(x, "e4m3", counter=torch.zeros(4, 32, dtype=torch.int32), seed=1)
    with pytest.raises(ValueError, match="broadcast"):
        fake_quantize_counted(x, "e4m3", counter=torch.zeros(3, 32, dtype=torch.int64), seed=1)
    with pytest.raises(ValueError, match="MX format"):
        fake_quantize_counted(x, "bf16", counter=torch.zeros(4, 32, dtype=torch.int64), seed=1)
