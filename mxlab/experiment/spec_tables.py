"""The [data], [model], [tasks] and [report] tables of an experiment spec: plug-ins checked by their owners."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mxlab.data import SOURCE_REGISTRY, source_tasks
from mxlab.experiment.report_settings import TASK_NAMES, ReportSettings
from mxlab.tables import recorded_table
from mxlab.tasks import TaskSet


def validate_data_table(data: Any) -> dict[str, Any]:
    """The [data] table with its source's defaults filled in; refuses a table without a source, an unknown
    source or an import path that does not import (mxlab.registry), and what the source's validator refuses."""
    if not isinstance(data, Mapping):
        raise ValueError(f"[data] must be a table, got {data!r}")
    source = data.get("source")
    if source is None:
        raise ValueError(f"[data] needs a source; accepted sources: {', '.join(SOURCE_REGISTRY)}")
    SOURCE_REGISTRY.resolve(source)
    validator = _find_validator("mxlab.data", ("validate_data_config",))
    return _resolved(validator(dict(data)) if validator is not None else None, data)


def validate_model_table(model: Any) -> dict[str, Any]:
    """The [model] table with the GEM-like model's defaults filled in (a plug-in builder's table as given);
    refuses a builder that does not import and what mxlab.models.validate_model_table refuses."""
    if not isinstance(model, Mapping):
        raise ValueError(f"[model] must be a table, got {model!r}")
    validator = _find_validator("mxlab.models", ("validate_model_table", "validate_model_config"))
    return _resolved(validator(dict(model)) if validator is not None else None, model)


def _resolved(validated: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The table with its owner's defaults filled in (when the validator returns a dataclass: `recorded_table`, or a
    mapping)."""
    if dataclasses.is_dataclass(validated) and not isinstance(validated, type):
        return recorded_table(validated)
    if isinstance(validated, Mapping):
        return dict(validated)
    return dict(given)


def _find_validator(module_name: str, names: Sequence[str]) -> Any:
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    for name in names:
        function = getattr(module, name, None)
        if callable(function):
            return function
    return None


def study_tasks(tasks: TaskSet, source: str) -> tuple[str, ...]:
    """The tasks a study evaluates: under ESMM those `source` labels (mxlab.data.source_tasks), else the heads."""
    return source_tasks(source) if tasks.relation == "esmm" else tasks.heads


def report_settings(table: Any, source: str | None = None, tasks: TaskSet | None = None) -> ReportSettings:
    """The [report] table as ReportSettings (primary metrics, margins, correction), its defaults kept to
    the study's tasks (`study_tasks`; every ESMM task when `source` is None).

    Refuses what ReportSettings.from_dict refuses (unknown key or metric, wrong type, negative
    margin, a task the source does not label), naming the [report] table.
    """
    if not isinstance(table, Mapping):
        raise ValueError(f"[report] must be a table, got {table!r}")
    try:
        names = study_tasks(tasks or TaskSet(), source) if source is not None else TASK_NAMES
        return ReportSettings.from_dict(dict(table), tasks=names)
    except ValueError as error:
        raise ValueError(f"[report]: {error}") from error
