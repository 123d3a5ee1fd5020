"""The fused random Hadamard transform + MX cast kernels against the reference composition, bit for bit.

The reference is `fake_quantize(random_hadamard(x.float() zero-padded along axis, 32, axis, hadamard_seed),
fmt, axis=axis)` (and `quantize` for codes) on the PyTorch reference backend. CPU runs use the Triton
interpreter at small sizes; `-m gpu` runs a few million elements per case on CUDA, including the hardware
FP8 conversion path. Comparisons are on bit patterns, with NaN where NaN.
"""

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from mxlab.numerics import quant
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.hadamard import random_hadamard
from tests.kernels.cast.test_casts import assert_same_bits, backend, big_input, numerics_only, with_launch

pytestmark = pytest.mark.filterwarnings(  # the interpreter's numpy arithmetic on Inf and NaN blocks
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)

FMTS = list(FORMATS)
BLOCK = 32
HARDWARE_INSTRUCTION = {"e4m3": "cvt.rn.satfinite.e4m3x2.f32", "e5m2": "cvt.rn.satfinite.e5m2x2.f32"}


# ----------------------------------------------------------------------------- the reference composition
def transformed(x: torch.Tensor, axis: int, hadamard_seed: int) -> torch.Tensor:
    """random_hadamard of x.float() zero-padded along `axis` to a multiple of 32 (float32)."""
    axis %= x.dim()
    values = x.float()
    missing = -x.shape[axis] % BLOCK
    if missing:
        values = F.pad(values, [0, 0] * (x.dim() - 1 - axis) + [0, missing])
    return random_hadamard(values, BLOCK, axis, hadamard_seed)


def reference_values(x: torch.Tensor, fmt: str, *, axis: int, hadamard_seed: int, **options) -> torch.Tensor:
    options.pop("pad", None)
    with backend("reference"):
        return quant.fake_quantize(transformed(x, axis, hadamard_seed), fmt, axis=axis, **options)


def reference_codes(x: torch.Tensor, fmt: str, *, axis: int, hadamard_seed: int, **options):
    options.pop("pad", None)
    with backend("reference"):
        mxt = quant.quantize(transformed(x, axis, hadamard_seed), fmt, axis=axis, **options)
    return mxt.codes, mxt.scales


def check_values(kernels, x, fmt, **options) -> torch.Tensor:
    values = kernels.hadamard_fake_quantize(x, FORMATS[fmt], **with_launch(options))
    options = numerics_only(options)
    assert values.dtype == torch.float32
    assert_same_bits(values, reference_values(x, fmt, **options), f"{fmt} values")
    return values


def check_codes(kernels, x, fmt, **options) -> None:
    codes, scales = kernels.hadamard_quantize(x, FORMATS[fmt], **with_launch(options))
    options = numerics_only(options)
    expected_codes, expected_scales = reference_codes(x, fmt, **options)
    assert_same_bits(scales, expected_scales, f"{fmt} scales")
    assert_same_bits(codes, expected_codes, f"{fmt} codes")


def stochastic_seed(rounding: str) -> int | None:
    return 2**33 + 7 if rounding == "stochastic" else None


# ----------------------------------------------------------------------------- inputs
SPECIAL_ROWS = range(17, 24)  # rows r with r % 32 in SPECIAL_ROWS hold the special blocks


