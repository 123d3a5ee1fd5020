"""docs/spec.md documents every spec key with the type and default of the dataclasses that validate a spec."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mxlab.experiment import spec_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "spec.md"


def walk(cls: type, prefix: str = "") -> set[str]:
    """Every field name of `cls`, nested dataclasses descended into (`train.lr`)."""
    import typing

    hints = typing.get_type_hints(cls)
    names = set()
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            names |= walk(hints[field.name], f"{prefix}{field.name}.")
        else:
            names.add(prefix + field.name)
    return names


def test_the_committed_document_is_the_generated_one():
    text = DOC.read_text()
    assert spec_doc.problems(text) == []
    assert spec_doc.render(text) == text


def test_every_field_of_the_spec_dataclasses_is_documented():
    from mxlab.data import SOURCES, config_class
    from mxlab.experiment.spec import TOP_LEVEL_KEYS, ExperimentSpec
    from mxlab.models import ModelConfig

    _, documented, _ = spec_doc.parse(DOC.read_text())
    tables = {
        "[train]": "train",
        "[report]": "report",
        "[execution]": "execution",
        "[gate]": "gate",
        "[tasks]": "tasks",
    }
    written = {f"{tables[table]}.{key}" if table in tables else key for table, key in documented}
    nested = {name for name in walk(ExperimentSpec) if "." in name}
    top = {name for name in walk(ExperimentSpec) if name in TOP_LEVEL_KEYS and name not in ("data", "model")}
    assert nested and nested <= written
    assert top <= written
    model = {key for table, key in documented if table == "[model]"}
    assert model == {f.name for f in dataclasses.fields(ModelConfig)}
    for source in SOURCES:
        keys = {key for table, key in documented if table == f'[data] source = "{source}"'}
        assert {f.name for f in dataclasses.fields(config_class(source))} <= keys, source


def test_a_missing_key_is_found():
    lines = [line for line in DOC.read_text().splitlines() if not line.startswith("| `lr_decay_steps` |")]
    text = "\n".join(lines) + "\n"
    assert spec_doc.problems(text) == ["missing: [train] lr_decay_steps"]
    assert spec_doc.render(text) != text


def test_a_documented_key_that_no_longer_exists_is_found():
    text = DOC.read_text().replace(
        "| `spike_factor` |", "| `retired_knob` | int | `3` | a key no dataclass has |\n| `spike_factor` |"
    )
    assert spec_doc.problems(text) == ["no such key: [train] retired_knob"]
    assert "retired_knob" not in spec_doc.render(text)


def test_a_changed_default_is_found():
    text = DOC.read_text().replace("| `lr` | float | `0.001` |", "| `lr` | float | `0.003` |")
    assert spec_doc.problems(text) == ["[train] lr: documented as float, `0.003`; the dataclass says float, `0.001`"]


def test_a_key_added_to_a_dataclass_is_found(monkeypatch):
    from mxlab.experiment import spec

    @dataclasses.dataclass(frozen=True)
    class Grown(spec.ExecutionConfig):
        new_knob: float = 0.5

    monkeypatch.setattr(spec, "ExecutionConfig", Grown)
    text = DOC.read_text()
    assert spec_doc.problems(text) == ["missing: [execution] new_knob"]
    rebuilt = spec_doc.render(text)
    assert "| `new_knob` | float | `0.5` | (not yet described) |" in rebuilt
    assert spec_doc.problems(rebuilt) == ["[execution] new_knob: no meaning written"]


def test_the_command_rewrites_and_checks(tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    stale = tmp_path / "spec.md"
    stale.write_text(DOC.read_text().replace("| `lr` | float | `0.001` |", "| `lr` | int | `1` |"))
    checked = CliRunner().invoke(app, ["spec-doc", "--check", str(stale)])
    assert checked.exit_code == 1 and "[train] lr: documented as int, `1`" in checked.output
    assert CliRunner().invoke(app, ["spec-doc", str(stale)]).exit_code == 0
    assert stale.read_text() == DOC.read_text()


@pytest.mark.parametrize(
    "annotation, words",
    [(int, "int"), (int | None, "int or none"), (tuple[str, ...], "list of str"), (dict[str, float], "table of float")],
)
def test_type_words(annotation, words):
    assert spec_doc.type_text(annotation) == words
