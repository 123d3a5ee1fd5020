"""The fused MX GEMM's products: equal to a float64 matmul of the reference's quantized operands within
float32-accumulation error, for the forward (a @ b), dgrad (g @ b^T) and wgrad (a^T @ g) orientations read
through strides, batches, odd sizes, mixed block shapes, the Hadamard transform, stochastic rounding and
float32 inputs whose MX values lie below 2^-126 (the block-scaled partial products). CPU: TRITON_INTERPRET=1."""
import pytest
import torch

from mxlab.nn.qmatmul import OperandQuant
from tests.kernels.gemm.test_prologue import reference_operand

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)

SQUARE = (32, 32)


def operand(shape: tuple[int, ...], seed: int, tiny_rows: bool = True) -> torch.Tensor:
    """float32 values over +-2^20 per row, a zero row, one NaN, and (tiny_rows) rows near 2^-135."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 20, (*shape[:-1], 1), generator=g).float())
    flat = x.reshape(-1, shape[-1])
    flat[3] = 0.0
    if tiny_rows:
        flat[1::6] = torch.randn(flat[1::6].shape, generator=g) * 2.0 ** -135
    return x


def expected_product(a, b, qa, qb, transpose_a, transpose_b, seeds, hadamard_seed):
    """(float64 product of the reference operands, float64 product of their magnitudes)."""
    axis_a = -2 if transpose_a else -1
    axis_b = -1 if transpose_b else -2
    a_q = reference_operand(a.cpu(), qa, axis_a, seeds[0], hadamard_seed).double()
    b_q = reference_operand(b.cpu(), qb, axis_b, seeds[1], hadamard_seed).double()
    a_q = a_q.transpose(-1, -2) if transpose_a else a_q
    b_q = b_q.transpose(-1, -2) if transpose_b else b_q
    k = min(a_q.shape[-1], b_q.shape[-2])
    a_q, b_q = a_q[..., :k], b_q[..., :k, :]
    return a_q @ b_q, a_q.abs() @ b_q.abs(), k


def check(gemm, a, b, qa, qb, *, transpose_a=False, transpose_b=False, seeds=(3, 4), hadamard_seed=None,
          out_dtype=None):
    out = gemm.mx_gemm(a, b, qa, qb, transpose_a=transpose_a, transpose_b=transpose_b, seeds=seeds,
                       hadamard_seed=hadamard_seed, out_dtype=out_dtype).cpu()
    exact, magnitude, k = expected_product(a, b, qa, qb, transpose_a, transpose_b, seeds, hadamard_seed)
    assert out.shape == exact.shape and out.dtype == (out_dtype or a.dtype)
    assert torch.equal(out.isnan(), exact.isnan())
    finite = ~exact.isnan()
    unit = 2.0 ** -8 if out.dtype == torch.bfloat16 else 2.0 ** -24
    bound = (k + 2) * 2.0 ** -24 * magnitude + unit * exact.abs() + 2.0 ** -149 * k
    error = (out.double() - exact).abs()
    assert (error[finite] <= bound[finite]).all(), f"max error {error[finite].max()}"
    assert (exact[finite] != 0).any()


QUANTS = [
    (OperandQuant("e4m3", 32, "rceil"), OperandQuant("e4m3", 32, "rceil")),
    (OperandQuant("e5m2", SQUARE, "floor"), OperandQuant("e2m3", 32, "even", "nearest_away")),
    (OperandQuant("e2m1", 32, "ceil", "stochastic"), OperandQuant("int8", SQUARE, "rceil", "stochastic")),
    (OperandQuant("e3m2", SQUARE, "even", "toward_zero"), OperandQuant("e4m3", SQUARE, "floor", "stochastic")),
]


@pytest.mark.parametrize("qa,qb", QUANTS, ids=[f"{a.describe()} x {b.describe()}" for a, b in QUANTS])
def test_three_orientations(gemm, device, qa, qb):
    a = operand((2, 40, 45), 1).to(device)
    b = operand((2, 45, 36), 2, tiny_rows=False).to(device)
    g = operand((2, 40, 36), 3).to(device)
    check(gemm, a, b, qa, qb)  # forward: a along K, b along K (its dim -2)
    check(gemm, g[0], b[1], qa, qb, transpose_b=True)  # dgrad: g @ b^T, both along N
    check(gemm, a[1], g[0], qa, qb, transpose_a=True)  # wgrad: a^T @ g, both along M


def test_transposed_weight_view_and_bfloat16(gemm, device):
    """The QLinear forward: x @ W.t() with W (N, K) contiguous, bfloat16 in and out."""
    x = operand((33, 70), 5, tiny_rows=False).to(torch.bfloat16).to(device)
    w = operand((45, 70), 6, tiny_rows=False).to(torch.bfloat16).to(device)
    q = OperandQuant("e4m3", 32, "rceil")
    check(gemm, x, w.t(), q, q)
    check(gemm, x.float(), w.t(), q, OperandQuant("e5m2", SQUARE), out_dtype=torch.bfloat16)


@pytest.mark.parametrize("qa,qb", QUANTS[:3:2], ids=["e4m3", "e2m1 x int8 stochastic"])
def test_hadamard(gemm, device, qa, qb):
    a = operand((40, 45), 7).to(device)
    b = operand((45, 36), 8, tiny_rows=False).to(device)
    check(gemm, a, b, qa, qb, hadamard_seed=9)
    check(gemm, a, a, qa, qb, transpose_a=True, hadamard_seed=10)


def test_tiny_values_use_the_block_scaled_product(gemm, device):
    """float32 inputs near 2^-135 times large ones: the products are float32 normals that a bfloat16 copy
    of the tiny operand could not give; the result must be exact to float32 accumulation."""
    a = (torch.randn(32, 64) * 2.0 ** -135).to(device)
    b = (torch.randn(64, 32) * 2.0 ** 30).to(device)
    q = OperandQuant("e4m3", 32, "floor")
    check(gemm, a, b, q, q)


@pytest.mark.gpu
@pytest.mark.parametrize("qa,qb", QUANTS, ids=[f"{a.describe()} x {b.describe()}" for a, b in QUANTS])
def test_gpu_three_orientations_at_layer_sizes(gemm, qa, qb):
    """CUDA, bfloat16 tensor cores: QLinear-sized GEMMs (M = 1000, K = 520, N = 300), float32 and bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        a = operand((1000, 520), 1).to(dtype).cuda()
        b = operand((520, 300), 2, tiny_rows=False).to(dtype).cuda()
        g = operand((1000, 300), 3).to(dtype).cuda()
        check(gemm, a, b, qa, qb)
        check(gemm, g, b, qa, qb, transpose_b=True)
        check(gemm, a, g, qa, qb, transpose_a=True)
        check(gemm, a, b, qa, qb, hadamard_seed=5)
    check(gemm, (torch.randn(256, 512) * 2.0 ** -135).cuda(), (torch.randn(512, 256) * 2.0 ** 30).cuda(),
          QUANTS[0][0], QUANTS[0][1])
