"""The hardware FP8 conversion path of the MX cast kernels (e4m3/e5m2, nearest even, sm_90+).

On the CPU: which calls take the path, what its Triton code compiles to for sm_90 (a compile without
a GPU), a PyTorch model of its arithmetic against the reference, and hand-checked codes on the
integer path. With `-m gpu`: the path itself against the reference and the integer fast path, bit for
bit, on adversarial inputs for every layout and input dtype, and a check that a capable GPU runs it.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from mxlab.numerics.formats import FORMATS, decode_code
from tests.kernels.cast.test_casts import (
    assert_same_bits,
    numerics_only,
    reference_fake_quantize,
    reference_quantize,
    with_launch,
)

FP8_FORMATS = ["e4m3", "e5m2"]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
LAYOUTS = ["row", "column", "both", "tile"]
HARDWARE_INSTRUCTION = {"e4m3": "cvt.rn.satfinite.e4m3x2.f32", "e5m2": "cvt.rn.satfinite.e5m2x2.f32"}
BITS_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def fast_scale_range(fmt_name: str) -> tuple[int, int]:
    """The scale exponents S for which `_fast_path_ok` holds (inclusive)."""
    fmt = FORMATS[fmt_name]
    return -125 - fmt.emin + fmt.mbits, min(126 - fmt.emax, 104 - fmt.emin + fmt.mbits)


# ----------------------------------------------------------------------------- adversarial inputs
def adversarial_magnitudes(fmt_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(all, top binade) magnitudes in element units (float64): every finite value of the format, every
    midpoint between neighbours (ties, including the one above the max normal), values between the max
    normal and 2^(emax + 1), and fractions of the smallest subnormal (below half: rounds to zero)."""
    fmt = FORMATS[fmt_name]
    grid = torch.tensor([decode_code(fmt, code) for code in range(fmt.max_code + 1)], dtype=torch.float64)
    top = 2.0 ** (fmt.emax + 1)
    extended = torch.cat([grid, torch.tensor([fmt.max_normal + 2.0 ** (fmt.emax - fmt.mbits)], dtype=torch.float64)])
    midpoints = (extended[1:] + extended[:-1]) / 2
    beyond_max = fmt.max_normal + (top - fmt.max_normal) * torch.arange(1, 8, dtype=torch.float64) / 8
    tiny = fmt.min_subnormal * torch.tensor([0.25, 0.375, 0.625, 0.75, 2.0**-20], dtype=torch.float64)
    magnitudes = torch.unique(torch.cat([grid, midpoints[midpoints < top], beyond_max, tiny]))
    return magnitudes, magnitudes[magnitudes >= 2.0**fmt.emax]


def scale_exponent_range(fmt_name: str, dtype: torch.dtype) -> tuple[int, int]:
    """Scale exponents whose blocks the input dtype represents well (the fast-path range, or narrower)."""
    fmt = FORMATS[fmt_name]
    low, high = fast_scale_range(fmt_name)
    if dtype == torch.float16:  # values up to 2^(S + emax + 1) <= 2^15, the smallest tie above 2^-24
        return max(-24 - (fmt.emin - fmt.mbits - 1), -10), 14 - fmt.emax
    return low, high


