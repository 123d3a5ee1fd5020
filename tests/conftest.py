import os
from collections import defaultdict

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


def interpreted_sweep_slice(count: int) -> set[int]:
    """The indices of a parametrized kernel test's cases that run by default on a CPU: its first and middle ones
    (a corner and the centre of its grid)."""
    return {0, count // 2}


def pytest_collection_modifyitems(config, items):
    """Without CUDA: GPU tests are skipped, naming why; and each parametrized test of tests/kernels/ (Triton's
    interpreter, about a thousand times slower than the GPU) keeps a slice of its grid in the default run
    (interpreted_sweep_slice), the rest marked slow: `make test-all` runs every case."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    sweeps: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        elif "/tests/kernels/" in str(item.path) and hasattr(item, "callspec"):
            sweeps[f"{item.path}::{item.originalname}"].append(item)
    for cases in sweeps.values():
        kept = interpreted_sweep_slice(len(cases))
        for index, item in enumerate(cases):
            if index not in kept:
                item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fixed_torch_threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield
