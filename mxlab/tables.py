"""TOML tables into dataclasses: the one validator of the keys and value types of every table.

`table_to_dataclass` builds a dataclass from a table (a spec's [train], [execution] and [gate], a recipe's
[loss_scaling], a data source's or model's config), checking that it is a table, that every key is a field
and that every value has the field's type (int, float, str, bool, lists of those, unions, None for an
optional field). The checks of a table's meaning (ranges, names) stay with its owner.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_PLURALS = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}


def type_words(annotation: Any) -> str:
    """An annotation as an error message says it: 'an integer', 'a list of strings', 'an integer or a string'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # an optional field's None is its default: TOML writes no null
        return " or ".join(type_words(arm) for arm in args if arm is not type(None))
    if origin in (tuple, list):
        return f"a list of {_PLURALS.get(args[0], str(args[0]))}" if args else "a list"
    return _WORDS.get(annotation, str(annotation))


def _converted(annotation: Any, value: Any) -> tuple[bool, Any]:
    """(whether `value` has the type `annotation`, the value as the field keeps it: an int as a float for a
    float, a list as a tuple for a tuple); an annotation other than those of type_words takes any value."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            ok, converted = _converted(arm, value)
            if ok:
                return True, converted
        return False, value
    if annotation is type(None):
        return value is None, value
    if annotation in _WORDS:
        if isinstance(value, bool) and annotation is not bool:
            return False, value
        if annotation is float and isinstance(value, int):
            return True, float(value)
        return isinstance(value, annotation), value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False, value
        items = [_converted(args[0] if args else Any, item) for item in value]
        return all(ok for ok, _ in items), origin(item for _, item in items)
    return True, value


def check_value(value: Any, annotation: Any, where: str) -> Any:
    """Return `value` as a field of type `annotation` keeps it (ints of a float field as floats, a list of a
    tuple field as a tuple); refuses (ValueError) another type: "WHERE must be TYPE, got VALUE (ITS TYPE)"."""
    ok, converted = _converted(annotation, value)
    if not ok:
        raise ValueError(f"{where} must be {type_words(annotation)}, got {value!r} ({type(value).__name__})")
    return converted


def check_keys(table: Mapping[str, Any], accepted: Sequence[str], name: str, where: str | None = None) -> None:
    """Refuses (ValueError) the first key of `table` not in `accepted`, naming it as NAME.KEY (KEY alone for
    the top level, `name` "") and listing the accepted keys (in `where`, default [NAME])."""
    unknown = [key for key in table if key not in accepted]
    if unknown:
        key = f"{name}.{unknown[0]}" if name else unknown[0]
        place = f" in {where or f'[{name}]'}" if name else ""
        raise ValueError(f"unknown key {key!r}; accepted keys{place}: {', '.join(accepted)}")


def table_to_dataclass(
    cls: type[T], table: Any, name: str, *, where: str | None = None, ignore: Sequence[str] = ()
) -> T:
    """Return `cls(**table)`, each value as `check_value` returns it; keys in `ignore` are left out.

    Refuses (ValueError) a `table` that is not a mapping, a key that is not a field of `cls` (`check_keys`,
    the accepted keys listed with `ignore` first) and a value of another type than its field's, naming
    NAME.KEY, the value and the expected type. `where` names the table in messages (default [NAME], e.g.
    "[data] for source 'synthetic'"). Domain checks (ranges, names) are the caller's or `cls`'s own.
    """
    where = where or f"[{name}]"
    if not isinstance(table, Mapping):
        raise ValueError(f"{where} must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    fields = field_names(cls)
    check_keys(table, (*ignore, *fields), name, where)
    values = {
        key: check_value(value, hints[key], f"{name}.{key}" if name else key)
        for key, value in table.items()
        if key not in ignore
    }
    return cls(**values)


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of the dataclass `cls`, in order."""
    return tuple(field.name for field in dataclasses.fields(cls))


OMITTED_AT_DEFAULT = {"omitted_at_default": True}  # a field's metadata: `recorded_table` leaves it out at its default


def recorded_table(config: Any) -> dict[str, Any]:
    """A dataclass instance as the table a study records (tuples as lists), without the fields whose metadata is
    OMITTED_AT_DEFAULT while they hold their default: a key added later leaves the records of earlier studies
    (study.json and the digests of their run records) as they were."""
    omitted = {f.name: f.default for f in dataclasses.fields(config) if f.metadata.get("omitted_at_default")}
    return {
        key: (list(value) if isinstance(value, tuple) else value)
        for key, value in dataclasses.asdict(config).items()
        if not (key in omitted and value == omitted[key])
    }


__all__ = [
    "OMITTED_AT_DEFAULT",
    "check_keys",
    "check_value",
    "field_names",
    "recorded_table",
    "table_to_dataclass",
    "type_words",
]
