"""The fused GEMM's operands: its prologue (run by a small kernel that stores what it quantizes) equals the
reference's quantized operands bit for bit, for every element format, scale mode, rounding, both block
shapes, the block-32 Hadamard transform, both contraction axes, batches, odd sizes and float32 inputs down
to the bottom of the range. On CPU the kernel runs under TRITON_INTERPRET=1 at tiny sizes."""
import itertools

import pytest
import torch

from mxlab.nn.qmatmul import OperandQuant
from mxlab.numerics import quant
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.hadamard import random_hadamard
from mxlab.numerics.reference import ROUNDING_MODES, SCALE_MODES
from tests.kernels.cast.test_casts import assert_same_bits, awkward_rows, backend

pytestmark = pytest.mark.filterwarnings(  # the interpreter's numpy arithmetic on Inf and NaN blocks
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)

SQUARE = (32, 32)
# every format x every rounding x both blocks, the scale modes taking turns (each format meets each twice)
CASES = [(fmt, SCALE_MODES[i % 4], rounding, block)
         for i, (fmt, rounding, block) in enumerate(itertools.product(FORMATS, ROUNDING_MODES, (32, SQUARE)))]


def bottom_of_range(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """awkward_rows (specials, float32 subnormals, clamped scales, huge blocks) plus rows of float32 values
    between 2^-140 and 2^-120, whose MX values fall below 2^-126; cropped to an odd shape."""
    rows = 1
    for size in shape[:-1]:
        rows *= size
    x = awkward_rows(max(rows, 32), 32 * -(-shape[-1] // 32), torch.float32, seed)[:rows, : shape[-1]].clone()
    g = torch.Generator().manual_seed(seed + 1)
    x[1::5] = torch.randn(x[1::5].shape, generator=g) * torch.exp2(torch.randint(-140, -120, x[1::5].shape, generator=g).float())
    return x.reshape(shape).to(dtype)


def reference_operand(x: torch.Tensor, q: OperandQuant, axis: int, seed, hadamard_seed) -> torch.Tensor:
    """What mxlab.nn.qmatmul's reference path multiplies: float32, `axis` padded to 32."""
    stochastic = dict(seed=seed) if q.rounding == "stochastic" else {}
    with backend("reference"):
        if hadamard_seed is not None:
            padded = torch.nn.functional.pad(x.float(), [0, 0] * (-1 - axis) + [0, -x.shape[axis] % 32])
            x = random_hadamard(padded, 32, axis, hadamard_seed)
        values = quant.fake_quantize(x.float(), q.fmt, block=q.block, axis=axis if q.block == 32 else -1,
                                     scale_mode=q.scale_mode, rounding=q.rounding, pad=True, **stochastic)
    missing = -values.shape[axis] % 32
    return torch.nn.functional.pad(values, [0, 0] * (-1 - axis) + [0, missing])


def check(gemm, x, q, axis, seed=7, hadamard_seed=None):
    got = gemm.quantized_operand(x, q, axis=axis, seed=seed, hadamard_seed=hadamard_seed)
    expected = reference_operand(x.cpu(), q, axis, seed, hadamard_seed)
    assert_same_bits(got.cpu(), expected, f"{q.describe()} axis {axis} hadamard {hadamard_seed}")


@pytest.mark.parametrize("fmt,scale_mode,rounding,block", CASES)
def test_operand_bits_equal_the_reference(gemm, device, fmt, scale_mode, rounding, block):
    q = OperandQuant(fmt, block, scale_mode, rounding)
    x = bottom_of_range((2, 40, 45), torch.float32, len(fmt) + len(rounding))
    check(gemm, x.to(device), q, -1)
    # blocks along dim -2 of a non-contiguous (45, 36) layout: the right operand of a forward GEMM
    check(gemm, x[1].t()[:, 2:38].to(device), q, -2)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_operand_bits_of_half_precision_inputs(gemm, device, fmt, dtype):
    x = bottom_of_range((33, 45), torch.float32, 3).clamp(-6e4, 6e4).to(dtype)
    for rounding, block in (("nearest_even", 32), ("stochastic", SQUARE)):
        check(gemm, x.to(device), OperandQuant(fmt, block, "rceil", rounding), -1)
        check(gemm, x.to(device), OperandQuant(fmt, block, "floor", rounding), -2)


@pytest.mark.parametrize("fmt,rounding,block", [("e4m3", "nearest_even", 32), ("e2m1", "stochastic", 32),
                                                 ("int8", "toward_zero", SQUARE), ("e5m2", "stochastic", SQUARE),
                                                 ("e3m2", "nearest_away", 32)])
def test_operand_bits_with_the_hadamard_transform(gemm, device, fmt, rounding, block):
    q = OperandQuant(fmt, block, "even", rounding)
    x = bottom_of_range((40, 70), torch.float32, 11)
    check(gemm, x.to(device), q, -1, hadamard_seed=5)
    check(gemm, x.t().to(device), q, -2, hadamard_seed=6)
    check(gemm, x.to(torch.bfloat16).to(device), q, -1, hadamard_seed=7)


def test_stochastic_bits_follow_the_seed(gemm, device):
    x = torch.randn(32, 64, device=device)
    q = OperandQuant("e2m1", 32, "floor", "stochastic")
    first = gemm.quantized_operand(x, q, axis=-1, seed=1)
    assert torch.equal(first, gemm.quantized_operand(x, q, axis=-1, seed=1))
    assert not torch.equal(first, gemm.quantized_operand(x, q, axis=-1, seed=2))


def test_refusals_name_the_value(gemm, device):
    x = torch.randn(4, 32, device=device)
    with pytest.raises(ValueError, match="fp8_tensor_e4m3"):
        gemm.quantized_operand(x, OperandQuant("fp8_tensor_e4m3"))
    with pytest.raises(ValueError, match="bf16"):
        gemm.mx_gemm(x, x.t(), OperandQuant("e4m3"), OperandQuant("bf16"))
    with pytest.raises(ValueError, match="seed"):
        gemm.quantized_operand(x, OperandQuant("e4m3", rounding="stochastic"))
    with pytest.raises(ValueError, match="axis"):
        gemm.quantized_operand(x, OperandQuant("e4m3"), axis=0)
    assert "Hadamard block 64" in gemm.unsupported_reason(x, x, OperandQuant("e4m3"), OperandQuant("e4m3"), hadamard=64)
    assert gemm.unsupported_reason(x, x.t(), OperandQuant("e4m3"), OperandQuant("int8", (32, 32))) is None


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_operand_bits_at_layer_sizes(gemm, fmt):
    """On CUDA (the hardware FP8 conversion included): every rounding and scale mode, both blocks, both
    axes, float32 and bfloat16 inputs, with and without the Hadamard transform, at (2, 500, 264)."""
    for i, (rounding, block, dtype) in enumerate(itertools.product(ROUNDING_MODES, (32, SQUARE), (torch.float32, torch.bfloat16))):
        q = OperandQuant(fmt, block, SCALE_MODES[i % 4], rounding)
        x = bottom_of_range((2, 500, 264), torch.float32, i).to(dtype).cuda()
        check(gemm, x, q, -1)
        check(gemm, x[0].t(), q, -2, seed=11)
        if i % 3 == 0:
            check(gemm, x[1], q, -2, hadamard_seed=i)
