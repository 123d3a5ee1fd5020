import os

import pytest
import torch

if not torch.cuda.is_available():
    # The Triton kernels are tested on the CPU under TRITON_INTERPRET=1, which must be set when Triton's
    # language module (tl.max ...) and the kernels are first decorated: here, before any test module
    # imports the library (importing torch._dynamo, as `torch.compiler.disable` does, imports Triton).
    _had_interpret = "TRITON_INTERPRET" in os.environ
    os.environ["TRITON_INTERPRET"] = "1"
    from mxlab.numerics.quant import _import_kernels

    _import_kernels()
    if not _had_interpret:
        del os.environ["TRITON_INTERPRET"]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _fixed_torch_threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield
