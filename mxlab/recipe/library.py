"""The one place recipes are found: by path, or by name in a fixed search order.

A recipe is named either by a path to a TOML file (anything ending in `.toml` or holding a path
separator is taken as a path) or by a name, NAME, looked up as NAME.toml in these folders, first
match wins:

1. the folders the caller gives (`search_dirs`; a study spec gives its `<spec dir>/recipes`);
2. each folder of the environment variable `MXLAB_RECIPES` (separated like PATH, by os.pathsep);
3. the shipped recipes: the package data `mxlab.recipe.shipped`, which is the repository's
   `experiments/recipes/` installed with mxlab (so they are found after a normal install too).

`defaults=False` searches the caller's folders only (a spec's arms come from its own recipes
folder). Every file is parsed once: `load_recipe` keeps each parsed recipe, keyed by the file's
resolved path and text, so a second load of an unchanged file returns the same Recipe.
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Iterable
from pathlib import Path

from mxlab.recipe.schema import Recipe, parse_recipe

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ENV_VAR = "MXLAB_RECIPES"
SHIPPED_PACKAGE = "mxlab.recipe.shipped"

_parsed: dict[tuple[str, str], Recipe] = {}


def shipped_recipe_dir() -> Path:
    """The folder of the shipped recipes (package data mxlab.recipe.shipped).

    Refuses (RuntimeError, saying to reinstall) when the package is missing, e.g. an editable
    install made before the recipes became package data.
    """
    try:
        return Path(str(importlib.resources.files(SHIPPED_PACKAGE)))
    except ModuleNotFoundError:
        raise RuntimeError(
            f"the shipped recipes (package {SHIPPED_PACKAGE}) are not installed; "
            f"reinstall mxlab (`pip install -e .` in the repository)"
        ) from None


def recipe_dirs(search_dirs: Iterable[str | Path] = (), *, defaults: bool = True) -> list[Path]:
    """The folders searched for a recipe name, in order: `search_dirs`, then (with `defaults`) the
    folders of $MXLAB_RECIPES and the shipped recipes; each folder once."""
    if isinstance(search_dirs, (str, Path)):
        raise ValueError(
            f"search_dirs must be a list of folders, got the single value {search_dirs!r}; pass [{search_dirs!r}]"
        )
    dirs = [Path(directory) for directory in search_dirs]
    if defaults:
        dirs += [Path(entry) for entry in os.environ.get(ENV_VAR, "").split(os.pathsep) if entry]
        dirs.append(shipped_recipe_dir())
    unique: list[Path] = []
    for directory in dirs:
        if directory not in unique:
            unique.append(directory)
    return unique


def available_recipes(search_dirs: Iterable[str | Path] = (), *, defaults: bool = True) -> list[str]:
    """Sorted names of the recipes (*.toml stems) in the folders `recipe_dirs` gives (missing folders add none)."""
    return sorted(
        {
            path.stem
            for directory in recipe_dirs(search_dirs, defaults=defaults)
            if directory.is_dir()
            for path in directory.glob("*.toml")
        }
    )


def _is_path(name_or_path: str | Path) -> bool:
    text = str(name_or_path)
    return isinstance(name_or_path, Path) or text.endswith(".toml") or os.sep in text or (os.altsep or os.sep) in text


def find_recipe(name_or_path: str | Path, search_dirs: Iterable[str | Path] = (), *, defaults: bool = True) -> Path:
    """The recipe file for a path or a name (see the module docstring).

    Refuses (ValueError) a path that is not a file, and a name found in no folder (listing the
    folders searched and the names available there).
    """
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path):
        raise ValueError(f"a recipe is a name or a .toml path, got {name_or_path!r}")
    if _is_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"no recipe file {str(path)!r}")
        return path
    dirs = recipe_dirs(search_dirs, defaults=defaults)
    for directory in dirs:
        candidate = directory / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    available = available_recipes(search_dirs, defaults=defaults)
    raise ValueError(
        f"no recipe {str(name_or_path)!r} in {', '.join(map(str, dirs)) or 'no folder'}; "
        f"available recipes: {', '.join(available) if available else 'none'}"
    )


def load_recipe(name_or_path: str | Path, search_dirs: Iterable[str | Path] = (), *, defaults: bool = True) -> Recipe:
    """The validated Recipe of a path or a name (found by `find_recipe`); a file is parsed once.

    Refuses (ValueError) what `find_recipe` refuses, malformed TOML (with the parser's message) and
    everything `parse_recipe` refuses (prefixed with the file's path).
    """
    path = find_recipe(name_or_path, search_dirs, defaults=defaults)
    text = path.read_text()
    key = (str(path.resolve()), text)
    if key not in _parsed:
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: malformed TOML: {error}") from None
        _parsed[key] = parse_recipe(table, source=str(path), name=path.stem)
    return _parsed[key]


__all__ = ["ENV_VAR", "available_recipes", "find_recipe", "load_recipe", "recipe_dirs", "shipped_recipe_dir"]