def adversarial_input(rows: int, cols: int, fmt_name: str, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A (rows, cols) tensor of `dtype` on the CPU whose every row block, column block and (32, 32) tile
    has the scale of its tile: each 32 x 32 tile draws one S, its diagonal holds magnitudes of the top
    binade (times 2^S) and the rest adversarial magnitudes (ties, values past the max normal, FP8
    subnormals and values rounding to zero) with random signs, about a third of them moved by one
    unit in the last place of `dtype`. Some tiles hold a NaN, an Inf, only zeros (either sign), or dtype
    subnormals at the lowest fast-path scale; for float32/bfloat16 the last 32 rows use scales outside
    the fast path (the integer path), so one launch mixes both paths."""
    g = torch.Generator().manual_seed(seed)
    magnitudes, top_binade = adversarial_magnitudes(fmt_name)
    pick = magnitudes[torch.randint(0, magnitudes.numel(), (rows, cols), generator=g)]
    diagonal = (torch.arange(rows)[:, None] % 32) == (torch.arange(cols)[None, :] % 32)
    pick[diagonal] = top_binade[torch.randint(0, top_binade.numel(), (int(diagonal.sum()),), generator=g)]
    signs = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0).double()
    low, high = scale_exponent_range(fmt_name, dtype)
    tile_rows, tile_cols = -(-rows // 32), -(-cols // 32)
    scales = torch.randint(low, high + 1, (tile_rows, tile_cols), generator=g)
    if dtype != torch.float16 and rows > 64:  # last band: scales outside the fast path, both ends
        fast_low, fast_high = fast_scale_range(fmt_name)
        outside = torch.tensor([fast_low - 1, fast_low - 3, fast_low - 9, fast_high + 1, fast_high + 4])
        outside = outside[outside + FORMATS[fmt_name].emax <= 126]  # keep 2^(S + emax + 1) finite
        scales[-1] = outside[torch.randint(0, outside.numel(), (tile_cols,), generator=g)]
    element_scales = scales.repeat_interleave(32, 0).repeat_interleave(32, 1)[:rows, :cols]
    x = torch.ldexp(signs * pick, element_scales.double()).to(dtype)

    bits = x.view(BITS_DTYPES[dtype])
    step = torch.randint(-1, 2, (rows, cols), generator=g).to(bits.dtype)
    movable = (~diagonal) & (bits & torch.iinfo(bits.dtype).max != 0) & (torch.rand(rows, cols, generator=g) < 0.5)
    bits[movable] += step[movable]  # one ulp up or down in magnitude (sign-magnitude patterns)

    kind = torch.randint(0, 25, (tile_rows, tile_cols), generator=g)
    for tile_row, tile_col in (kind == 0).nonzero().tolist():  # a NaN somewhere in the tile
        row = tile_row * 32 + int(torch.randint(0, min(32, rows - tile_row * 32), (1,), generator=g))
        col = tile_col * 32 + int(torch.randint(0, min(32, cols - tile_col * 32), (1,), generator=g))
        x[row, col] = float("nan")
    for tile_row, tile_col in (kind == 1).nonzero().tolist():  # an Inf of either sign
        x[tile_row * 32, min(cols - 1, tile_col * 32 + 5)] = (
            float("inf") if (tile_row + tile_col) % 2 else -float("inf")
        )
    zero_tiles = (kind == 2).repeat_interleave(32, 0).repeat_interleave(32, 1)[:rows, :cols]
    x[zero_tiles] = torch.where(signs[zero_tiles] < 0, -0.0, 0.0).to(dtype)
    subnormal_tiles = (kind == 3).repeat_interleave(32, 0).repeat_interleave(32, 1)[:rows, :cols]
    if dtype != torch.float16:  # float32/bfloat16 subnormals are float32 subnormals; S at the fast path's floor
        fast_low = fast_scale_range(fmt_name)[0]
        anchor = torch.ldexp(signs * pick, torch.full_like(pick, float(fast_low))).to(dtype)
        x[subnormal_tiles] = anchor[subnormal_tiles]
    subnormal_bits = torch.randint(
        1, 1 << (23 if dtype == torch.float32 else 7 if dtype == torch.bfloat16 else 10), (rows, cols), generator=g
    ).to(bits.dtype)
    subnormal_bits = torch.where(signs < 0, subnormal_bits | torch.iinfo(bits.dtype).min, subnormal_bits)
    sprinkle = subnormal_tiles & ~diagonal & (torch.rand(rows, cols, generator=g) < 0.3)
    bits[sprinkle] = subnormal_bits[sprinkle]
    return x


def test_adversarial_input_has_what_it_promises():
    x = adversarial_input(256, 256, "e4m3", torch.bfloat16, seed=0)
    magnitudes, _ = adversarial_magnitudes("e4m3")
    assert (
        464.0 in magnitudes.tolist() and 2.0**-10 in magnitudes.tolist()
    )  # tie past the max, half the smallest subnormal
    assert x.isnan().any() and x.isinf().any()
    assert ((x == 0) & torch.signbit(x)).any()
    bits = x.view(torch.int16) & 0x7FFF
    assert ((bits > 0) & (bits < 0x80)).any()  # bfloat16 (float32) subnormals
    codes, scales = reference_quantize(x, "e4m3", axis=-1)
    finite_scales = scales[(scales != 0xFF) & (scales != 0)].long() - 127  # not NaN/Inf, not all-zero
    low, high = fast_scale_range("e4m3")
    assert ((finite_scales >= low) & (finite_scales <= high)).float().mean() > 0.8
    assert ((finite_scales < low) | (finite_scales > high)).any()  # the integer path gets work too
    assert (codes == 0x80).any() and (codes == 0x7E).any() and (codes == 0xFE).any()


# ----------------------------------------------------------------------------- which calls take the path
def test_hardware_fp8_applies_only_to_fp8_nearest_even_on_sm90(kernel_module, monkeypatch):
    kernels = kernel_module
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    capability = {"value": (9, 0)}
    from mxlab.kernels.cast import launch

    monkeypatch.setattr(launch, "_cuda_capability", lambda index: capability["value"])
    cuda = torch.device("cuda", 0)
    for fmt in FP8_FORMATS:
        assert kernels.hardware_fp8_applies(cuda, FORMATS[fmt], "nearest_even")
        for rounding in ("nearest_away", "toward_zero", "stochastic"):
            assert not kernels.hardware_fp8_applies(cuda, FORMATS[fmt], rounding)
        assert not kernels.hardware_fp8_applies(torch.device("cpu"), FORMATS[fmt], "nearest_even")
    for fmt in ("e3m2", "e2m3", "e2m1", "int8"):
        assert not kernels.hardware_fp8_applies(cuda, FORMATS[fmt], "nearest_even")
    capability["value"] = (10, 0)
    assert kernels.hardware_fp8_applies(cuda, FORMATS["e5m2"], "nearest_even")
    capability["value"] = (8, 9)  # Triton 3.6 rounds twice there (float32 -> fp16 toward zero -> FP8)
    assert not kernels.hardware_fp8_applies(cuda, FORMATS["e4m3"], "nearest_even")
    capability["value"] = (9, 0)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not kernels.hardware_fp8_applies(cuda, FORMATS["e4m3"], "nearest_even")


COMPILE_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.vocab import Layout, Rounding, ScaleMode, format_code, pack_code
from mxlab.kernels.cast import bits, kernels, launch

def ptx(fmt, layout, hw_fp8, want_codes, want_values, in_kind, rounding):
    layout, rounding = Layout(layout), Rounding(rounding)
    kernel = kernels._mx_kernel
    if layout in (Layout.COLUMN, Layout.BOTH):
        kernel = kernels._mx_column_tile_kernel
    value_pointer = "*i32" if in_kind == bits.KIND_FP32.value else "*i16"
    runtime = dict(x_ptr=value_pointer, row_codes_ptr="*u8", row_scales_ptr="*u8", row_values_ptr=value_pointer,
                   col_codes_ptr="*u8", col_scales_ptr="*u8", col_values_ptr=value_pointer, L="i32", B="i32",
                   LP="i32", BP="i32", stride_a="i32", stride_l="i32", stride_b="i32", seed_key="i32")
    # packed by hand: kernel_code's callers never set hw_fp8 with stochastic rounding, which one case checks
    code = format_code(FORMATS[fmt]) | pack_code(
        scale_mode=ScaleMode.FLOOR.kernel_id, rounding=rounding.kernel_id, hw_fp8=hw_fp8
    )
    constants = dict(IN_KIND=in_kind, OUT_KIND=in_kind, LAYOUT=layout.kernel_id, WANT_CODES=want_codes,
                     WANT_VALUES=want_values, CODE=code, FAST=True, WIDE_INDEX=False, CB=4)
    if kernel is kernels._mx_kernel:
        constants.update(RB=8 if layout == Layout.ROW else 1, RS=1 if layout == Layout.ROW else 32)
    signature = {name: runtime.get(name, "constexpr") for name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]

cases = json.loads(sys.argv[1])
print(json.dumps([sorted({line.split()[0] for line in ptx(*case).splitlines() if line.strip().startswith("cvt.")})
                  for case in cases]))
"""


def test_hardware_branch_compiles_to_the_fp8_conversion_for_sm90(kernel_module):
    """Compiles the kernels for sm_90 in a fresh process (this one may hold interpreted kernels)."""
    from mxlab.kernels.cast import bits

    row, col, both, tile = "row", "column", "both", "tile"
    bf16, fp16, fp32 = bits.KIND_BF16.value, bits.KIND_FP16.value, bits.KIND_FP32.value
    nearest_even, stochastic = "nearest_even", "stochastic"
    cases = [  # fmt, layout, HW_FP8, codes, values, input kind, rounding
        ("e4m3", row, True, True, False, bf16, nearest_even),
        ("e4m3", row, False, True, False, bf16, nearest_even),
        ("e5m2", col, True, False, True, fp32, nearest_even),
        ("e4m3", both, True, True, False, fp16, nearest_even),
        ("e5m2", tile, True, True, True, bf16, nearest_even),
        ("e4m3", row, True, False, True, bf16, stochastic),  # the switch does not touch stochastic rounding
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
    conversions = json.loads(result.stdout.strip().splitlines()[-1])
    for (fmt, layout, hw_fp8, _, _, _, rounding), instructions in zip(cases, conversions):
        expected = hw_fp8 and rounding == nearest_even
        assert (HARDWARE_INSTRUCTION[fmt] in instructions) == expected, (fmt, layout, hw_fp8, instructions)
        assert "cvt.rz.f16.f32" not in instructions  # no float32 -> fp16 -> FP8 double rounding


# ----------------------------------------------------------------------------- the arithmetic, modelled on the CPU
def expand_blocks(per_block: torch.Tensor, block: int | tuple[int, int], axis: int) -> torch.Tensor:
    """Per-block tensor (shape as the scale bytes) repeated to the elements of a 2-D x without padding."""
    if block == (32, 32):
        return per_block.repeat_interleave(32, 0).repeat_interleave(32, 1)
    return per_block.repeat_interleave(32, axis)


def hardware_path_model(
    x: torch.Tensor, fmt_name: str, block, axis: int, finite_tile: bool = False, scale_mode: str = "floor"
):
    """(codes, values, fast) of the hardware path in PyTorch: scale bytes from the reference, then
    float32(x) * 2^-S, clamp to the max normal (satfinite), torch's nearest-even FP8 conversion, and
    float32(fp8) * 2^S (2^-127: the float32 subnormal); `fast` marks the elements whose blocks take the fast path
    in the cast kernels (the attention's tiles take it everywhere).
    `finite_tile`: the kernels' variant for tiles without NaN/Inf blocks (`_hw_fp8_finite_elements`): no
    select per element, and all-zero blocks keep their clamped S = -127 (2^-S = 2^127, 2^S given by the
    float32 bits 0, that is +0.0)."""
    fmt = FORMATS[fmt_name]
    fp8_dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt_name]
    _, scale_bytes = reference_quantize(x, fmt_name, block=block, axis=axis, scale_mode=scale_mode)
    special = expand_blocks(scale_bytes == 0xFF, block, axis)
    scale = expand_blocks(scale_bytes.to(torch.int32) - 127, block, axis)
    magnitude, (rows, cols) = x.float().abs(), x.shape
    if block == (32, 32):
        amax = magnitude.reshape(rows // 32, 32, cols // 32, 32).amax(dim=(1, 3))
    elif axis == 0:
        amax = magnitude.reshape(rows // 32, 32, cols).amax(dim=1)
    else:
        amax = magnitude.reshape(rows, cols // 32, 32).amax(dim=2)
    inert = special | expand_blocks(amax == 0, block, axis)
    lowest_quantum = scale + fmt.emin - fmt.mbits
    fast = inert | ((lowest_quantum >= -125) & (lowest_quantum <= 104) & (scale + fmt.emax <= 126))
    if finite_tile:
        fast &= ~special
    else:
        scale = torch.where(inert, 0, scale)
    scaled = x.float() * ((127 - scale) << 23).view(torch.float32)
    element = scaled.clamp(-fmt.max_normal, fmt.max_normal).to(fp8_dtype)
    if finite_tile:
        codes = element.view(torch.uint8)
        return codes, (element.float() * ((127 + scale) << 23).view(torch.float32)).to(x.dtype), fast
    codes = torch.where(special, 0, element.view(torch.uint8).to(torch.int32)).to(torch.uint8)
    power = torch.where(scale > -127, (127 + scale) << 23, 1 << 22)  # 2^S; 2^-127 is a float32 subnormal
    values = element.float() * power.view(torch.float32)
    return codes, torch.where(special, float("nan"), values).to(x.dtype), fast


@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block, axis", [(32, -1), (32, 0), ((32, 32), -1)])
def test_model_of_the_hardware_path_equals_the_reference(fmt, dtype, block, axis):
    """The argument of the kernels' docstring, checked on the CPU: on fast-path blocks, scaling by 2^-S in
    float32 and a saturating nearest-even FP8 conversion give the reference's codes and values."""
    x = adversarial_input(256, 256, fmt, dtype, seed=DTYPES.index(dtype) * 10 + FP8_FORMATS.index(fmt))
    codes, values, fast = hardware_path_model(x, fmt, block, axis)
    expected_codes, _ = reference_quantize(x, fmt, block=block, axis=axis)
    expected_values = reference_fake_quantize(x, fmt, block=block, axis=axis)
    assert fast.float().mean() > 0.8
    assert_same_bits(codes[fast], expected_codes[fast], "codes")
    assert_same_bits(values[fast], expected_values[fast], "values")


@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block, axis", [(32, -1), (32, 0)])
def test_model_of_the_finite_tile_hardware_path_equals_the_reference(fmt, dtype, block, axis):
    """The variant for tiles without NaN/Inf blocks: no per-element select, all-zero blocks (signed zeros
    included) run with their own S = -127, and values are rounded to the input dtype by a plain conversion."""
    x = adversarial_input(256, 256, fmt, dtype, seed=DTYPES.index(dtype) * 10 + FP8_FORMATS.index(fmt) + 100)
    x[32:64, 64:96] = torch.where(torch.arange(32)[:, None] % 3 == torch.arange(32)[None, :] % 2, -0.0, 0.0)
    codes, values, fast = hardware_path_model(x, fmt, block, axis, finite_tile=True)
    expected_codes, expected_scales = reference_quantize(x, fmt, block=block, axis=axis)
    expected_values = reference_fake_quantize(x, fmt, block=block, axis=axis)
    zero_blocks = fast & expand_blocks(expected_scales == 0, block, axis) & (x == 0)
    assert zero_blocks.any() and (x[zero_blocks].view(BITS_DTYPES[dtype]) < 0).any()  # -0.0 among them
    assert fast.float().mean() > 0.8
    assert_same_bits(codes[fast], expected_codes[fast], "codes")
    assert_same_bits(values[fast], expected_values[fast], "values")


@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("axis", [-1, 0])
def test_model_of_the_hardware_path_equals_the_reference_at_every_scale(fmt, axis):
    """The attention's variant (float32 register tiles, `_mx_device._fake_quant_blocks`): every block takes the
    hardware path, with 2^-127 as a float32-subnormal factor; blocks outside the cast kernels' fast range (tiny
    scales, float32-subnormal inputs and results, rceil blocks whose values overflow to infinity) included."""
    x = adversarial_input(256, 256, fmt, torch.float32, seed=FP8_FORMATS.index(fmt) + 200)
    tiny = torch.randint(-150, -100, (8, 1)).repeat_interleave(32, 0).float()  # one per 32 x 32 tile: both axes
    x[:, :32] = torch.randn(256, 32) * torch.exp2(tiny)
    x[:32, 32:64] = 3.3e38 * torch.rand(32, 32) ** 2
    x[0, 32] = 3.3e38  # rceil: rounds to 2^8 (e4m3) or 2^15 (e5m2) times 2^S = 2^128, infinite
    for scale_mode in ("floor", "rceil"):
        _, scale_bytes = reference_quantize(x, fmt, block=32, axis=axis, scale_mode=scale_mode)
        _, values, fast = hardware_path_model(x, fmt, 32, axis, scale_mode=scale_mode)
        expected = reference_fake_quantize(x, fmt, block=32, axis=axis, scale_mode=scale_mode)
        slow = ~fast
        lowest = expand_blocks(scale_bytes == 0, 32, axis) & (expected != 0)  # S = -127 blocks with nonzero values
        assert slow.sum() > 1000 and lowest.any()
        assert (expected[slow] != 0).any() and (expected.abs() < 2.0**-126).logical_and(expected != 0).any()
        assert expected.isinf().any() == (scale_mode == "rceil")
        assert_same_bits(values, expected, "values")


# ----------------------------------------------------------------------------- hand-checked codes, any path
# (fmt, value, code) with S = 0: every block below holds one value of the format's top binade
HAND_CHECKED = {
    "e4m3": [
        (448.0, 0x7E),
        (464.0, 0x7E),
        (465.0, 0x7E),
        (511.0, 0x7E),
        (440.0, 0x7E),
        (424.0, 0x7D),
        (432.0, 0x7E),
        (400.0, 0x7C),  # ties 416|448 -> 448 and 384|416 -> 384 (even mantissas)
        (2.0**-10, 0x00),
        (2.0**-10 * (1 + 2.0**-20), 0x01),
        (3 * 2.0**-10, 0x02),
        (5 * 2.0**-10, 0x02),
        (15 * 2.0**-10, 0x08),
        (2.0**-6, 0x08),
        (-(2.0**-11), 0x80),
        (-0.0, 0x80),
        (0.0, 0x00),
        (-(2.0**-200), 0x80),
        (1e-45, 0x00),
        (-1e-45, 0x80),
        (-448.0, 0xFE),
        (-500.0, 0xFE),
        (1.0625, 0x38),
        (1.0625 + 2.0**-20, 0x39),
    ],
    "e5m2": [
        (57344.0, 0x7B),
        (61440.0, 0x7B),
        (61439.0, 0x7B),
        (65000.0, 0x7B),
        (-60000.0, 0xFB),
        (2.0**-17, 0x00),
        (-(2.0**-17), 0x80),
        (3 * 2.0**-17, 0x02),
        (2.0**-17 * (1 + 2.0**-20), 0x01),
        (2.0**-14, 0x04),
        (1.125, 0x3C),
        (1.375, 0x3E),
        (-0.0, 0x80),
        (-1e-45, 0x80),
        (0.0, 0x00),
    ],
}


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_hand_checked_codes_ties_saturation_and_signed_zeros(kernels, device, fmt):
    """On a GPU this runs the hardware path (float32 input, S = 0, every block on the fast path);
    on the CPU the integer path under the interpreter."""
    cases = HAND_CHECKED[fmt]
    top = 2.0 ** FORMATS[fmt].emax
    x = torch.zeros(len(cases), 32, dtype=torch.float32)
    x[:, 0] = top  # S = 0 for every row block
    x[:, 1] = torch.tensor([value for value, _ in cases], dtype=torch.float64).float()
    expected = torch.tensor([code for _, code in cases], dtype=torch.uint8)
    codes, scales = kernels.quantize(x.to(device), FORMATS[fmt])
    values = kernels.fake_quantize(x.to(device), FORMATS[fmt])
    assert torch.equal(scales.cpu(), torch.full((len(cases), 1), 127, dtype=torch.uint8))
    assert torch.equal(codes[:, 1].cpu(), expected), [(v, hex(c)) for (v, _), c in zip(cases, codes[:, 1].tolist())]
    expected_values = torch.tensor([decode_code(FORMATS[fmt], code) for _, code in cases], dtype=torch.float32)
    assert torch.equal(values[:, 1].cpu(), expected_values)
    assert torch.equal(torch.signbit(values[:, 1].cpu()), expected >= 0x80)  # -0.0 where the code is 0x80
    assert torch.equal(reference_quantize(x, fmt)[0][:, 1], expected)


# ----------------------------------------------------------------------------- GPU: the hardware path itself
def layout_call(kernels, x: torch.Tensor, fmt: str, layout: str, want: str, **options):
    """The kernels' results for one layout, as a tuple of tensors (codes and scales, or values)."""
    element_format = FORMATS[fmt]
    options = with_launch(options)
    if layout == "both":
        if want == "codes":
            (row_codes, row_scales), (col_codes, col_scales) = kernels.quantize_rowcol(x, element_format, **options)
            return row_codes, row_scales, col_codes, col_scales
        return kernels.fake_quantize_rowcol(x, element_format, **options)
    where = dict(row=dict(axis=-1), column=dict(axis=0), tile=dict(block=(32, 32)))[layout]
    if want == "codes":
        return kernels.quantize(x, element_format, **where, **options)
    return (kernels.fake_quantize(x, element_format, **where, **options),)


def reference_call(x: torch.Tensor, fmt: str, layout: str, want: str, **options):
    options = numerics_only(options)
    where = dict(
        row=[dict(axis=-1)], column=[dict(axis=0)], tile=[dict(block=(32, 32))], both=[dict(axis=-1), dict(axis=0)]
    )[layout]
    if want == "codes":
        return tuple(part for extra in where for part in reference_quantize(x, fmt, **extra, **options))
    return tuple(reference_fake_quantize(x, fmt, **extra, **options) for extra in where)


def check_against_reference_and_integer_path(kernels, x: torch.Tensor, fmt: str, layout: str, **options) -> None:
    for want in ("codes", "values"):
        hardware = layout_call(kernels, x, fmt, layout, want, **options)
        integer = layout_call(kernels, x, fmt, layout, want, hw_fp8=False, **options)
        expected = reference_call(x, fmt, layout, want, **numerics_only(options))
        for index, (actual, from_integer, from_reference) in enumerate(zip(hardware, integer, expected)):
            assert_same_bits(actual, from_reference, f"{fmt} {layout} {want}[{index}] vs reference")
            assert_same_bits(actual, from_integer, f"{fmt} {layout} {want}[{index}] vs integer fast path")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_capable_device_runs_the_hardware_conversion(kernels, fmt, layout):
    from mxlab.kernels.cast import CastLaunch, launch
    from mxlab.numerics.vocab import Layout

    capable = torch.cuda.get_device_capability() >= launch.HARDWARE_FP8_MIN_CAPABILITY
    x = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    assert kernels.hardware_fp8_applies(x.device, FORMATS[fmt], "nearest_even") == capable
    if not capable:
        pytest.skip(f"compute capability {torch.cuda.get_device_capability()} < 9.0: the integer path runs")
    view_arguments = dict(
        row=(32, -1, None), column=(32, 0, None), both=(32, 0, Layout.BOTH), tile=((32, 32), -1, None)
    )[layout]
    block, axis, forced_layout = view_arguments
    view = launch._make_view(x, block, axis, False, layout=forced_layout)
    for rounding, hw_fp8, expected in (
        ("nearest_even", True, True),
        ("nearest_even", False, False),
        ("stochastic", True, False),
    ):
        out = launch.launch_cast(
            view,
            FORMATS[fmt],
            "floor",
            rounding,
            5,
            want_codes=True,
            want_values=True,
            options=CastLaunch(hw_fp8=hw_fp8),
        )
        ptx = out["kernel"].asm["ptx"]
        assert (HARDWARE_INSTRUCTION[fmt] in ptx) == expected, (rounding, hw_fp8)
        assert "cvt.rz.f16.f32" not in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_hardware_path_bit_identical_on_adversarial_input(kernels, fmt, dtype, layout):
    seed = 100 + 10 * DTYPES.index(dtype) + FP8_FORMATS.index(fmt)
    x = adversarial_input(2048, 1536, fmt, dtype, seed).cuda()  # 3.1M elements
    check_against_reference_and_integer_path(kernels, x, fmt, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_hardware_path_padded_and_non_contiguous(kernels, fmt, layout):
    padded = adversarial_input(1000, 1000, fmt, torch.bfloat16, seed=7).cuda()  # no dim a multiple of 32
    check_against_reference_and_integer_path(kernels, padded, fmt, layout, pad=True)
    wide = adversarial_input(1024, 2080, fmt, torch.float32, seed=8).cuda()
    check_against_reference_and_integer_path(kernels, wide[:, 16:2064], fmt, layout)  # row stride 2080
    check_against_reference_and_integer_path(kernels, wide[:, :1024].t(), fmt, layout)  # column-major


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("scale_mode", ["ceil", "rceil", "even"])
def test_gpu_hardware_path_other_scale_modes(kernels, fmt, scale_mode):
    x = adversarial_input(1024, 1024, fmt, torch.bfloat16, seed=9).cuda()
    check_against_reference_and_integer_path(kernels, x, fmt, "row", scale_mode=scale_mode)
    check_against_reference_and_integer_path(kernels, x, fmt, "both", scale_mode=scale_mode)