def hadamard_input(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(rows, cols) with 32-element blocks along the last dim. Ordinary blocks: magnitudes 2^-40..2^40 per
    block, every third row with an outlier 2^12 times larger at the start of each block (what the transform
    spreads). Rows r with r % 32 in 17..23: a NaN; +Inf, and +Inf with -Inf; blocks of +0, -0, mixed zeros;
    dtype subnormals; large finite values whose sums stay finite; values whose sums overflow to Inf; a block
    with one nonzero element (a transformed block of equal magnitudes). The other rows are ordinary, so
    small tiles take the fast path and tiles with special rows the exact path."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-40, 40, (rows, cols // BLOCK), generator=g).float()).repeat_interleave(BLOCK, 1)
    x = (torch.randn(rows, cols, generator=g) * scale).double()
    x[::3, ::BLOCK] *= 4096.0
    tiny = {torch.float32: 1e-42, torch.bfloat16: 1e-39, torch.float16: 1e-7}[dtype]
    large = {torch.float32: 1e37, torch.bfloat16: 1e37, torch.float16: 2e3}[dtype]
    for start in range(0, rows, 32):
        special = {r: start + r for r in SPECIAL_ROWS if start + r < rows}
        if 17 in special:
            x[special[17], 5] = float("nan")
        if 18 in special:
            x[special[18], 3] = float("inf")
            x[special[18], BLOCK + 1] = float("inf")
            x[special[18], BLOCK + 9] = -float("inf")
        if 19 in special:
            x[special[19], :BLOCK] = 0.0
            x[special[19], BLOCK : 2 * BLOCK] = -0.0
            x[special[19], 2 * BLOCK :: 2] = 0.0
            x[special[19], 2 * BLOCK + 1 :: 2] = -0.0
        if 20 in special:
            x[special[20]] = torch.randn(cols, generator=g).double() * tiny
        if 21 in special:
            signs = torch.where(torch.rand(cols, generator=g) < 0.5, -1.0, 1.0).double()
            x[special[21]] = (torch.rand(cols, generator=g).double() * 0.5 + 0.5) * large * signs
        if 22 in special:
            x[special[22]] = 3e38 if dtype != torch.float16 else 6e4  # sums overflow to Inf, differences 0
        if 23 in special:
            x[special[23]] = 0.0
            x[special[23], 7::BLOCK] = 1.0 + torch.arange(cols // BLOCK).double() / 8
    return x.to(dtype)


def column_input(rows: int, cols: int, dtype: torch.dtype, seed: int, contiguous: bool) -> torch.Tensor:
    """(rows, cols) whose 32-element blocks along dim 0 hold what `hadamard_input` puts in row blocks."""
    x = hadamard_input(cols, rows, dtype, seed).t()
    return x.contiguous() if contiguous else x


def small_row_tile(kernels):
    """8 rows per program: tiles of ordinary rows take the fast path, tiles with special rows the exact one."""
    return kernels.TileConfig(rows=8, col_blocks=2, num_warps=4)


def small_col_tile(kernels):
    """32 columns per program: the columns 32..39 of `column_input(.., 40, ..)` are ordinary (fast path)."""
    return kernels.TileConfig(rows=32, col_blocks=1, num_warps=4)


def case_input(kernels, axis: int, dtype: torch.dtype, seed: int, device: str):
    """A small input for `axis`, sizes not multiples of the tiles, and the tile that mixes both paths."""
    if axis == -1:
        return hadamard_input(40, 96, dtype, seed).to(device), small_row_tile(kernels)
    return column_input(64, 40, dtype, seed, contiguous=seed % 2 == 0).to(device), small_col_tile(kernels)


# ----------------------------------------------------------------------------- CPU (interpreter) / any device
# every format with floor and rceil scales, nearest-even and stochastic rounding; the input dtype alternates,
# so each (scale mode, rounding) pair meets both bfloat16 and float32 inputs across the formats
MAIN_CASES = [
    (fmt, scale_mode, rounding, (torch.bfloat16, torch.float32)[(i + j) % 2])
    for i, fmt in enumerate(FMTS)
    for j, (scale_mode, rounding) in enumerate(itertools.product(("floor", "rceil"), ("nearest_even", "stochastic")))
]


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("fmt, scale_mode, rounding, dtype", MAIN_CASES)
def test_fake_quantize_every_format_scale_rounding_axis_and_dtype(
    kernels, device, fmt, scale_mode, rounding, axis, dtype
):
    x, tile = case_input(kernels, axis, dtype, FMTS.index(fmt), device)
    check_values(
        kernels,
        x,
        fmt,
        axis=axis,
        hadamard_seed=11 + FMTS.index(fmt),
        scale_mode=scale_mode,
        rounding=rounding,
        seed=stochastic_seed(rounding),
        tile=tile,
    )


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "int8"])
@pytest.mark.parametrize(
    "scale_mode, rounding", [("ceil", "nearest_away"), ("even", "toward_zero"), ("even", "stochastic")]
)
def test_other_scale_modes_and_roundings(kernels, device, fmt, scale_mode, rounding, axis):
    x, tile = case_input(kernels, axis, torch.float32, 3, device)
    check_values(
        kernels,
        x,
        fmt,
        axis=axis,
        hadamard_seed=5,
        scale_mode=scale_mode,
        rounding=rounding,
        seed=stochastic_seed(rounding),
        tile=tile,
    )


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize(
    "fmt, rounding",
    [
        ("e4m3", "nearest_even"),
        ("e5m2", "stochastic"),
        ("e3m2", "nearest_even"),
        ("e2m3", "stochastic"),
        ("e2m1", "nearest_even"),
        ("int8", "stochastic"),
    ],
)
def test_codes_and_scales(kernels, device, fmt, rounding, axis):
    x, tile = case_input(kernels, axis, torch.bfloat16, 4, device)
    check_codes(
        kernels,
        x,
        fmt,
        axis=axis,
        hadamard_seed=6,
        scale_mode="rceil",
        rounding=rounding,
        seed=stochastic_seed(rounding),
        tile=tile,
    )


