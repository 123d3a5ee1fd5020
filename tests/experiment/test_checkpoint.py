"""Checkpoints hold tensors and plain data only and load with weights_only=True; a pickled object is refused."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mxlab.experiment.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint


class Planted:
    """Any class instance: unpickling it would run code of the writer's choosing."""

    def __reduce__(self):
        return (print, ("this would run on load",))


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path: Path):
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    np.random.normal()  # a cached gaussian in numpy's state
    save_checkpoint(tmp_path / "c.pt", {"rng": rng_state(), "step": 7, "interval": {"losses": [[0.5, 0.25, 0.25]]}})
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)], np.random.normal())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    loaded = load_checkpoint(tmp_path / "c.pt")
    restore_rng(loaded["rng"])
    got = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)], np.random.normal())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2] and got[3] == expected[3]
    assert loaded["step"] == 7 and loaded["interval"]["losses"] == [[0.5, 0.25, 0.25]]


def test_a_checkpoint_carrying_a_pickled_object_is_refused(tmp_path: Path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3, "extra": Planted()}, path)
    with pytest.raises(ValueError, match=r"refusing to load .*checkpoint\.pt: it holds objects other than tensors"):
        load_checkpoint(path)
