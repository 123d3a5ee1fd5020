"""The code's commit as a study records it, and the placebo arm's data order."""

import re
import subprocess
from types import SimpleNamespace

from mxlab.experiment import provenance
from mxlab.experiment.data_order import PLACEBO_DATA_SEED_OFFSET, data_order_seed


def test_commit_comes_from_the_environment_then_git_then_the_package(monkeypatch):
    monkeypatch.delenv("MXLAB_GIT_COMMIT", raising=False)
    found = provenance.code_commit()
    assert found["source"] in ("git", "package") and found["commit"]
    monkeypatch.setenv("MXLAB_GIT_COMMIT", "abc1234")  # a copy whose .git is not its own says which commit it is
    assert provenance.code_commit() == {"commit": "abc1234", "dirty": None, "source": "MXLAB_GIT_COMMIT"}

    def no_git(*args, **kwargs):
        raise OSError("no git here")

    monkeypatch.setattr(subprocess, "run", no_git)
    monkeypatch.setenv("MXLAB_GIT_COMMIT", "abc1234")
    assert provenance.code_commit() == {"commit": "abc1234", "dirty": None, "source": "MXLAB_GIT_COMMIT"}
    monkeypatch.delenv("MXLAB_GIT_COMMIT")
    shipped = provenance.code_commit()
    assert shipped["source"] == "package"
    assert re.fullmatch(r"mxlab-\S+\+sha256:[0-9a-f]{16}", shipped["commit"])
    assert shipped["commit"].endswith(provenance.package_hash())


def test_package_hash_changes_with_a_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = provenance.package_hash(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.package_hash(tmp_path) != first


def test_placebo_arm_gets_its_own_data_order_from_scratch_and_other_arms_the_seed():
    assert data_order_seed(SimpleNamespace(arm="placebo", seed=3, fork_dir=None)) == 3 + PLACEBO_DATA_SEED_OFFSET
    assert (
        data_order_seed(SimpleNamespace(arm="placebo", seed=3, fork_dir="runs/_fork/seed3")) == 3
    )  # pairs swapped instead
    assert data_order_seed(SimpleNamespace(arm="mxfp8-rceil", seed=3, fork_dir=None)) == 3