@pytest.mark.parametrize("fmt", ["e4m3", "int8"])
def test_float16_input_and_default_tiles(kernels, device, fmt):
    for axis in (-1, 0):
        x, _ = case_input(kernels, axis, torch.float16, 5, device)
        check_values(kernels, x, fmt, axis=axis, hadamard_seed=2, rounding="stochastic", seed=3)
        check_values(kernels, x, fmt, axis=axis, hadamard_seed=2, fast=False)


@pytest.mark.parametrize("shape, axis", [((45, 70), -1), ((70, 45), 0), ((5, 3, 50), 1), ((3, 20), -1)])
def test_padding_keeps_the_padded_size(kernels, device, shape, axis):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(8)) * 3).to(device)
    values = check_values(kernels, x, "e4m3", axis=axis, hadamard_seed=9, pad=True, rounding="stochastic", seed=4)
    expected_shape = list(shape)
    expected_shape[axis] = -(-shape[axis] // BLOCK) * BLOCK
    assert list(values.shape) == expected_shape
    check_codes(kernels, x, "e2m1", axis=axis, hadamard_seed=9, pad=True)
    with pytest.raises(ValueError, match="pass pad=True"):
        kernels.hadamard_fake_quantize(x, FORMATS["e4m3"], axis=axis, hadamard_seed=9)


@pytest.mark.parametrize("shape, axis", [((3, 64, 5), 1), ((2, 3, 64), -1), ((64,), 0)])
def test_batched_and_other_axes(kernels, device, shape, axis):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(10)) * 100).to(device)
    check_values(kernels, x, "e5m2", axis=axis, hadamard_seed=1, scale_mode="rceil", rounding="stochastic", seed=8)
    check_codes(kernels, x, "e3m2", axis=axis, hadamard_seed=1)


def test_specials_reach_the_whole_block(kernels, device):
    """What the transform does to special blocks, stated directly (not only through the reference)."""
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(12))
    x[0, 40] = float("nan")  # block 1 of row 0
    x[1, 70] = float("inf")  # block 2 of row 1
    x[2, :32] = -0.0
    x[3] = 0.0
    x[3, 5] = 3.0  # one nonzero: every transformed element of block 0 is +-3/sqrt(32)
    values = kernels.hadamard_fake_quantize(x.to(device), FORMATS["e4m3"], hadamard_seed=13).cpu()
    blocks_nan = values.isnan().reshape(4, 3, 32)
    assert blocks_nan[0, 1].all() and blocks_nan[1, 2].all()
    assert blocks_nan.sum() == 64  # nothing else is NaN
    assert (values[2, :32] == 0).all() and (values[3, 32:] == 0).all()
    expected = quant.fake_quantize(torch.tensor([3.0 / 32**0.5]), "e4m3", pad=True)
    assert torch.equal(values[3, :32].abs(), expected.expand(32))
    assert int((values[3, :32] < 0).sum()) == 16  # the signs of a Hadamard column (k = 5)


def test_seeds_change_the_transform_and_the_rounding(kernels, device):
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(14)).to(device)
    fmt = FORMATS["e2m1"]
    first = kernels.hadamard_fake_quantize(x, fmt, hadamard_seed=1, rounding="stochastic", seed=1)
    assert torch.equal(first, kernels.hadamard_fake_quantize(x, fmt, hadamard_seed=1, rounding="stochastic", seed=1))
    assert not torch.equal(
        first, kernels.hadamard_fake_quantize(x, fmt, hadamard_seed=2, rounding="stochastic", seed=1)
    )
    assert not torch.equal(
        first, kernels.hadamard_fake_quantize(x, fmt, hadamard_seed=1, rounding="stochastic", seed=2)
    )


