"""The layer rule of docs/INTERFACES.md: imports go down the table only, and no import circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layer_table() -> dict[str, int]:
    """Module prefix -> rank, read from the '## Layers' table of docs/INTERFACES.md."""
    text = (ROOT / "docs" / "INTERFACES.md").read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    ranks: dict[str, int] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for prefix in re.findall(r"`(mxlab[\w.]*)`", cells[2]):
                ranks[prefix] = int(cells[0])
    return ranks


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name (kernels/ is mxlab.kernels)."""
    modules = {}
    for base, package in ((ROOT / "mxlab", "mxlab"), (ROOT / "kernels", "mxlab.kernels")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its file (function-local imports too)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target != "mxlab":
                found.add(target)
    return found


def rank_of(name: str, ranks: dict[str, int]) -> int | None:
    prefixes = [prefix for prefix in ranks if name == prefix or name.startswith(prefix + ".")]
    return ranks[max(prefixes, key=len)] if prefixes else None


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_every_module_has_a_layer():
    ranks = layer_table()
    assert len(ranks) >= 10, "the layer table of docs/INTERFACES.md was not found"
    unplaced = sorted(name for name in module_files() if name != "mxlab" and rank_of(name, ranks) is None)
    assert unplaced == [], f"modules outside the layer table of docs/INTERFACES.md: {unplaced}"


def test_no_import_reaches_a_higher_layer():
    ranks = layer_table()
    upward = []
    for name, targets in import_graph().items():
        own = rank_of(name, ranks)
        for target in targets:
            other = rank_of(target, ranks)
            if own is not None and other is not None and other > own:
                upward.append(f"{name} (rank {own}) imports {target} (rank {other})")
    assert upward == [], "imports against the layer table:\n" + "\n".join(sorted(upward))


def test_no_import_circle():
    graph = import_graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                circles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert circles == [], "import circles:\n" + "\n".join(" -> ".join(circle) for circle in circles)


def test_the_check_sees_a_planted_upward_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from mxlab.report import build\n")
    modules = module_files()
    targets = imports_of("mxlab.numerics.planted", planted, modules)
    ranks = layer_table()
    assert "mxlab.report.build" in targets
    assert rank_of("mxlab.report.build", ranks) > rank_of("mxlab.numerics.planted", ranks)


# Layers that must reach a package only through its interface, never its modules: (importer, forbidden).
# The experiment asks mxlab.recipe (unavailable_reason, apply_recipe) and never imports a backend.
SEALED = (("mxlab.experiment", "mxlab.recipe.backends"),)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def sealed_imports(graph: dict[str, set[str]]) -> list[str]:
    """'importer imports target' for every import of a SEALED pair in `graph`."""
    return sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        for importer, forbidden in SEALED
        if _within(name, importer)
        for target in targets
        if _within(target, forbidden)
    )


def test_sealed_packages_are_reached_through_their_interface_only():
    found = sealed_imports(import_graph())
    assert found == [], "imports of sealed modules (ask their package's interface instead):\n" + "\n".join(found)


def test_the_seal_check_sees_a_planted_backend_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from mxlab.recipe.backends.te import recipe_unavailable_reason\n")
    graph = import_graph()
    graph["mxlab.experiment.planted"] = imports_of("mxlab.experiment.planted", planted, module_files())
    assert sealed_imports(graph) == ["mxlab.experiment.planted imports mxlab.recipe.backends.te"]
