"""Rounding of register tiles in the element's units (`mxlab.kernels.cast.elements._stochastic_scaled` and
`_nearest_scaled`, through `fake_quant_tile`: the attention's P, dS and pre-quantized copies) against the reference
bit for bit, at every block scale, on each element's own stochastic decision and on nearest-even ties; the cast
kernels' stochastic fake-quantize on the same decisions."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mxlab.kernels._mx_device import fake_quant_tile, operand_code, token_random_bits  # noqa: E402
from mxlab.nn.operands import counted_stochastic_fake_quantize  # noqa: E402
from mxlab.nn.qmatmul import OperandQuant  # noqa: E402
from mxlab.numerics.seeding import seed_key  # noqa: E402
from tests.kernels.cast.test_casts import assert_same_bits, reference_fake_quantize  # noqa: E402
from tests.kernels.cast.test_hardware_fp8 import adversarial_input  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_FORMATS = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]
ROWS, COLS = 32, 64


@triton.jit
def _tile_kernel(X, Y, seed_key, ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, CODE: tl.constexpr):
    """Y = fake_quant_tile of one (ROWS, COLS) float32 tile of X, blocks along AXIS, random bits (stochastic codes)
    from the elements' linear indices (`token_random_bits`)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    index = rows[:, None] * COLS + cols[None, :]
    bits = token_random_bits(rows, cols, COLS, seed_key)
    tl.store(Y + index, fake_quant_tile(tl.load(X + index), bits, ROWS, COLS, AXIS, CODE))


