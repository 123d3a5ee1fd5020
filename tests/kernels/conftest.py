"""Kernel tests run the Triton kernels on CUDA when there is a device, else on the CPU under
TRITON_INTERPRET=1 (tests/conftest.py decorates the kernels as interpreted functions before any test
module is imported; the fixtures set the variable for each test)."""

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def kernel_module():
    """mxlab.kernels.cast as imported (TRITON_INTERPRET untouched); skips where Triton is not installed."""
    from mxlab.numerics.quant import _import_kernels

    module = _import_kernels()
    if module is None:
        pytest.skip("Triton is not installed")
    return module


@pytest.fixture
def kernels(kernel_module, monkeypatch):
    """mxlab.kernels, runnable on this machine's test device."""
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return kernel_module


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"
