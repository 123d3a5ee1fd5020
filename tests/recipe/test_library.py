"""Where recipes are found: a path, the caller's folders, $MXLAB_RECIPES, then the shipped recipes."""

from pathlib import Path

import pytest

from mxlab.recipe import available_recipes, find_recipe, load_recipe, recipe_dirs
from mxlab.recipe.library import shipped_recipe_dir

REPO_RECIPES = Path(__file__).resolve().parents[2] / "experiments" / "recipes"


def write(directory: Path, name: str, description: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(f'description = "{description}"\ndefault = "hp"\n[policies.hp]\nall = "bf16"\n')
    return path


def test_the_shipped_recipes_are_the_installed_package_data_of_experiments_recipes():
    assert shipped_recipe_dir().resolve() == REPO_RECIPES.resolve()
    assert {path.stem for path in REPO_RECIPES.glob("*.toml")} <= set(available_recipes())
    assert load_recipe("mxfp8-rceil").source == str(shipped_recipe_dir() / "mxfp8-rceil.toml")


def test_search_order_is_caller_folders_then_the_environment_then_the_shipped(tmp_path, monkeypatch):
    mine, env_a, env_b = tmp_path / "mine", tmp_path / "env_a", tmp_path / "env_b"
    write(mine, "bf16", "mine")
    write(env_a, "bf16", "env")
    write(env_a, "only-env", "env a")
    write(env_b, "only-env", "env b")
    monkeypatch.setenv("MXLAB_RECIPES", f"{env_a}:{env_b}")
    assert recipe_dirs([mine]) == [mine, env_a, env_b, shipped_recipe_dir()]
    assert load_recipe("bf16", [mine]).description == "mine"
    assert load_recipe("bf16").description == "env"
    assert load_recipe("only-env").description == "env a"
    assert "only-env" in available_recipes() and "mxfp8-floor" in available_recipes()
    monkeypatch.delenv("MXLAB_RECIPES")
    assert load_recipe("bf16").description != "env"  # the shipped one


def test_defaults_off_searches_the_callers_folders_only_and_refusals_list_what_is_there(tmp_path):
    write(tmp_path, "base", "x")
    assert available_recipes([tmp_path], defaults=False) == ["base"]
    assert find_recipe("base", [tmp_path], defaults=False) == tmp_path / "base.toml"
    with pytest.raises(ValueError, match=r"no recipe 'mxfp8-rceil' in .*; available recipes: base$"):
        find_recipe("mxfp8-rceil", [tmp_path], defaults=False)
    with pytest.raises(ValueError, match="no recipe file"):
        find_recipe(str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="list of folders"):
        recipe_dirs(str(tmp_path))


def test_a_file_is_parsed_once_until_its_text_changes(tmp_path):
    path = write(tmp_path, "r", "first")
    first = load_recipe(path)
    assert load_recipe(path) is first and load_recipe("r", [tmp_path]) is first
    write(tmp_path, "r", "second")
    assert load_recipe(path).description == "second"
