"""Shared fixtures of the model tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread(_fixed_torch_threads):
    """These small GEMMs run fastest on one thread (and far faster on a shared, busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
