"""Exact products of quantized operands: float32 accumulation on the BF16 tensor cores (CUDA) or a float32
matmul, and the bfloat16 product rounded once from cuBLAS's float32 accumulator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def float32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b accumulated and returned in float32: BF16 tensor cores when both are bfloat16 CUDA
    tensors, else a float32 matmul. a, b: (..., M, K) and (..., K, N) with equal leading dims."""
    if a.dtype == b.dtype == torch.bfloat16 and a.is_cuda:
        if a.dim() == 2:
            return torch.mm(a, b, out_dtype=torch.float32)
        batch = a.shape[:-2]
        out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), out_dtype=torch.float32)
        return out.reshape(*batch, *out.shape[-2:])
    return torch.matmul(a.float(), b.float())


@contextlib.contextmanager
def float32_reductions() -> Iterator[None]:
    """cuBLAS may not reduce split-K partial sums in bfloat16 inside this block (PyTorch allows it by default)."""
    matmul = torch.backends.cuda.matmul
    previous = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = previous


def bfloat16_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """a @ b (+ bias, bfloat16, 2-D a and b only) of bfloat16 CUDA operands as one cuBLAS call that writes bfloat16
    from its float32 accumulator (the bias added there, as nn.Linear's addmm does), with float32 split-K
    reductions enforced: the float32 product rounded once."""
    with float32_reductions():
        if a.dim() == 2:
            return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
        out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
        return out.reshape(*a.shape[:-2], *out.shape[-2:])