def test_kernels_refuse_bad_input(kernels, device):
    x = torch.randn(4, 32, device=device)
    with pytest.raises(ValueError, match="hadamard_seed"):
        kernels.hadamard_fake_quantize(x, FORMATS["e4m3"], hadamard_seed=1.5)
    with pytest.raises(ValueError, match="seed"):
        kernels.hadamard_fake_quantize(x, FORMATS["e4m3"], hadamard_seed=1, rounding="stochastic")
    with pytest.raises(ValueError, match="scale_mode"):
        kernels.hadamard_quantize(x, FORMATS["e4m3"], hadamard_seed=1, scale_mode="round")
    assert kernels.unsupported_reason(x, 32, -1, hadamard=64) is not None
    assert kernels.unsupported_reason(x, 32, -1, hadamard=32) is None


# ------------------------------------------------------------------ mxlab.numerics.quant.hadamard_fake_quantize
def test_public_function_dispatches_to_the_kernel(kernels, device):
    x = (torch.randn(40, 64, generator=torch.Generator().manual_seed(15)) * 7).to(torch.bfloat16).to(device)
    options = dict(scale_mode="rceil", rounding="stochastic", seed=21)
    with backend("triton"):
        along_last = quant.hadamard_fake_quantize(x, "e4m3", hadamard_seed=3, **options)
        assert quant.last_backend() == "triton"
        along_first = quant.hadamard_fake_quantize(x, "e2m1", axis=0, hadamard_seed=3, pad=True)
        assert quant.last_backend() == "triton"
    assert_same_bits(along_last.cpu(), reference_values(x.cpu(), "e4m3", axis=-1, hadamard_seed=3, **options))
    assert along_first.shape == (64, 64)
    assert_same_bits(along_first.cpu(), reference_values(x.cpu(), "e2m1", axis=0, hadamard_seed=3))
    with backend("reference"):
        from_reference = quant.hadamard_fake_quantize(x, "e4m3", hadamard_seed=3, **options)
        assert quant.last_backend() == "reference"
    assert_same_bits(from_reference, along_last)


@pytest.mark.parametrize("block", [16, 64, 128])
def test_public_function_other_blocks_compose_in_pytorch(kernels, device, block):
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(16)).to(device)
    with backend("triton"):  # the transform in PyTorch, the MX cast still on the kernels
        values = quant.hadamard_fake_quantize(x, "e4m3", block=block, hadamard_seed=5, scale_mode="even")
        assert quant.last_backend() == "triton"
    with backend("reference"):
        expected = quant.fake_quantize(random_hadamard(x.cpu(), block, -1, 5), "e4m3", scale_mode="even")
    assert_same_bits(values.cpu(), expected)


def test_public_function_high_precision_formats(device):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(17)).to(device)
    values = quant.hadamard_fake_quantize(x, "bf16", hadamard_seed=4)
    assert_same_bits(values, random_hadamard(x, 32, -1, 4).to(torch.bfloat16).float())


def test_public_function_refuses_bad_options():
    x = torch.randn(4, 64)
    cases = [
        (dict(fmt="e9m9"), "e9m9.*accepted"),
        (dict(block=48), "48.*accepted: 16, 32, 64, 128, 256"),
        (dict(block=True), "True.*accepted"),
        (dict(axis=2), "axis 2 out of range"),
        (dict(hadamard_seed="1"), "hadamard_seed"),
        (dict(rounding="up"), "'up'.*accepted"),
        (dict(scale_mode="round"), "'round'.*accepted"),
        (dict(rounding="stochastic"), "needs an integer seed"),
        (dict(block=128), "size 64, not a multiple of the Hadamard block 128; pass pad=True"),
    ]
    for change, message in cases:
        options = dict(fmt="e4m3", hadamard_seed=1) | change
        with pytest.raises(ValueError, match=message):
            quant.hadamard_fake_quantize(x, options.pop("fmt"), **options)
    with pytest.raises(ValueError, match="dtype"):
        quant.hadamard_fake_quantize(x.double(), "e4m3", hadamard_seed=1)


# ----------------------------------------------------------------------------- what the GPU will run (compiled here)
COMPILE_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.vocab import Layout, kernel_code
from mxlab.kernels.cast import bits as mq, kernels, launch

