"""Files as a team expects: the umask's mode, paths relative to the study folder, recipes found like
load_recipe finds them, option errors that name the option."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from tests.experiment.faults import SPEC, cli, run_inline, write_spec


@pytest.fixture
def spec_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_inline(monkeypatch)
    return write_spec(tmp_path / "spec")


def test_study_files_take_the_umask_mode_and_name_no_absolute_path(spec_path, tmp_path):
    previous = os.umask(0o022)
    try:
        out = tmp_path / "out"
        run_study(
            load_spec(spec_path), out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
        )
    finally:
        os.umask(previous)
    for path in [out / "study.json", *(out / "runs").rglob("*")]:
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    study = json.loads((out / "study.json").read_text())
    assert study["recipes"] == {"base": "../spec/recipes/base.toml", "noisy": "../spec/recipes/noisy.toml"}
    assert study["spec_path"] == "../spec/faults.toml"
    assert study["recipe_files"]["noisy"]["path"] == "../spec/recipes/noisy.toml"
    record = {key: value for key, value in study.items() if key not in ("command", "environment")}
    assert str(tmp_path) not in json.dumps(record)


def test_a_copied_spec_finds_its_arms_beside_it_then_in_mxlab_recipes_then_shipped(tmp_path, monkeypatch):
    alone = tmp_path / "copied"
    alone.mkdir()
    spec = alone / "s.toml"
    spec.write_text(
        SPEC.replace('baseline = "base"', 'baseline = "bf16"').replace('["base", "noisy"]', '["bf16", "mine"]')
    )
    own = tmp_path / "own"
    own.mkdir()
    (own / "mine.toml").write_text((Path(__file__).parents[2] / "experiments/recipes/mxfp8-rceil.toml").read_text())
    monkeypatch.setenv("MXLAB_RECIPES", str(own))
    loaded = load_spec(spec)
    assert loaded.recipe_paths["mine"] == own / "mine.toml"
    assert loaded.recipe_paths["bf16"].name == "bf16.toml" and loaded.recipe_paths["bf16"].is_file()  # shipped
    (alone / "recipes").mkdir()
    (alone / "recipes" / "bf16.toml").write_text((loaded.recipe_paths["bf16"]).read_text())
    assert load_spec(spec).recipe_paths["bf16"] == (alone / "recipes" / "bf16.toml").resolve()  # beside it first


def test_option_parse_errors_name_the_option(tmp_path):
    code, lines = cli("power", "--seeds", "3,x")
    assert code == 2 and lines == ["error: --seeds '3,x': expected a comma-separated list of integers >= 1, e.g. 3,5,8"]
