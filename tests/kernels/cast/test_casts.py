"""The Triton MX cast kernels (mxlab.kernels.cast) against the PyTorch reference, bit for bit.

CPU runs use the Triton interpreter at small sizes; `-m gpu` runs large and awkward sizes on CUDA.
Every comparison is on bit patterns (codes, scale bytes, value bits), with NaN where NaN.
"""

import os
from contextlib import contextmanager

import pytest
import torch

from mxlab.numerics import quant
from mxlab.numerics.formats import FORMATS

LAUNCH_OPTIONS = ("fast", "hw_fp8", "tile")  # what a test may vary besides the numerics: CastLaunch's fields

FMTS = list(FORMATS)
SCALE_MODES = ["floor", "ceil", "rceil", "even"]
ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero", "stochastic"]
BITS_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@contextmanager
def backend(name: str | None):
    previous = os.environ.get("MXLAB_BACKEND")
    if name is None:
        os.environ.pop("MXLAB_BACKEND", None)
    else:
        os.environ["MXLAB_BACKEND"] = name
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MXLAB_BACKEND", None)
        else:
            os.environ["MXLAB_BACKEND"] = previous


def reference_quantize(x, fmt, **options):
    with backend("reference"):
        mxt = quant.quantize(x, fmt, **options)
        assert quant.last_backend() == "reference"
    return mxt.codes, mxt.scales


def reference_fake_quantize(x, fmt, **options):
    with backend("reference"):
        return quant.fake_quantize(x, fmt, **options)


def with_launch(options: dict) -> dict:
    """`options` with the launch options (fast, hw_fp8, tile) moved into one CastLaunch under `_launch`."""
    from mxlab.kernels.cast import CastLaunch

    launch = {key: options[key] for key in LAUNCH_OPTIONS if key in options}
    rest = {key: value for key, value in options.items() if key not in LAUNCH_OPTIONS}
    return {**rest, "_launch": CastLaunch(**launch)} if launch else rest


def numerics_only(options: dict) -> dict:
    """`options` without the launch options (for the reference, which has none)."""
    return {key: value for key, value in options.items() if key not in LAUNCH_OPTIONS}


def launch_tiles():
    """mxlab.kernels.cast.launch (TileConfig and the default launch shapes)."""
    from mxlab.kernels.cast import launch

    return launch


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.is_floating_point:
        nan_a, nan_e = actual.isnan(), expected.isnan()
        assert torch.equal(nan_a, nan_e), f"{what}: NaN at different places"
        bits = BITS_DTYPES[actual.dtype]
        actual, expected = actual.view(bits)[~nan_a], expected.view(bits)[~nan_e]
    mismatch = (actual != expected).nonzero()
    assert mismatch.numel() == 0, f"{what}: {mismatch.shape[0]} elements differ, first at {mismatch[0].tolist()}"