def ptx(fmt, layout, hw_fp8, in_kind, rounding):
    layout = Layout(layout)
    value_pointer = "*i32" if in_kind == mq.KIND_FP32.value else "*i16"
    runtime = dict(x_ptr=value_pointer, row_codes_ptr="*u8", row_scales_ptr="*u8", row_values_ptr="*i32",
                   col_codes_ptr="*u8", col_scales_ptr="*u8", col_values_ptr="*i32", L="i32", B="i32", LP="i32",
                   BP="i32", stride_a="i32", stride_l="i32", stride_b="i32", seed_key="i32", hadamard_key="i64")
    row = layout == Layout.ROW
    constants = dict(IN_KIND=in_kind, OUT_KIND=mq.KIND_FP32.value, LAYOUT=layout.kernel_id, WANT_CODES=True,
                     WANT_VALUES=True, CODE=kernel_code(FORMATS[fmt], "rceil", rounding, hw_fp8), FAST=True,
                     WIDE_INDEX=False, HADAMARD=True,
                     RB=launch.ROW_TILE.rows if row else 1, RS=1 if row else 32,
                     CB=launch.ROW_TILE.col_blocks if row else launch.HADAMARD_COL_TILE.col_blocks)
    kernel = kernels._mx_kernel
    signature = {name: runtime.get(name, "constexpr") for name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    options = dict(num_warps=4, **launch.HADAMARD_COMPILE_OPTIONS)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]

cases = json.loads(sys.argv[1])
print(json.dumps([[line.split()[0] for line in ptx(*case).splitlines() if ".f32" in line and line.strip()[:1].isalpha()]
                  for case in cases]))
