"""Plug-ins by name: a registry resolves a registered name or an import path ``"pkg.module:attr"``.

The built-in model builders and data sources register here by import path (strings, so a layer
imports nothing of a higher one); a spec names one of them, or any importable object by its path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any


def import_object(path: str, what: str) -> Any:
    """Return the object at `path` ("pkg.module:attr", attr may be dotted). Refuses (ValueError) a path
    without one ':', a module that does not import and a missing attribute, naming the path and `what` it is."""
    module_name, sep, attr = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not sep or not module_name or not attr or ":" in attr:
        raise ValueError(f"{what} {path!r} is not an import path; accepted: 'pkg.module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{what} {path!r}: module {module_name!r} does not import ({error})") from error
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


class Registry(Mapping[str, str]):
    """Name -> import path of the built-ins of one kind (`what`, e.g. "data source"); a mapping of names."""

    def __init__(self, what: str, builtins: Mapping[str, str]) -> None:
        self.what = what
        self._paths = dict(builtins)

    def __getitem__(self, name: str) -> str:
        return self._paths[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._paths)

    def register(self, name: str, path: str) -> None:
        """Register `path` ("pkg.module:attr") under `name`; refuses a name already taken or a name with ':'."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{self.what} name {name!r} must be a non-empty string without ':'")
        if name in self._paths and self._paths[name] != path:
            raise ValueError(f"{self.what} {name!r} is already registered as {self._paths[name]!r}")
        self._paths[name] = path

    def is_known(self, name: Any) -> bool:
        """True for a registered name or a string that looks like an import path (has a ':')."""
        return isinstance(name, str) and (name in self._paths or ":" in name)

    def resolve(self, name: Any) -> Callable[..., Any]:
        """Return the callable a registered name or an import path names. Refuses (ValueError) anything else,
        a path that does not import and an object that is not callable, naming the value and the accepted names."""
        if not self.is_known(name):
            raise ValueError(
                f"unknown {self.what} {name!r}; accepted: {', '.join(self._paths)} or an import path 'pkg.module:attr'"
            )
        target = import_object(self._paths.get(name, name), self.what)
        if not callable(target):
            raise ValueError(f"{self.what} {name!r} is {type(target).__name__}, not callable; expected a callable")
        return target
