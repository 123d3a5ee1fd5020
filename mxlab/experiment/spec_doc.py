"""docs/spec.md from the spec's dataclasses: every key of an experiment spec by table, with its type and default.

The keys, types and defaults come from the dataclasses that validate a spec (ExperimentSpec, TrainConfig,
ReportSettings, ExecutionConfig, GateConfig, ModelConfig and each data source's config); the meaning of
each key is prose kept in the document itself. `render` rebuilds the document from the dataclasses and the
meanings already written, so a key added to a dataclass appears (with an empty meaning), a removed one
disappears and a changed default is rewritten; `problems` says how a document differs from that.
`mxlab spec-doc docs/spec.md` rewrites the file, `--check` only reports.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

SOURCE_TABLES = ("synthetic", "movielens-100k", "criteo")
# [data] keys of a source that are not fields of its config (they resolve into fields): type, default
TABLE_ONLY_KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "synthetic": {"preset": ("str", "not set"), "eval_impressions_per_user": ("int", "not set")}
}
EMPTY_MEANING = "(not yet described)"
HEADER = "| key | type | default | meaning |"
ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| (?P<type>.*?) \| (?P<default>.*?) \| (?P<meaning>.*) \|$")


@dataclass(frozen=True)
class SpecKey:
    """One key of a spec: its table heading, name, type and default as the document shows them."""

    table: str
    key: str
    type: str
    default: str


def type_text(annotation: Any) -> str:
    """An annotation in words without `|` (a table cell): `int or none`, `list of str`, `table of float`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "none"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(arm) for arm in args)
    if origin in (tuple, list):
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {type_text(args[1])}" if args else "table"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: dataclasses.Field) -> str:
    """A field's default as TOML would write it (`"adamw"`, `0.01`, `[32]`, `{}`), `required` without one."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, repr(value))
    return str(value)


def _rows(table: str, cls: type, only: tuple[str, ...] | None = None) -> list[SpecKey]:
    hints = typing.get_type_hints(cls)
    return [
        SpecKey(table, f.name, type_text(hints[f.name]), default_text(f))
        for f in dataclasses.fields(cls)
        if only is None or f.name in only
    ]


def tables() -> dict[str, type]:
    """Table heading -> the dataclass that validates it (the top level is ExperimentSpec's plain keys)."""
    from mxlab.data import config_class
    from mxlab.experiment.gate import GateConfig
    from mxlab.experiment.report_settings import ReportSettings
    from mxlab.experiment.spec import ExecutionConfig, ExperimentSpec, TrainConfig
    from mxlab.models import ModelConfig
    from mxlab.models.dcn import DCNConfig
    from mxlab.tasks import TaskSet

    return {
        "top level": ExperimentSpec,
        **{f'[data] source = "{source}"': config_class(source) for source in SOURCE_TABLES},
        "[model]": ModelConfig,
        '[model] builder = "dcn"': DCNConfig,
        "[tasks]": TaskSet,
        "[train]": TrainConfig,
        "[report]": ReportSettings,
        "[execution]": ExecutionConfig,
        "[gate]": GateConfig,
    }


def spec_keys() -> list[SpecKey]:
    """Every key a spec accepts, table by table, from the dataclasses (walked with dataclasses.fields)."""
    from mxlab.experiment.spec import TOP_LEVEL_KEYS

    keys: list[SpecKey] = []
    for heading, cls in tables().items():
        if heading == "top level":
            hints = typing.get_type_hints(cls)
            nested = [
                k for k in TOP_LEVEL_KEYS if dataclasses.is_dataclass(hints[k]) or typing.get_origin(hints[k]) is dict
            ]
            keys += _rows(heading, cls, tuple(k for k in TOP_LEVEL_KEYS if k not in nested))
            continue
        keys += _rows(heading, cls)
        source = heading.split('"')[1] if heading.startswith("[data]") else None
        for key, (kind, default) in TABLE_ONLY_KEYS.get(source, {}).items():
            keys.append(SpecKey(heading, key, kind, default))
    return keys


def parse(text: str) -> tuple[str, dict[tuple[str, str], SpecKey], dict[tuple[str, str], str]]:
    """(the text before the first table heading, the documented keys, their meanings) of a spec.md text."""
    intro, _, rest = text.partition("\n## ")
    documented: dict[tuple[str, str], SpecKey] = {}
    meanings: dict[tuple[str, str], str] = {}
    heading = None
    for line in ("## " + rest).splitlines() if rest else []:
        if line.startswith("## "):
            heading = line[3:].strip()
        elif heading and (match := ROW.match(line)):
            documented[(heading, match["key"])] = SpecKey(heading, match["key"], match["type"], match["default"])
            meanings[(heading, match["key"])] = match["meaning"].strip()
    return intro.rstrip("\n"), documented, meanings


def render(text: str) -> str:
    """The document `text` rebuilt from the dataclasses, keeping its intro and each key's written meaning."""
    intro, _, meanings = parse(text)
    lines = [intro]
    heading = None
    for key in spec_keys():
        if key.table != heading:
            heading = key.table
            lines += ["", f"## {heading}", "", HEADER, "|---|---|---|---|"]
        meaning = meanings.get((key.table, key.key)) or EMPTY_MEANING
        lines.append(f"| `{key.key}` | {key.type} | {key.default} | {meaning} |")
    return "\n".join(lines) + "\n"


def problems(text: str) -> list[str]:
    """How a spec.md text differs from the dataclasses: a key missing, documented but gone, with another
    type or default, or without a meaning ([] = it matches and `render` gives it back unchanged)."""
    _, documented, meanings = parse(text)
    expected = {(key.table, key.key): key for key in spec_keys()}
    found = [f"missing: {table} {key}" for (table, key) in expected if (table, key) not in documented]
    found += [f"no such key: {table} {key}" for (table, key) in documented if (table, key) not in expected]
    for name, key in expected.items():
        written = documented.get(name)
        if written is not None and (written.type, written.default) != (key.type, key.default):
            found.append(
                f"{key.table} {key.key}: documented as {written.type}, {written.default}; "
                f"the dataclass says {key.type}, {key.default}"
            )
        if written is not None and meanings[name] in ("", EMPTY_MEANING):
            found.append(f"{key.table} {key.key}: no meaning written")
    if not found and render(text) != text:
        found.append("the tables are not in the order and layout `mxlab spec-doc` writes")
    return found
