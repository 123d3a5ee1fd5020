"""The fused GEMM's tests run on CUDA when there is a device, else on the CPU under TRITON_INTERPRET=1."""
import importlib
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def gemm(monkeypatch):
    """mxlab.kernels.gemm, runnable on this machine's test device (imported under the interpreter on CPU)."""
    pytest.importorskip("triton")
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return importlib.import_module("mxlab.kernels.gemm")


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


