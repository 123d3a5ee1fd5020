"""Turning a TOML table (a dict) into a validated dataclass: unknown keys and wrong types are refused."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _accepts(annotation: Any, value: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(arm, value) for arm in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (tuple, list):
        (item,) = typing.get_args(annotation)[:1] or (Any,)
        return isinstance(value, (list, tuple)) and all(_accepts(item, element) for element in value)
    return True


def dataclass_from_config(cls: type[T], config: dict, what: str, ignore: tuple[str, ...] = ()) -> T:
    """Return ``cls(**config)`` after checking every key and value type.

    Refuses (ValueError) a key that is not a field of `cls` (naming it and listing the accepted
    keys) and a value of the wrong type. Keys in `ignore` are skipped. `what` names the table in
    messages, e.g. "[data] for source 'synthetic'".
    """
    if not isinstance(config, dict):
        raise ValueError(f"{what} must be a table (dict); got {type(config).__name__}")
    hints = typing.get_type_hints(cls)
    accepted = [field.name for field in dataclasses.fields(cls)]
    values = {}
    for key, value in config.items():
        if key in ignore:
            continue
        if key not in accepted:
            raise ValueError(f"unknown key {key!r} in {what}; accepted keys: {', '.join(list(ignore) + accepted)}")
        if not _accepts(hints[key], value):
            raise ValueError(f"{what}: {key} = {value!r} has the wrong type; expected {hints[key]}")
        values[key] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def config_keys(cls: type) -> tuple[str, ...]:
    """Return the field names of a config dataclass."""
    return tuple(field.name for field in dataclasses.fields(cls))