"""


def test_hadamard_kernels_compile_for_sm90_without_contraction_or_flush(kernels):
    """Compiles the Hadamard variants for sm_90 in a fresh process: the hardware FP8 conversion is there
    exactly where HW_FP8 asks for it, and float32 arithmetic is IEEE (`.rn`, so ptxas contracts no
    multiply-add; no `.ftz`) as the bit-for-bit argument needs."""
    from mxlab.kernels.cast import bits

    row, col = "row", "column"
    cases = [  # fmt, layout, HW_FP8, input kind, rounding
        ("e4m3", row, True, bits.KIND_BF16.value, "nearest_even"),
        ("e5m2", col, True, bits.KIND_FP32.value, "nearest_even"),
        ("e4m3", col, False, bits.KIND_FP16.value, "stochastic"),
    ]
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    instructions = json.loads(result.stdout.strip().splitlines()[-1])
    for (fmt, _, hw_fp8, _, _), ops in zip(cases, instructions):
        assert (HARDWARE_INSTRUCTION[fmt] in ops) == hw_fp8, (fmt, hw_fp8, sorted(set(ops)))
        arithmetic = [op for op in ops if op.split(".")[0] in ("add", "sub", "mul", "fma")]
        assert {"add.rn.f32", "sub.rn.f32", "mul.rn.f32"} <= set(arithmetic), sorted(set(ops))
        assert all(op.endswith(".rn.f32") for op in arithmetic), sorted(set(arithmetic))
        assert not any(".ftz" in op for op in ops)


# ----------------------------------------------------------------------------- GPU: millions of elements
def large_input(axis: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """About 4M elements on CUDA with NaN, Inf, zeros, subnormals, beyond-max values and tiny rows; sizes off
    every tile; the axis-0 input is a non-contiguous slice."""
    if axis == -1:
        return big_input(3001, 1376, dtype, seed)  # 43 blocks of 32 per row
    return big_input(2016, 2050, dtype, seed)[:, 1:2049]  # 63 blocks of 32 per column, row stride 2050


GPU_CASES = (
    [(fmt, "floor", "nearest_even", torch.bfloat16) for fmt in FMTS]
    + [(fmt, "rceil", "stochastic", torch.bfloat16) for fmt in FMTS]
    + [("e4m3", "even", "nearest_away", torch.float32), ("int8", "ceil", "toward_zero", torch.float16)]
    + [(fmt, "rceil", "nearest_even", dtype) for fmt in ("e4m3", "e2m1") for dtype in (torch.float32, torch.float16)]
)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("fmt, scale_mode, rounding, dtype", GPU_CASES)
def test_gpu_large_against_reference(kernels, fmt, scale_mode, rounding, dtype, axis):
    x = large_input(axis, dtype, seed=FMTS.index(fmt))
    options = dict(
        axis=axis, hadamard_seed=2**40 + 3, scale_mode=scale_mode, rounding=rounding, seed=stochastic_seed(rounding)
    )
    check_values(kernels, x, fmt, **options)
    check_codes(kernels, x, fmt, **options)


def equal_magnitude_blocks(blocks: int, fmt: str, seed: int) -> torch.Tensor:
    """float32 (blocks * 32,) whose random Hadamard transform (seed 1) has, in each block, 32 elements of one
    magnitude y: one nonzero element v per block with float32(v * float32(1/sqrt(32))) == y where some v
    does it. The y are values of the format's top binade and the ties between them, and values between the
    max normal and 2^(emax + 1), times 2^S for S in the fast path's range: round-to-nearest-even ties and
    saturation of the hardware FP8 conversion after the transform."""
    from tests.kernels.cast.test_hardware_fp8 import adversarial_magnitudes

    g = torch.Generator().manual_seed(seed)
    top = adversarial_magnitudes(fmt)[1]
    targets = top[torch.randint(0, top.numel(), (blocks,), generator=g)]
    targets = (targets * torch.exp2(torch.randint(-60, 60, (blocks,), generator=g).double())).float()
    norm = torch.tensor(1 / 32**0.5, dtype=torch.float32)
    first = (targets.double() * 32**0.5).float()
    candidates = torch.stack([first.view(torch.int32) + step for step in (0, 1, -1, 2, -2)]).view(torch.float32)
    hits = (candidates * norm) == targets
    choice = torch.where(hits.any(0), hits.int().argmax(0), 0)
    v = candidates.gather(0, choice[None])[0]
    v = v * torch.where(torch.rand(blocks, generator=g) < 0.5, -1.0, 1.0)
    x = torch.zeros(blocks, 32)
    x[torch.arange(blocks), torch.randint(0, 32, (blocks,), generator=g)] = v
    return x.reshape(-1)


def test_equal_magnitude_blocks_have_what_they_promise():
    x = equal_magnitude_blocks(4096, "e4m3", seed=1).reshape(-1, 32)
    y = random_hadamard(x, 32, -1, 1).abs()
    assert (y == y[:, :1]).all()  # one magnitude per block
    from tests.kernels.cast.test_hardware_fp8 import adversarial_magnitudes

    top = adversarial_magnitudes("e4m3")[1]
    mantissas = torch.frexp(y[:, 0].double())[0] * 2 * 2.0 ** FORMATS["e4m3"].emax
    on_targets = torch.isin(mantissas, top).float().mean()
    assert on_targets > 0.5, on_targets  # most blocks hit their exact target magnitude (ties among them)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_hardware_fp8_path(kernels, fmt, axis):
    from mxlab.kernels.cast import CastLaunch, launch

    capable = torch.cuda.get_device_capability() >= launch.HARDWARE_FP8_MIN_CAPABILITY
    adversarial = equal_magnitude_blocks(2**16, fmt, seed=FMTS.index(fmt)).reshape(2048, 1024)
    ordinary = big_input(2048, 1024, torch.float32, seed=3).cpu()
    x = torch.cat([adversarial, ordinary]).cuda()  # 4M elements
    x = x if axis == -1 else x.reshape(1024, 4096).t()  # axis 0: the equal-magnitude blocks run down columns
    options = dict(axis=axis, hadamard_seed=1)
    hardware = check_values(kernels, x, fmt, **options)
    integer = kernels.hadamard_fake_quantize(x, FORMATS[fmt], _launch=CastLaunch(hw_fp8=False), **options)
    assert_same_bits(hardware, integer, "hardware vs integer fast path")
    check_codes(kernels, x, fmt, **options)
    view = launch._make_view(x, 32, axis, False)
    out = launch.launch_cast(
        view, FORMATS[fmt], "floor", "nearest_even", None, want_codes=True, want_values=True, hadamard_seed=1
    )
    assert (HARDWARE_INSTRUCTION[fmt] in out["kernel"].asm["ptx"]) == capable


@pytest.mark.gpu
def test_gpu_dispatch_and_padding():
    x = big_input(1000, 1000, torch.bfloat16, seed=11)  # neither dim a multiple of 32
    with backend(None):
        along_first = quant.hadamard_fake_quantize(x, "e4m3", axis=0, hadamard_seed=7, pad=True, scale_mode="rceil")
        assert quant.last_backend() == "triton"
        along_last = quant.hadamard_fake_quantize(x, "e4m3", hadamard_seed=7, pad=True, rounding="stochastic", seed=1)
        assert quant.last_backend() == "triton"
    assert along_first.shape == (1024, 1000) and along_last.shape == (1000, 1024)
    assert_same_bits(along_first, reference_values(x, "e4m3", axis=0, hadamard_seed=7, scale_mode="rceil"))
    assert_same_bits(along_last, reference_values(x, "e4m3", axis=-1, hadamard_seed=7, rounding="stochastic", seed=1))
