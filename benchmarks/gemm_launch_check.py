"""Exploration: which launch shapes of the fused MX GEMM (kernels/gemm) give products within the float32
accumulation bound of the reference operands at a QLinear size, for bfloat16 and float32 inputs.

Run on a GPU from the repository root: PYTHONPATH=. python3 benchmarks/gemm_launch_check.py
(launches `_mx_gemm_kernel` directly with each shape; the library picks one shape itself).
"""
import torch
import triton

from mxlab.kernels.gemm import mx_gemm as g
from mxlab.nn.qmatmul import OperandQuant
from tests.kernels.gemm.test_mx_gemm import expected_product, operand


def launch(a, b, qa, qb, transpose_a, transpose_b, block_m, block_n, warps, stages, group_m=8):
    a3, m, k, a_strides, a_counter = g._rows_by_contraction(a, -2 if transpose_a else -1, False)
    b3, n, _, b_strides, b_counter = g._rows_by_contraction(b, -1 if transpose_b else -2, False)
    out = torch.empty((a3.shape[0], m, n), dtype=a.dtype, device=a.device)
    may_be_tiny = a.dtype == torch.float32 or b.dtype == torch.float32
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), a3.shape[0])
    g._mx_gemm_kernel[grid](
        a3.view(g._BITS_DTYPES[a.dtype]), b3.view(g._BITS_DTYPES[b.dtype]), out.view(g._BITS_DTYPES[out.dtype]), m, n, k,
        triton.cdiv(k, 32), *a_strides, *b_strides, *out.stride(), *a_counter, *b_counter, 0, 0, 0,
        CODE_A=g._code(qa, a.device), CODE_B=g._code(qb, b.device), SQUARE_A=False, SQUARE_B=False, HADAMARD=False,
        IN_KIND_A=g.DTYPE_KINDS[a.dtype], IN_KIND_B=g.DTYPE_KINDS[b.dtype], OUT_KIND=g.DTYPE_KINDS[out.dtype],
        CONVERT_BF16=True, MAY_BE_TINY=may_be_tiny, DOT_F32=False, BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=group_m,
        num_warps=warps, num_stages=stages)
    return out.reshape(m, n)


def main():
    q = OperandQuant("e4m3", 32, "rceil")
    shapes = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 1), (128, 128, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2)]
    for dtype in (torch.bfloat16, torch.float32):
        for name, ta, tb in (("fwd", False, False), ("dgrad", False, True), ("wgrad", True, False)):
            a = operand((1000, 520), 1) if not ta else operand((1000, 520), 1)
            b = operand((520, 300), 2, tiny_rows=False)
            gr = operand((1000, 300), 3)
            x, y = {"fwd": (a, b), "dgrad": (gr, b), "wgrad": (a, gr)}[name]
            x, y = x.to(dtype), y.to(dtype)
            exact, magnitude, k = expected_product(x, y, q, q, ta, tb, (3, 4), None)
            for shape in shapes:
                out = launch(x.cuda(), y.cuda(), q, q, ta, tb, *shape).cpu().double()
                finite = ~exact.isnan()
                unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -24
                bound = (k + 2) * 2.0 ** -24 * magnitude + unit * exact.abs()
                err = (out - exact).abs()
                bad = (err > bound) & finite
                where = bad.nonzero()[:3].tolist()
                print(f"{str(dtype):15s} {name:6s} {shape}: bad {int(bad.sum()):6d} nan-mismatch "
                      f"{int((out.isnan() != exact.isnan()).sum())} first {where}", flush=True)


if __name__ == "__main__":
    main()