def awkward_rows(rows: int, width: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rows in groups of 8: ordinary values over a wide range of block magnitudes; specials (NaN,
    Inf, zeros, -0, values beyond every format's max, float32 subnormals); blocks of tiny
    values (scale exponents clamped at -127); blocks near the dtype's max."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g) * torch.exp2(
        torch.randint(-30, 30, (rows, width // 32), generator=g).float()
    ).repeat_interleave(32, 1)
    x[:, ::7] *= 1.0 / 1024
    x = x.double()
    for start in range(8, rows, 32):
        block = x[start : start + 8]
        block.view(-1)[::37] = 0.0
        block.view(-1)[3::41] = -0.0
        block.view(-1)[5::97] = 1e6  # beyond max of every format at small scales
        block[0, 1] = float("nan")
        block[1, 33] = float("inf")
        block[2, 2] = -float("inf")
        block[3, :32] = 0.0
        block[4, :32] = -0.0
        block[5, 40] = 1e-40  # float32 subnormal in an ordinary block
    tiny = {torch.float32: 1e-42, torch.bfloat16: 1e-39, torch.float16: 1e-7}[dtype]
    big = {torch.float32: 3e38, torch.bfloat16: 3e38, torch.float16: 6e4}[dtype]
    for start in range(16, rows, 32):
        x[start : start + 8] = torch.randn(x[start : start + 8].shape, generator=g).double() * tiny
    for start in range(24, rows, 32):
        x[start : start + 8] = (torch.rand(x[start : start + 8].shape, generator=g).double() * 0.2 + 0.8) * big
        x[start, 0] = {torch.float32: 3.4028234e38, torch.bfloat16: 3.3895e38, torch.float16: 65504.0}[dtype]
    return x.to(dtype)


def row_tile(kernels):
    """8 rows per program, so one launch mixes tiles on the fast path and on the exact path."""
    return kernels.TileConfig(rows=8, col_blocks=2, num_warps=4)


def check_quantize(kernels, x, fmt, tile=None, fast=True, **options):
    codes, scales = kernels.quantize(x, FORMATS[fmt], **with_launch(dict(fast=fast, tile=tile)), **options)
    ref_codes, ref_scales = reference_quantize(x, fmt, **options)
    assert_same_bits(scales, ref_scales, "scales")
    assert_same_bits(codes, ref_codes, "codes")


def check_fake_quantize(kernels, x, fmt, tile=None, fast=True, **options):
    values = kernels.fake_quantize(x, FORMATS[fmt], **with_launch(dict(fast=fast, tile=tile)), **options)
    assert_same_bits(values, reference_fake_quantize(x, fmt, **options), "values")


# ----------------------------------------------------------------------------- CPU (interpreter) / any device
# every (format, rounding) and every (format, scale mode) pair; the GPU tests run the full product
ROWWISE_CASES = [
    (fmt, SCALE_MODES[(i + j) % len(SCALE_MODES)], rounding)
    for i, fmt in enumerate(FMTS)
    for j, rounding in enumerate(ROUNDINGS)
]


@pytest.mark.parametrize("fmt, scale_mode, rounding", ROWWISE_CASES)
def test_rowwise_every_format_scale_and_rounding(kernels, device, fmt, scale_mode, rounding):
    x = awkward_rows(32, 64, torch.float32).to(device)
    options = dict(scale_mode=scale_mode, rounding=rounding, seed=1234 if rounding == "stochastic" else None)
    check_quantize(kernels, x, fmt, tile=row_tile(kernels), **options)
    check_fake_quantize(kernels, x, fmt, tile=row_tile(kernels), **options)


HALF_CASES = (
    [(torch.bfloat16, fmt, "floor", "nearest_even") for fmt in FMTS]
    + [(torch.float16, fmt, "rceil", "stochastic") for fmt in FMTS]
    + [(torch.float16, fmt, "floor", "nearest_even") for fmt in ("e4m3", "int8")]
    + [(torch.bfloat16, fmt, "rceil", "stochastic") for fmt in ("e4m3", "int8")]
)


@pytest.mark.parametrize("dtype, fmt, scale_mode, rounding", HALF_CASES)
def test_rowwise_half_precision_inputs(kernels, device, dtype, fmt, scale_mode, rounding):
    x = awkward_rows(32, 64, dtype, seed=1).to(device)
    options = dict(scale_mode=scale_mode, rounding=rounding, seed=2**40 + 5 if rounding == "stochastic" else None)
    check_quantize(kernels, x, fmt, tile=row_tile(kernels), **options)
    check_fake_quantize(kernels, x, fmt, tile=row_tile(kernels), **options)


@pytest.mark.parametrize("fmt", FMTS)
def test_exact_path_equals_fast_path_on_ordinary_blocks(kernels, device, fmt):
    x = (torch.randn(16, 64, generator=torch.Generator().manual_seed(3)) * 10).to(device)
    fast = kernels.fake_quantize(x, FORMATS[fmt])
    exact = kernels.fake_quantize(x, FORMATS[fmt], **with_launch(dict(fast=False)))
    assert_same_bits(fast, exact, "fast vs exact")
    check_quantize(kernels, x, fmt, fast=False)


@pytest.mark.parametrize(
    "fmt, scale_mode, rounding",
    [(fmt, *(("floor", "nearest_even"), ("even", "stochastic"))[i % 2]) for i, fmt in enumerate(FMTS)],
)
def test_columnwise(kernels, device, fmt, scale_mode, rounding):
    """The column kernel at the default launch of the call and at its hardware-path shape."""
    x = awkward_rows(32, 64, torch.float32, seed=4).t().contiguous()  # specials now in columns
    x[:32] = torch.randn(32, 32, generator=torch.Generator().manual_seed(4)) * 100  # an ordinary 32-row block
    x = x.to(device)
    options = dict(axis=0, scale_mode=scale_mode, rounding=rounding, seed=99 if rounding == "stochastic" else None)
    for tile in (None, launch_tiles().COL_TILE):
        check_quantize(kernels, x, fmt, tile=tile, **options)
        check_fake_quantize(kernels, x, fmt, tile=tile, **options)


@pytest.mark.parametrize("hardware_shape", [False, True], ids=["default-launch", "hardware-path-shape"])
@pytest.mark.parametrize(
    "fmt, rounding",
    [("e4m3", "nearest_even"), ("e4m3", "stochastic"), ("int8", "stochastic"), ("e2m1", "nearest_even")],
)
def test_rowcol_from_one_read_equals_two_quantizations(kernels, device, fmt, rounding, hardware_shape):
    """Both-at-once casts from the one-pass column kernel, at the call's default launch and at the hardware path's
    shape."""
    tile = launch_tiles().COL_TILE if hardware_shape else None
    x = awkward_rows(64, 64, torch.bfloat16, seed=5)[:32]  # one 32-row block with every kind of awkward value
    if fmt != "e2m1":  # padded along both dims, one ordinary 32-row block (fast path) and one awkward
        x = awkward_rows(64, 64, torch.bfloat16, seed=5)[:50, :45]
        x[:32] = torch.randn(32, 45, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x = x.to(device)
    options = dict(
        scale_mode="rceil", rounding=rounding, seed=7 if rounding == "stochastic" else None, pad=fmt != "e2m1"
    )
    (row_codes, row_scales), (col_codes, col_scales) = kernels.quantize_rowcol(
        x, FORMATS[fmt], **with_launch(dict(tile=tile)), **options
    )
    expected_row = reference_quantize(x.cpu(), fmt, axis=-1, **options)
    expected_col = reference_quantize(x.cpu(), fmt, axis=0, **options)
    assert_same_bits(row_codes.cpu(), expected_row[0], "row codes")
    assert_same_bits(row_scales.cpu(), expected_row[1], "row scales")
    assert_same_bits(col_codes.cpu(), expected_col[0], "column codes")
    assert_same_bits(col_scales.cpu(), expected_col[1], "column scales")
    along_last, along_first = kernels.fake_quantize_rowcol(x, FORMATS[fmt], **with_launch(dict(tile=tile)), **options)
    assert_same_bits(along_last.cpu(), reference_fake_quantize(x.cpu(), fmt, axis=-1, **options), "along last")
    assert_same_bits(along_first.cpu(), reference_fake_quantize(x.cpu(), fmt, axis=0, **options), "along first")


@pytest.mark.parametrize("hardware_shape", [False, True], ids=["default-launch", "hardware-path-shape"])
def test_rowcol_column_sums_are_the_columns_float32_sums(kernels, device, hardware_shape):
    """column_sums=True (a linear layer's bias gradient from the one read): the values of the call without it,
    and x.sum(0) in float32 within float32 accumulation error of the exact sum; padded rows add nothing."""
    from mxlab.kernels.cast import CastLaunch

    launch = CastLaunch(tile=launch_tiles().COL_TILE) if hardware_shape else CastLaunch()
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(77, 45, generator=g) * 2.0 ** torch.randint(-8, 9, (77, 45), generator=g)).to(torch.bfloat16)
    options = dict(scale_mode="rceil", pad=True, _launch=launch)
    along_last, along_first, sums = kernels.fake_quantize_rowcol(
        x.to(device), FORMATS["e4m3"], column_sums=True, **options
    )
    want_last, want_first = kernels.fake_quantize_rowcol(x.to(device), FORMATS["e4m3"], **options)
    assert_same_bits(along_last.cpu(), want_last.cpu(), "along last")
    assert_same_bits(along_first.cpu(), want_first.cpu(), "along first")
    assert sums.dtype == torch.float32 and tuple(sums.shape) == (45,)
    exact = x.double().sum(0)
    assert bool(((sums.cpu().double() - exact).abs() <= x.shape[0] * 2.0**-24 * x.double().abs().sum(0)).all())
    assert not torch.equal(sums.cpu(), torch.zeros(45))


def element_normal_blocks(rows: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Blocks whose every element is within a factor 2 of the block's amax (element-normal for every
    floating-point format at any scale mode), over a wide range of block magnitudes, with zeros and -0."""
    g = torch.Generator().manual_seed(seed)
    magnitude = (1 + torch.rand(rows, width, generator=g)) * torch.exp2(
        torch.randint(-20, 20, (rows // 32 + 1, width // 32 + 1), generator=g).float()
    ).repeat_interleave(32, 0).repeat_interleave(32, 1)[:rows, :width]
    x = torch.where(torch.rand(rows, width, generator=g) < 0.5, -magnitude, magnitude)
    x.view(-1)[::29] = 0.0
    x.view(-1)[7::31] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize("fmt", [f for f in FMTS if not FORMATS[f].is_int])
@pytest.mark.parametrize("element_subnormal", [False, True])
def test_stochastic_tiles_of_element_normal_values(kernels, device, fmt, element_subnormal):
    """Stochastic tiles whose nonzero elements are all element-normal take `_stochastic_normal_elements` (bias
    added to the float32 pattern); one element-subnormal value sends its tile to the general steps. Rows,
    columns, both at once and (32, 32) tiles, codes and values, bit for bit."""
    x = element_normal_blocks(64, 256, torch.bfloat16, seed=14)  # several tiles of each layout beside the subnormal's
    if element_subnormal:
        x[3, 40] = x[3, 32:64].abs().max() * 2.0**-20  # below 2^(S + emin) of its block for every format
    x = x.to(device)
    options = dict(scale_mode="floor", rounding="stochastic", seed=2**33 + 17)
    check_quantize(kernels, x, fmt, **options)
    check_fake_quantize(kernels, x, fmt, **options)
    check_quantize(kernels, x, fmt, block=(32, 32), **options)
    check_fake_quantize(kernels, x, fmt, axis=0, **options)
    (_, _), (col_codes, col_scales) = kernels.quantize_rowcol(x, FORMATS[fmt], **options)
    assert_same_bits(col_codes.cpu(), reference_quantize(x.cpu(), fmt, axis=0, **options)[0], "column codes")
    along_last, _ = kernels.fake_quantize_rowcol(x, FORMATS[fmt], **options)
    assert_same_bits(along_last.cpu(), reference_fake_quantize(x.cpu(), fmt, axis=-1, **options), "along last")


@pytest.mark.parametrize("fmt", [f for f in FMTS if not FORMATS[f].is_int])
def test_stochastic_tiles_at_the_rounding_boundary(kernels, device, fmt):
    """Element-normal float32 values whose dropped bits equal the random threshold r >> (24 - shift) of their own
    counter, one below and one above it: where the rule `rem > threshold` decides, codes and values as the
    reference (a bias off by one in `_stochastic_normal_elements` fails here)."""
    from mxlab.numerics.reference import random_bits24

    seed, shift = 21, 23 - FORMATS[fmt].mbits
    x = element_normal_blocks(32, 512, torch.float32, seed=15)
    threshold = random_bits24(torch.arange(x.numel()), seed).view(x.shape) >> (24 - shift)
    delta = torch.arange(x.numel()).view(x.shape) % 3 - 1  # -1, 0, +1
    dropped = (threshold + delta).clamp(0, (1 << shift) - 1).to(torch.int32)
    bits = x.view(torch.int32)
    x = torch.where(x == 0, x, ((bits & ~((1 << shift) - 1)) | dropped).view(torch.float32)).to(device)
    options = dict(scale_mode="floor", rounding="stochastic", seed=seed)
    check_quantize(kernels, x, fmt, **options)
    check_fake_quantize(kernels, x, fmt, **options)


def test_launch_options_refuse_what_is_not_a_tile(kernels):
    with pytest.raises(ValueError, match="CastLaunch.tile"):
        kernels.CastLaunch(tile=(16, 8, 4))


def test_tile_config_refuses_bad_values(kernels):
    for bad in (dict(rows=12), dict(col_blocks=0), dict(num_warps=3)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            kernels.TileConfig(**bad)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_square_tiles_batched_and_padded(kernels, device, fmt, rounding):
    x = awkward_rows(64, 64, torch.float32, seed=6).reshape(2, 32, 64)[:, :, :45].to(device)  # non-contiguous
    options = dict(
        block=(32, 32), scale_mode="floor", rounding=rounding, pad=True, seed=11 if rounding == "stochastic" else None
    )
    check_quantize(kernels, x, fmt, **options)
    check_fake_quantize(kernels, x, fmt, **options)


@pytest.mark.parametrize(
    "shape, axis, pad", [((45, 70), -1, True), ((45, 70), 0, True), ((3, 32, 5), 1, False), ((2, 3, 64), -1, False)]
)
def test_padding_and_other_axes(kernels, device, shape, axis, pad):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(8)) * 3).to(device)
    check_quantize(kernels, x, "e4m3", axis=axis, pad=pad, rounding="stochastic", seed=5)
    check_fake_quantize(kernels, x, "e2m1", axis=axis, pad=pad)
    if axis % x.dim() != x.dim() - 1:  # the one-pass column kernel, the hardware path's launch
        check_quantize(kernels, x, "e4m3", axis=axis, pad=pad, tile=launch_tiles().COL_TILE)
        check_fake_quantize(kernels, x, "e2m1", axis=axis, pad=pad, tile=launch_tiles().COL_TILE)


def test_non_contiguous_rows(kernels, device):
    base = (torch.randn(64, 96, generator=torch.Generator().manual_seed(9)) * 5).to(device)
    transposed = base.t()  # (96, 64), strides (1, 96)
    check_quantize(kernels, transposed, "e4m3", rounding="stochastic", seed=3)
    check_fake_quantize(kernels, base[::2, 32:], "e5m2")
    for tile in (None, launch_tiles().COL_TILE):  # column blocks of non-contiguous views, both column launch shapes
        check_quantize(kernels, transposed, "e4m3", axis=0, tile=tile)
        check_fake_quantize(kernels, base[::2, 32:], "e5m2", axis=0, tile=tile)


def test_stochastic_rounding_depends_on_seed_only(kernels, device):
    x = (torch.randn(8, 64, generator=torch.Generator().manual_seed(10))).to(device)
    first = kernels.quantize(x, FORMATS["e2m1"], rounding="stochastic", seed=1)[0]
    again = kernels.quantize(x, FORMATS["e2m1"], rounding="stochastic", seed=1)[0]
    other = kernels.quantize(x, FORMATS["e2m1"], rounding="stochastic", seed=2)[0]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_kernels_refuse_bad_input(kernels, device):
    with pytest.raises(ValueError, match="multiple of the block"):
        kernels.quantize(torch.randn(4, 40, device=device), FORMATS["e4m3"])
    with pytest.raises(ValueError, match="seed"):
        kernels.quantize(torch.randn(4, 32, device=device), FORMATS["e4m3"], rounding="stochastic")
    with pytest.raises(ValueError, match="scale_mode"):
        kernels.quantize(torch.randn(4, 32, device=device), FORMATS["e4m3"], scale_mode="round")
    with pytest.raises(ValueError, match="dtype"):
        kernels.quantize(torch.randn(4, 32, device=device, dtype=torch.float64), FORMATS["e4m3"])


# ----------------------------------------------------------------------------- dispatch in mxlab.numerics.quant
def test_dispatch_forced_triton_runs_the_kernels(kernels, device):
    x = torch.randn(32, 64, device=device)
    with backend("triton"):
        mxt = quant.quantize(x, "e4m3", scale_mode="rceil")
        assert quant.last_backend() == "triton"
        values = quant.fake_quantize(x, "e2m3", axis=0)
        assert quant.last_backend() == "triton"
        along_last, along_first = quant.fake_quantize_rowcol(x, "e4m3", rounding="stochastic", seed=4)
        assert quant.last_backend() == "triton"
    assert_same_bits(mxt.codes.cpu(), reference_quantize(x.cpu(), "e4m3", scale_mode="rceil")[0])
    assert_same_bits(values.cpu(), reference_fake_quantize(x.cpu(), "e2m3", axis=0))
    assert_same_bits(along_first.cpu(), reference_fake_quantize(x.cpu(), "e4m3", axis=0, rounding="stochastic", seed=4))


def test_dispatch_default_and_forced_reference(kernels, device):
    x = torch.randn(4, 32, device=device)
    with backend(None):
        quant.quantize(x, "e4m3")
        assert quant.last_backend() == ("triton" if device == "cuda" else "reference")
    with backend("reference"):
        quant.fake_quantize(x, "e4m3")
        assert quant.last_backend() == "reference"


def test_dispatch_refuses_unknown_backend(kernels, device):
    with backend("cuda-magic"), pytest.raises(ValueError, match="MXLAB_BACKEND"):
        quant.quantize(torch.randn(4, 32, device=device), "e4m3")


def test_forced_triton_on_cpu_without_interpreter_is_an_error(kernels, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with backend("triton"), pytest.raises(ValueError, match="cannot run"):
        quant.quantize(torch.randn(4, 32), "e4m3")


# ----------------------------------------------------------------------------- GPU: large and awkward
def sprinkle_specials(x: torch.Tensor, seed: int) -> torch.Tensor:
    """NaN, Inf, zeros, subnormals and beyond-max values at random places of a float32 tensor."""
    g = torch.Generator().manual_seed(seed)
    flat = x.view(-1)
    for value, count in [
        (float("nan"), 5),
        (float("inf"), 5),
        (-float("inf"), 5),
        (0.0, 5000),
        (-0.0, 5000),
        (1e-40, 500),
        (-3e-39, 500),
        (1e30, 50),
    ]:
        flat[torch.randint(0, flat.numel(), (count,), generator=g)] = value
    return x


def big_input(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-40, 40, (rows, 1), generator=g).float())
    x[: rows // 16] *= 1e-38  # tiny blocks: scale exponents clamped at -127
    return sprinkle_specials(x, seed).to(dtype).cuda()


# one compiled kernel per case, so the list stays short: every scale mode with nearest-even and
# stochastic rounding for e4m3, two option sets for the other formats, then float32/float16 inputs
GPU_ROWWISE_CASES = (
    [
        ("e4m3", scale_mode, rounding, torch.bfloat16)
        for scale_mode in SCALE_MODES
        for rounding in ("nearest_even", "stochastic")
    ]
    + [("e4m3", "even", "nearest_away", torch.bfloat16), ("e4m3", "ceil", "toward_zero", torch.bfloat16)]
    + [(fmt, "rceil", "stochastic", torch.bfloat16) for fmt in FMTS if fmt != "e4m3"]
    + [(fmt, "floor", "nearest_even", torch.bfloat16) for fmt in FMTS if fmt != "e4m3"]
    + [(fmt, "even", "nearest_even", dtype) for fmt in ("e4m3", "int8") for dtype in (torch.float32, torch.float16)]
    + [("e2m1", "floor", "stochastic", torch.float32)]
)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, scale_mode, rounding, dtype", GPU_ROWWISE_CASES)
def test_gpu_rowwise_large(fmt, scale_mode, rounding, dtype):
    from mxlab.numerics.quant import _import_kernels

    kernels = _import_kernels()
    x = big_input(3001, 1024, dtype, seed=FMTS.index(fmt))  # 3001 rows: not a multiple of any tile
    options = dict(scale_mode=scale_mode, rounding=rounding, seed=2**33 + 1 if rounding == "stochastic" else None)
    check_quantize(kernels, x, fmt, **options)
    check_fake_quantize(kernels, x, fmt, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_gpu_columnwise_rowcol_and_tiles_large(fmt, rounding):
    from mxlab.numerics.quant import _import_kernels

    kernels = _import_kernels()
    x = big_input(2016, 2050, torch.bfloat16, seed=7)[:, 1:2049]  # non-contiguous, 4M elements
    options = dict(scale_mode="rceil", rounding=rounding, seed=77 if rounding == "stochastic" else None)
    check_quantize(kernels, x, fmt, axis=0, **options)
    check_fake_quantize(kernels, x, fmt, axis=0, **options)
    along_last, along_first = kernels.fake_quantize_rowcol(x, FORMATS[fmt], **options)
    assert_same_bits(along_last, reference_fake_quantize(x, fmt, axis=-1, **options), "along last")
    assert_same_bits(along_first, reference_fake_quantize(x, fmt, axis=0, **options), "along first")
    tiles = big_input(3000, 700, torch.float32, seed=8).reshape(3, 1000, 700)
    check_quantize(kernels, tiles, fmt, block=(32, 32), pad=True, **options)
    check_fake_quantize(kernels, tiles, fmt, block=(32, 32), pad=True, **options)


@pytest.mark.gpu
def test_gpu_transposed_input_and_dispatch():
    x = big_input(4096, 1024, torch.bfloat16, seed=9).t()  # (1024, 4096), strides (1, 1024)
    with backend(None):
        mxt = quant.quantize(x, "e4m3", rounding="stochastic", seed=5)
        assert quant.last_backend() == "triton"
        along_last, along_first = quant.fake_quantize_rowcol(x, "e4m3")
        assert quant.last_backend() == "triton"
    codes, scales = reference_quantize(x, "e4m3", rounding="stochastic", seed=5)
    assert_same_bits(mxt.codes, codes)
    assert_same_bits(mxt.scales, scales)
    assert_same_bits(along_first, reference_fake_quantize(x, "e4m3", axis=0))
