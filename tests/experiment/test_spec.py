"""Spec loading: validation errors name the offending value and the accepted ones; --set overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxlab.experiment.overrides import apply_overrides, parse_override
from mxlab.experiment.spec import TrainConfig, load_spec

VALID = """
name = "tiny"
seeds = [0, 1]
baseline = "base"
arms = ["base", "other"]

[data]
source = "synthetic"

[model]
dim = 8

[train]
batch_size = 32
lr = 1e-2
"""


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "recipes").mkdir()
    for name in ("base", "other", "third"):
        (tmp_path / "recipes" / f"{name}.toml").write_text(f'name = "{name}"\n')
    return tmp_path


def write(spec_dir: Path, text: str) -> Path:
    path = spec_dir / "spec.toml"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def _no_recipe_parsing(monkeypatch):
    # these tests are about the spec; the recipe files above are placeholders
    monkeypatch.setattr("mxlab.experiment.spec._check_recipe_loads", lambda arm, path: None)


def test_valid_spec_resolves_arms_defaults_and_recipe_paths(spec_dir):
    spec = load_spec(write(spec_dir, VALID))
    assert spec.name == "tiny" and spec.seeds == (0, 1) and spec.arms == ("base", "other")
    assert spec.train.batch_size == 32 and spec.train.lr == 0.01
    assert spec.train.epochs == TrainConfig().epochs
    assert spec.recipe_paths["other"] == spec_dir / "recipes" / "other.toml"
    assert spec.to_dict()["train"]["lr"] == 0.01


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: 'colour = "red"\n' + t, r"unknown key 'colour'.*accepted keys: name, description, seeds"),
        (
            lambda t: t.replace("lr = 1e-2", "lr = 1e-2\nlearning_rate = 3"),
            r"unknown key 'train\.learning_rate'; accepted keys in \[train\]: batch_size, lr, epochs",
        ),
        (lambda t: t.replace("lr = 1e-2", 'lr = "fast"'), r"train\.lr must be a number, got 'fast'"),
        (lambda t: t.replace("batch_size = 32", "batch_size = 32.5"), r"train\.batch_size must be an integer"),
        (
            lambda t: t.replace('"base", "other"]', '"base", "nope"]'),
            r"unknown arm/recipe 'nope'.*available recipes: base, .*other, .*third",  # then $MXLAB_RECIPES, shipped
        ),
        (
            lambda t: t.replace('source = "synthetic"', 'source = "imagenet"'),
            r"unknown data source 'imagenet'.*synthetic, movielens-100k, criteo",
        ),
        (
            lambda t: t.replace('baseline = "base"', 'baseline = "third"'),
            r"baseline 'third' is not one of the arms: base, other",
        ),
        (lambda t: t.replace("seeds = [0, 1]", "seeds = [0, 0]"), r"seeds must be distinct"),
        (lambda t: t.replace("seeds = [0, 1]", 'seeds = ["a"]'), r"seeds\[0\] must be an integer"),
        (lambda t: t.replace('arms = ["base", "other"]', 'arms = ["base", "base"]'), r"repeated: base"),
        (lambda t: t.replace('name = "tiny"\n', ""), r"missing 'name'"),
        (
            lambda t: t + "[report]\nauc_threshold = 0.1\n",
            r"unknown report setting\(s\) \['auc_threshold'\]; accepted: .*auc_regression",
        ),
        (
            lambda t: t.replace("lr = 1e-2", 'lr = 1e-2\noptimizer = "lion"'),
            r"optimizer 'lion' is not one of: adam, adamw, sgd, adagrad",
        ),
        (
            lambda t: t + "[report]\nauc_regression = -1\n",
            r"\[report\]: report setting auc_regression=-1.0 must be >= 0",
        ),
    ],
)
def test_invalid_specs_are_refused_with_the_value_and_the_accepted_ones(spec_dir, edit, message):
    with pytest.raises(ValueError, match=message):
        load_spec(write(spec_dir, edit(VALID)))


def test_malformed_toml_and_missing_file(spec_dir):
    with pytest.raises(ValueError, match="not valid TOML"):
        load_spec(write(spec_dir, "name = \n"))
    with pytest.raises(ValueError, match="no experiment spec"):
        load_spec(spec_dir / "missing.toml")


def test_overrides_are_toml_typed_and_dotted(spec_dir):
    spec = load_spec(
        write(spec_dir, VALID),
        [
            "train.epochs=2",
            "seeds=[0]",
            "data.source=movielens-100k",
            "train.lr=0.5",
            'arms=["base"]',
            "model.tower_dims=[8, 4]",
        ],
    )
    assert spec.train.epochs == 2 and spec.seeds == (0,) and spec.data["source"] == "movielens-100k"
    assert spec.train.lr == 0.5 and spec.arms == ("base",) and spec.model["tower_dims"] == [8, 4]
    with pytest.raises(ValueError, match=r"train\.epochs must be an integer, got 'two'"):
        load_spec(write(spec_dir, VALID), ["train.epochs=two"])
    with pytest.raises(ValueError, match="unknown key 'train.epoch'"):
        load_spec(write(spec_dir, VALID), ["train.epoch=2"])


def test_parse_override_refuses_malformed_text():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override('name="x y"') == (["name"], "x y")
    with pytest.raises(ValueError, match="key=value"):
        parse_override("train.epochs")
    with pytest.raises(ValueError, match="empty key"):
        parse_override("train..epochs=1")
    assert apply_overrides({"seeds": [0]}, ["a.b.c=1"]) == {"seeds": [0], "a": {"b": {"c": 1}}}
    with pytest.raises(ValueError, match="is not a table"):
        apply_overrides({"seeds": [0]}, ["seeds.first=1"])


EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.mark.parametrize("name", sorted(path.stem for path in EXPERIMENTS.glob("*.toml")))
def test_shipped_experiments_validate_against_the_real_recipes(name, monkeypatch):
    monkeypatch.undo()  # validate the shipped recipe files for real
    spec = load_spec(EXPERIMENTS / f"{name}.toml")
    assert spec.baseline == "bf16" and spec.arms[0] == "bf16"
    if name == "recipes-study":
        shipped = sorted(path.stem for path in (EXPERIMENTS / "recipes").glob("*.toml"))
        assert sorted(spec.arms) == shipped
    if name == "gem-synthetic":
        assert len(spec.arms) >= 5 and len(spec.seeds) >= 3 and spec.data["train_examples"] >= 1_000_000
        assert spec.model["size"] == "h200"
