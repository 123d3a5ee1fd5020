"""The reference's internal formulations agree with each other and with plain Python."""

import pytest
import torch

from mxlab.numerics import reference
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.quant import dequantize, fake_quantize, quantize

_MASK = 0xFFFFFFFF


def _python_mix(z: int) -> int:
    z ^= z >> 16
    z = (z * 0x7FEB352D) & _MASK
    z ^= z >> 15
    z = (z * 0x846CA68B) & _MASK
    return z ^ (z >> 16)


def test_random_bits_match_the_documented_mixer_in_plain_python():
    indices = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 77, 10**12]
    for seed in (0, 1, 7, 2**31 + 9, 2**32 + 3):
        key = _python_mix(seed & _MASK)
        expected = [_python_mix(_python_mix((i & _MASK) ^ key) ^ (i >> 32)) >> 8 for i in indices]
        assert reference.random_bits24(torch.tensor(indices), seed).tolist() == expected


def test_random_bits_look_uniform():
    bits = reference.random_bits24(torch.arange(200_000), seed=11).double()
    assert abs(bits.mean().item() / 2**24 - 0.5) < 0.005
    assert bits.unique().numel() > 198_000  # about 1,200 birthday collisions are expected among 2^24 values


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("scale_mode", ["floor", "ceil", "rceil", "even"])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_fast_float32_path_equals_exact_path(fmt, scale_mode, rounding):
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3000, 32, generator=generator) * torch.exp2(
        torch.randint(-140, 120, (3000, 1), generator=generator).float()
    )
    x[::7, 3] = 0.0
    x[::5, 4] = -0.0
    x[::11] = torch.randn(32, generator=generator) * 2.0**-135
    x[::13] = 0.0  # all-zero blocks: the float32 path is exact for them at any scale
    x[1::13] = -0.0
    element_format = FORMATS[fmt]
    scale_exp, nonfinite = reference._block_scales(x, (1,), element_format, scale_mode)
    bits = reference.random_bits24(torch.arange(x.numel()).view(x.shape), seed=9)
    exact = reference._fake_quantize_exact(x, scale_exp, element_format, rounding, bits)
    zero_block = (x == 0).all(dim=1)
    guard = ((scale_exp + element_format.emin >= -127) & (scale_exp + element_format.emax <= 100)).squeeze(
        1
    ) | zero_block
    assert guard.sum() > 1000 and (~guard).sum() > 100  # both sides of the guard are exercised
    inside = x[guard]
    fast = reference._fake_quantize_fp32(
        inside, inside.abs(), scale_exp[guard], element_format, rounding, bits[guard], saturates=True
    )
    assert torch.equal(fast, exact[guard]) and torch.equal(torch.signbit(fast), torch.signbit(exact[guard]))
    # and the public path (which picks per tensor) equals dequantize(quantize(.)) everywhere
    options = dict(scale_mode=scale_mode, rounding=rounding, seed=9)
    assert torch.equal(fake_quantize(x, fmt, **options), dequantize(quantize(x, fmt, **options)))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("scale_mode", ["floor", "ceil", "rceil", "even"])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_fast_path_clamps_exactly_when_a_block_saturates(fmt, scale_mode, rounding):
    """Within the guard (the fast path for the whole tensor), blocks whose amax lies just below the next power
    of two (saturating under floor and even scales) and blocks that cannot saturate: fake_quantize, which skips
    the clamp when no block needs it, equals dequantize(quantize(.)) bit for bit."""
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(512, 32, generator=generator) * torch.exp2(torch.randint(-20, 20, (512, 1), generator=generator))
    power = torch.exp2(torch.ceil(torch.log2(x[::2].abs().amax(dim=1))))
    x[::2, 7] = torch.where(x[::2, 7] < 0, -1.0, 1.0) * (2.0 - 2.0**-20) * power  # each such row's amax, near 2^k
    options = dict(scale_mode=scale_mode, rounding=rounding, seed=3)
    for tensor in (x, x[1::2].contiguous()):
        scale_exp, nonfinite = reference._block_scales(tensor, (1,), FORMATS[fmt], scale_mode)
        amax = tensor.abs().amax(dim=1, keepdim=True)
        assert reference._fast_path_applies(tensor, scale_exp, nonfinite, amax == 0, FORMATS[fmt], rounding)
        saturating = (amax > reference._largest_magnitudes(scale_exp, FORMATS[fmt])).any()
        if tensor is x:  # the clamp is exercised where the scale rule lets a block exceed its largest magnitude
            assert bool(saturating) == (scale_mode == "floor" or (scale_mode == "even" and fmt != "int8"))
        assert torch.equal(fake_quantize(tensor, fmt, **options), dequantize(quantize(tensor, fmt, **options)))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_zero_blocks_keep_the_fast_path(fmt):
    x = torch.randn(64, 32)
    x[5] = 0.0
    x[9] = -0.0
    scale_exp, nonfinite = reference._block_scales(x, (1,), FORMATS[fmt], "rceil")
    zero = x.abs().amax(dim=1, keepdim=True) == 0
    assert zero.sum() == 2 and reference._fast_path_applies(x, scale_exp, nonfinite, zero, FORMATS[fmt], "nearest_even")
    x[3] = 2.0**-140  # a nonzero block whose scale is below the guard still takes the exact path
    scale_exp, nonfinite = reference._block_scales(x, (1,), FORMATS[fmt], "rceil")
    assert reference._fast_path_applies(x, scale_exp, nonfinite, zero, FORMATS[fmt], "nearest_even") == (
        FORMATS[fmt].emin >= 0
    )


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_an_empty_tensor_passes_the_guard_and_stays_empty(fmt):
    x = torch.zeros(0, 32)
    scale_exp, nonfinite = reference._block_scales(x, (1,), FORMATS[fmt], "rceil")
    assert reference._fast_path_applies(x, scale_exp, nonfinite, scale_exp == 0, FORMATS[fmt], "nearest_even")
    assert fake_quantize(x, fmt).shape == (0, 32)
    assert fake_quantize(x, fmt, rounding="stochastic", seed=3).shape == (0, 32)
