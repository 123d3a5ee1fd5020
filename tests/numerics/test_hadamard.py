import math

import pytest
import torch
from scipy.linalg import hadamard

from mxlab.numerics.hadamard import hadamard_signs, inverse_random_hadamard, random_hadamard


@pytest.mark.parametrize("block", [16, 32, 256])
def test_matches_the_dense_signed_hadamard_matrix(block):
    x = torch.randn(3, 2 * block, dtype=torch.float32)
    signs = hadamard_signs(block, seed=5)
    matrix = torch.tensor(hadamard(block), dtype=torch.float64) / math.sqrt(block)
    expected = (x.double().view(3, 2, block) * signs.double()) @ matrix.T
    assert torch.allclose(random_hadamard(x, block, seed=5).double(), expected.view(3, -1), atol=1e-5)


def test_inverse_and_orthonormality():
    x = torch.randn(64, 8)
    y = random_hadamard(x, 32, axis=0, seed=3)
    assert torch.allclose(inverse_random_hadamard(y, 32, axis=0, seed=3), x, atol=1e-5)
    assert torch.allclose(y.norm(dim=0), x.norm(dim=0), rtol=1e-5)
    other = torch.randn(64, 5)
    product = random_hadamard(other, 32, axis=0, seed=3).T @ y
    assert torch.allclose(product, other.T @ x, atol=1e-4)


def test_seed_changes_signs_and_spreads_an_outlier():
    assert not torch.equal(hadamard_signs(32, 0), hadamard_signs(32, 1))
    assert torch.equal(hadamard_signs(32, 4), hadamard_signs(32, 4))
    x = torch.zeros(32)
    x[5] = 100.0
    assert torch.allclose(random_hadamard(x, 32, seed=0).abs(), torch.full((32,), 100 / math.sqrt(32)))


def test_refusals():
    with pytest.raises(ValueError, match="accepted: 16, 32"):
        random_hadamard(torch.randn(48), 48)
    with pytest.raises(ValueError, match="not a multiple of the Hadamard block 32"):
        random_hadamard(torch.randn(40), 32)
