"""mxlab.io: atomic writes leave files with the mode the user's umask gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from mxlab import io


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_mode_of_the_umask(tmp_path: Path, umask: int, mode: int):
    previous = os.umask(umask)
    try:
        io.write_json(tmp_path / "a.json", {"x": 1})
        io.write_text(tmp_path / "b.md", "text\n")
        io.write_npz(tmp_path / "c.npz", {"x": np.arange(3)})
        io.write_torch(tmp_path / "d.pt", {"x": 1})
        with open(tmp_path / "plain.txt", "w") as handle:  # what open() gives under this umask
            handle.write("x")
    finally:
        os.umask(previous)
    for name in ("a.json", "b.md", "c.npz", "d.pt", "plain.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert not list(tmp_path.glob(".*.tmp"))