def _wide_input(fmt: str, seed: int) -> torch.Tensor:
    """adversarial_input's tiles (ties, subnormal elements, values past the max, NaN/Inf and zero blocks, float32
    subnormals), with each row moved by its own power of two between 2^-140 and 2^120, so blocks along the rows
    and along the columns both meet scales far outside the fast range, and rows of float32 subnormals."""
    x = adversarial_input(128, COLS, fmt, torch.float32, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    exponents = torch.randint(-140, 121, (128, 1), generator=generator).float()
    wide = (
        x.double() * torch.exp2(exponents.double())
    ).float()  # float32 rounding of the moved values: still adversarial
    wide[96:100] = (
        torch.randn(4, COLS, generator=generator) * 1e-40
    )  # float32 subnormals, a block of their own along the columns
    wide[100:104, :32] = (
        3.3e38 * torch.rand(4, 32, generator=generator) ** 2
    )  # rceil: the largest may round to infinity
    wide[100, 0], wide[5, 7], wide[70, 40] = 3.3e38, float("nan"), -float("inf")
    return wide


@pytest.mark.filterwarnings(
    "ignore:overflow encountered in multiply:RuntimeWarning"
)  # the interpreter, on rceil's infinities
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
def test_tiles_equal_the_reference_at_every_scale(fmt, axis, scale_mode, rounding):
    x = _wide_input(fmt, seed=FLOAT_FORMATS.index(fmt) * 4 + axis * 2 + (scale_mode == "rceil"))
    assert (
        x.isnan().any()
        and x.isinf().any()
        and (x.abs() < 2.0**-126).logical_and(x != 0).any()
        and (x.abs() > 2.0**100).any()
    )
    _check_tile(x, fmt, axis, scale_mode, rounding, seed=1234 + axis)


def _check_tile(x: torch.Tensor, fmt: str, axis: int, scale_mode: str, rounding: str, seed: int = 0) -> None:
    """`_tile_kernel` on x (128 x COLS, float32, on DEVICE) against the reference, bit for bit (without the
    hardware FP8 conversion: that path has its own tests)."""
    y = torch.empty_like(x, device=DEVICE)
    _tile_kernel[(x.shape[0] // ROWS,)](
        x.to(DEVICE), y, seed_key(seed), ROWS=ROWS, COLS=COLS, AXIS=axis, CODE=operand_code(fmt, scale_mode, rounding)
    )
    along = axis if axis == 0 else -1
    if rounding == "stochastic":
        counter = torch.arange(x.numel()).view(x.shape)
        expected = counted_stochastic_fake_quantize(
            x, OperandQuant(fmt, 32, scale_mode, rounding), along, seed, counter
        )
    else:
        expected = reference_fake_quantize(x, fmt, axis=along, scale_mode=scale_mode, rounding=rounding)
    assert_same_bits(y.cpu(), expected, f"{fmt} axis {axis} {scale_mode} {rounding}")


def _boundary_input(fmt: str, axis: int, seed: int) -> torch.Tensor:
    """Blocks at scale 2^0 (each block's first element is 1.5 * 2^emax) whose other elements sit on the rounding
    decision of their own random bits r, one below, on and one above it: element-normal values and element-subnormal
    ones whose dropped bits equal r >> (24 - shift) (shift <= 23: `rem > threshold` decides), and values in the
    binade just under one element-subnormal step (shift 24: `significand > r` decides)."""
    from mxlab.numerics.formats import FORMATS
    from mxlab.numerics.reference import random_bits24

    element = FORMATS[fmt]
    shape = (128, COLS)
    count = shape[0] * shape[1]
    r = random_bits24(torch.arange(count), seed).view(shape).long()
    generator = torch.Generator().manual_seed(seed)
    delta = torch.randint(-1, 2, shape, generator=generator)
    regime = torch.randint(0, 3, shape, generator=generator)  # 0: element-normal, 1: element-subnormal, 2: shift 24
    k = 23 - element.mbits
    binade = torch.where(
        regime == 0,
        torch.randint(element.emin, element.emax, shape, generator=generator),
        torch.where(
            regime == 1,
            element.emin - torch.randint(1, element.mbits + 1, shape, generator=generator),
            torch.full(shape, element.emin - element.mbits - 1),
        ),
    )
    shift = torch.where(regime == 2, 24, k + (element.emin - binade).clamp(min=0))
    dropped = ((r >> (24 - shift.clamp(max=23))) + delta).clamp(min=0)
    dropped = torch.minimum(dropped, (1 << shift.clamp(max=23)) - 1)
    top = torch.randint(0, 1 << 23, shape, generator=generator) & ~((1 << shift.clamp(max=23)) - 1)
    fraction = torch.where(regime == 2, (r + delta).clamp(1 << 23, (1 << 24) - 1) - (1 << 23), top | dropped)
    bits = ((binade + 127) << 23) | fraction
    sign = torch.randint(0, 2, shape, generator=generator) << 31
    x = (bits | sign).to(torch.int64).to(torch.int32).view(torch.float32).clone()
    first = (torch.arange(shape[0]) % 32 == 0)[:, None] if axis == 0 else (torch.arange(COLS) % 32 == 0)[None, :]
    return torch.where(first, torch.tensor(1.5 * 2.0**element.emax), x)


@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
def test_stochastic_tiles_at_the_rounding_boundary(fmt, axis, scale_mode):
    _check_tile(_boundary_input(fmt, axis, 77 + axis), fmt, axis, scale_mode, "stochastic", seed=77 + axis)


def _tie_input(fmt: str, axis: int, seed: int) -> torch.Tensor:
    """Blocks at scale 2^0 (each block's first element is 1.5 * 2^emax) whose other elements are ties between two
    neighbouring values of the format, or one float32 ulp either side: element-normal ones (the dropped bits
    exactly half a step, either parity of the kept bits) and element-subnormal ones ((n + 1/2) steps of
    2^(emin - mbits))."""
    from mxlab.numerics.formats import FORMATS

    element = FORMATS[fmt]
    shape = (128, COLS)
    generator = torch.Generator().manual_seed(seed)
    k = 23 - element.mbits
    binade = torch.randint(element.emin, element.emax, shape, generator=generator)
    kept = torch.randint(0, 1 << element.mbits, shape, generator=generator)
    normal_bits = ((binade + 127) << 23) | (kept << k) | (1 << (k - 1))
    halves = torch.randint(0, 2 << element.mbits, shape, generator=generator) * 2 + 1  # odd: (n + 1/2) * 2 steps
    subnormal = halves.double() * 2.0 ** (element.emin - element.mbits - 1)
    subnormal_bits = torch.where(subnormal < 2.0**element.emin, subnormal.float().view(torch.int32).long(), normal_bits)
    bits = torch.where(torch.rand(shape, generator=generator) < 0.5, normal_bits, subnormal_bits)
    bits = bits + torch.randint(-1, 2, shape, generator=generator)  # on the tie, or one ulp below or above it
    sign = torch.randint(0, 2, shape, generator=generator) << 31
    x = (bits | sign).to(torch.int32).view(torch.float32).clone()
    first = (torch.arange(shape[0]) % 32 == 0)[:, None] if axis == 0 else (torch.arange(COLS) % 32 == 0)[None, :]
    return torch.where(first, torch.tensor(1.5 * 2.0**element.emax), x)


@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
def test_nearest_tiles_on_ties(fmt, axis, scale_mode):
    _check_tile(_tie_input(fmt, axis, 55 + axis), fmt, axis, scale_mode, "nearest_even")


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cast_kernels_fake_quantize_at_the_rounding_boundary(fmt, axis, dtype):
    """The row and column cast kernels' stochastic fake-quantize (values alone), bfloat16 and float32 outputs.
    bfloat16 inputs round the placed values to 8 bits, which moves most of them off their decision; float32 pins it."""
    from mxlab.kernels.cast import fake_quantize
    from mxlab.numerics.formats import FORMATS

    seed = 91 + axis
    x = _boundary_input(fmt, axis, seed).to(dtype)
    options = dict(axis=axis if axis == 0 else -1, scale_mode="rceil", rounding="stochastic", seed=seed)
    actual = fake_quantize(x.to(DEVICE), FORMATS[fmt], **options).cpu()
    assert_same_bits(actual, reference_fake_quantize(x, fmt, **options), f"{fmt} axis {axis} {dtype}")


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
def test_gpu_tiles_compiled(fmt):
    """The checks above compiled for the GPU (the tests above run there too, but `-m gpu` selects this one). e4m3 and
    e5m2 with nearest even take the hardware FP8 conversion there only when the host asks (`hw_fp8`), which these
    codes do not: they take the element-unit steps, as FP4/FP6 do."""
    for axis in (0, 1):
        for scale_mode in ("floor", "rceil"):
            wide = _wide_input(fmt, seed=FLOAT_FORMATS.index(fmt) * 4 + axis * 2 + (scale_mode == "rceil"))
            for rounding in ("nearest_even", "stochastic"):
                _check_tile(wide, fmt, axis, scale_mode, rounding, seed=1234 + axis)
            _check_tile(_boundary_input(fmt, axis, 77 + axis), fmt, axis, scale_mode, "stochastic", seed=77 + axis)
            _check_tile(_tie_input(fmt, axis, 55 + axis), fmt, axis, scale_mode, "nearest_even")
