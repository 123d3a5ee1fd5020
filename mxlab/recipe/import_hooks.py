"""Acting on a module of torch as soon as it is imported, without importing it (Dynamo and Inductor take seconds to
import, and a process that never compiles never needs them)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `action(module)` right after the module `name` is first imported; then leaves sys.meta_path."""

    def __init__(self, name: str, action: Callable[[types.ModuleType], None]) -> None:
        self.name, self.action = name, action

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            self.action(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, action: Callable[[types.ModuleType], None]) -> None:
    """`action(module)` on the module `name`: now when it is imported, else right after its first import (once,
    however often this is called for the same name and action before then)."""
    module = sys.modules.get(name)
    if module is not None:
        action(module)
    elif not any(
        isinstance(finder, _AfterImport) and finder.name == name and finder.action == action for finder in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterImport(name, action))
