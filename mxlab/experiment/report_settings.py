"""The [report] table of an experiment spec: endpoints, margins, candidate, controls, multiplicity.

The analysis (mxlab/analysis/) reads these settings back from study.json; the schema lives here,
in the experiment layer, so a spec is validated completely before any training.

A compared metric is named ``TASK.METRIC`` (``ctr.ne``, ``ctcvr.excess_ne``, ``cvr.auc``, ...):
tasks ``ctr``, ``cvr``, ``ctcvr``; metrics

- ``ne``: 100 x (NE_arm / NE_baseline - 1), percent of the baseline's NE (worse when positive);
- ``excess_ne``: 100 x (NE_arm - NE_baseline) / (NE_baseline - NE_truth), the share of the
  baseline-to-truth gap the arm adds, in percent (worse when positive; sources with truth only);
- ``auc``: AUC_arm - AUC_baseline (worse when negative);
- ``calibration``: 100 ln(sum p_arm / sum p_baseline), the signed calibration shift in percent (the
  labels cancel; worse in either direction; judged by a two-sided equivalence test);
- ``calibration_error``: |cal_arm - 1| - |cal_baseline - 1| (worse when positive; secondary);
- ``ece``: ECE_arm - ECE_baseline (worse when positive; secondary).

Endpoints (docs/statistics.md): the ``primary`` metrics plus ``TASK.calibration`` of every task in
``calibration_tasks`` (co-primary). Margins are set before the runs: defaults in production units
(0.02% of NE, He et al. 2014's NE; 1% calibration shift).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

TASK_NAMES: tuple[str, ...] = ("ctr", "cvr", "ctcvr")
METRIC_KINDS: tuple[str, ...] = ("ne", "excess_ne", "auc", "calibration", "calibration_error", "ece")


def metric_names(tasks: tuple[str, ...] = TASK_NAMES) -> tuple[str, ...]:
    """Every compared metric name (TASK.KIND) of `tasks`."""
    return tuple(f"{task}.{kind}" for task in tasks for kind in METRIC_KINDS)


METRIC_NAMES: tuple[str, ...] = metric_names()
TRUTH_METRIC_KINDS: tuple[str, ...] = ("excess_ne",)
CORRECTIONS: tuple[str, ...] = ("holm", "bonferroni", "none")
DEFAULT_PRIMARY: tuple[str, ...] = ("ctr.ne", "ctcvr.ne")
# Keys written by earlier versions into study.json's "report"; read back and ignored.
LEGACY_KEYS: tuple[str, ...] = ("bootstrap_resamples", "bootstrap_seed", "min_seeds_for_t", "multiple_testing")
# Which setting holds the default margin of each metric kind.
MARGIN_SETTING: dict[str, str] = {
    "ne": "ne_regression_pct",
    "excess_ne": "excess_ne_pct",
    "auc": "auc_regression",
    "calibration": "calibration_pct",
    "calibration_error": "calibration_tolerance",
    "ece": "ece_regression",
}
MIN_PAIRED_SEEDS = 3
PLATEAU_KEYS: tuple[str, ...] = ("plateau_window", "plateau_tolerance")
CONTROL_ROLES: tuple[str, ...] = ("null", "positive")


def worse_when(metric: str) -> str:
    """'lower' for AUC, 'either' for the signed calibration shift, 'higher' for NE, calibration error, ECE."""
    kind = metric.split(".", 1)[-1]
    return "lower" if kind == "auc" else "either" if kind == "calibration" else "higher"


@dataclass(frozen=True)
class ReportSettings:
    """The validated [report] table.

    ``primary``: the metrics that get verdict words (the others are shown with unadjusted intervals).
    ``margins``: per metric name, overriding the default margin of its kind
    (``ne_regression_pct`` % of NE, ``excess_ne_pct`` % of the baseline-to-truth gap, ``auc_regression``,
    ``calibration_tolerance``, ``ece_regression``). A regression needs its point delta beyond the
    margin; non-inferiority needs the whole interval on the good side of it.
    ``calibration_tasks``: tasks whose signed calibration shift is a co-primary endpoint
    (``calibration_pct``: the equivalence margin, percent).
    ``candidate``: the pre-registered arm(s) to ship or not; ``controls``: arm -> role ("null": must
    show nothing; "positive": a known cost the study must detect); both outside every family.
    ``confidence``: 1 - alpha; ``correction`` (holm by default) within each family.
    ``power``: the power at which the smallest margin and smallest regression are stated.
    ``plateau_window`` (steps; 0 = no rule) and ``plateau_tolerance`` (relative): the plateau rule of the
    baseline's phase before the rate decay (the fork warm-ups in the fork design): a seed passes when its
    held-out NE over the last ``plateau_window`` steps of that phase beats its best earlier value by at most
    ``plateau_tolerance`` of it (mxlab.report.convergence). With no rule the two are not recorded, so the
    digest of a study registered before they existed is unchanged.
    """

    primary: tuple[str, ...] = DEFAULT_PRIMARY
    calibration_tasks: tuple[str, ...] = TASK_NAMES
    candidate: tuple[str, ...] = ()
    controls: dict[str, str] = field(default_factory=dict)
    ne_regression_pct: float = 0.02
    excess_ne_pct: float = 1.0
    auc_regression: float = 0.001
    calibration_pct: float = 1.0
    calibration_tolerance: float = 0.01
    ece_regression: float = 0.001
    margins: dict[str, float] = field(default_factory=dict)
    confidence: float = 0.95
    correction: str = "holm"
    power: float = 0.8
    plateau_window: float = 0
    plateau_tolerance: float = 0.0005

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The co-primary endpoints: the primary metrics, then each calibration task's shift."""
        extra = tuple(f"{t}.calibration" for t in self.calibration_tasks if f"{t}.calibration" not in self.primary)
        return self.primary + extra

    def check_arms(self, arms: list[str] | tuple[str, ...], baseline: str) -> None:
        """Refuses a candidate or control that is not an arm (or is the baseline), or an arm that is both."""
        accepted = [a for a in arms if a != baseline]
        for kind, names in (("candidate", self.candidate), ("controls", tuple(self.controls))):
            for name in names:
                if name not in accepted:
                    raise ValueError(f"report setting {kind} names {name!r}, not a compared arm; accepted: {accepted}")
        both = sorted(set(self.candidate) & set(self.controls))
        if both:
            raise ValueError(f"report setting: {both} cannot be both a candidate and a control")

    def margin(self, metric: str) -> float:
        """The margin of a metric name (``TASK.KIND``); refuses an unknown name, listing the accepted ones."""
        if metric not in METRIC_NAMES and (metric.count(".") != 1 or metric.split(".")[1] not in METRIC_KINDS):
            raise ValueError(
                f"unknown metric {metric!r}; accepted: {', '.join(METRIC_NAMES)}, or TASK.KIND of a declared task"
            )
        if metric in self.margins:
            return self.margins[metric]
        return float(getattr(self, MARGIN_SETTING[metric.split(".", 1)[1]]))

    @classmethod
    def from_dict(
        cls, values: Mapping[str, Any] | None, *, legacy: bool = False, tasks: tuple[str, ...] = TASK_NAMES
    ) -> ReportSettings:
        """Settings from a mapping. Refuses unknown keys, wrong types, an unknown primary metric, a
        negative margin, an unknown correction, naming the value and the accepted ones. ``legacy``
        drops the keys of earlier versions (:data:`LEGACY_KEYS`), for reading old study folders, and there the
        names of tasks outside ``tasks`` (recorded before the source decided the tasks; see :func:`_labelled`).
        ``tasks``: the tasks the data source labels; the default primary metrics and calibration tasks
        keep only those, and a primary metric, calibration task or margin of another task is refused."""
        values = dict(values or {})
        if legacy:
            values = _labelled({k: v for k, v in values.items() if k not in LEGACY_KEYS}, tuple(tasks))
        independent = any(task not in TASK_NAMES for task in tasks)
        if tuple(tasks) != TASK_NAMES:
            primary = (
                [f"{t}.ne" for t in tasks]
                if independent
                else [m for m in DEFAULT_PRIMARY if m.split(".", 1)[0] in tasks]
            )
            values.setdefault("primary", primary)
            values.setdefault("calibration_tasks", list(tasks))
        keys = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(keys))
        if unknown:
            raise ValueError(f"unknown report setting(s) {unknown}; accepted: {keys}")
        accepted = tuple(dict.fromkeys(METRIC_NAMES + metric_names(tuple(tasks))))
        clean: dict[str, Any] = {}
        for name, value in values.items():
            if name == "primary":
                clean[name] = _primary(value, accepted)
            elif name == "margins":
                clean[name] = _margins(value, accepted)
            elif name == "calibration_tasks":
                clean[name] = _names(name, value, tuple(dict.fromkeys(TASK_NAMES + tuple(tasks))), allow_empty=True)
            elif name == "candidate":
                clean[name] = _names(name, [value] if isinstance(value, str) else value, None, allow_empty=True)
            elif name == "controls":
                clean[name] = _controls(value)
            elif name == "correction":
                if value not in CORRECTIONS:
                    raise ValueError(f"report setting correction={value!r}; accepted: {', '.join(CORRECTIONS)}")
                clean[name] = value
            else:
                clean[name] = _number(name, value)
        settings = cls(**clean)
        unlabelled = [
            name
            for name in (*settings.primary, *settings.margins, *settings.calibration_tasks)
            if name.split(".", 1)[0] not in tasks
        ]
        if unlabelled:
            raise ValueError(
                f"report setting names {unlabelled}, but the data source labels only the tasks {list(tasks)}; "
                f"accepted: metrics and calibration tasks of {', '.join(tasks)}"
            )
        for name in MARGIN_SETTING.values():
            if getattr(settings, name) < 0:
                raise ValueError(
                    f"report setting {name}={getattr(settings, name)!r} must be >= 0 (accepted: a number >= 0)"
                )
        if not 0.5 <= settings.confidence < 1:
            raise ValueError(f"report setting confidence={settings.confidence!r}; accepted: a number in [0.5, 1)")
        if not 0.5 <= settings.power < 1:
            raise ValueError(f"report setting power={settings.power!r}; accepted: a number in [0.5, 1)")
        if settings.plateau_window < 0 or settings.plateau_window != int(settings.plateau_window):
            raise ValueError(
                f"report setting plateau_window={settings.plateau_window!r}; accepted: a whole number of steps >= 0 "
                "(0: no plateau rule)"
            )
        if not 0 <= settings.plateau_tolerance < 1:
            raise ValueError(
                f"report setting plateau_tolerance={settings.plateau_tolerance!r}; accepted: a number in [0, 1) "
                "(a share of the NE)"
            )
        return settings

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (what study.json records), read back by :meth:`from_dict`; without the plateau
        rule's keys when there is no rule."""
        unset = PLATEAU_KEYS if not self.plateau_window else ()
        return {
            f.name: (
                list(v) if isinstance(v := getattr(self, f.name), tuple) else dict(v) if isinstance(v, dict) else v
            )
            for f in fields(self)
            if f.name not in unset
        }

    def digest(self) -> str:
        """SHA-256 of the settings as canonical JSON (sorted keys): what pre-registration records."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _labelled(values: dict[str, Any], tasks: tuple[str, ...]) -> dict[str, Any]:
    """Recorded settings without the primary metrics, calibration tasks and margins of tasks outside `tasks`
    (a primary left empty is dropped, so its default applies); values of another type are left to validation."""
    if tasks == TASK_NAMES:
        return values

    def keep(name: Any) -> bool:
        return not isinstance(name, str) or name.split(".", 1)[0] in tasks

    out = dict(values)
    for key in ("primary", "calibration_tasks"):
        if isinstance(out.get(key), (list, tuple)):
            out[key] = [name for name in out[key] if keep(name)]
    if isinstance(out.get("margins"), Mapping):
        out["margins"] = {name: margin for name, margin in out["margins"].items() if keep(name)}
    if out.get("primary") == []:
        del out["primary"]
    return out


def _names(name: str, value: Any, accepted: tuple[str, ...] | None, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or (not value and not allow_empty):
        raise ValueError(f"report setting {name}={value!r} must be a list of names")
    for item in value:
        if not isinstance(item, str) or (accepted is not None and item not in accepted):
            shown = f"; accepted: {', '.join(accepted)}" if accepted else ""
            raise ValueError(f"report setting {name} names {item!r}{shown}")
    if len(set(value)) != len(value):
        raise ValueError(f"report setting {name}={list(value)!r} repeats a name")
    return tuple(value)


def _controls(value: Any) -> dict[str, str]:
    """A list of arms (role "null" for a placebo, "positive" otherwise) or a table arm = role."""
    if isinstance(value, (list, tuple)):
        names = _names("controls", value, None, allow_empty=True)
        return {n: "null" if n.startswith("placebo") else "positive" for n in names}
    if not isinstance(value, Mapping):
        raise ValueError(f"report setting controls={value!r} must be a list of arms or a table arm = role")
    for arm, role in value.items():
        if role not in CONTROL_ROLES:
            raise ValueError(f"report setting controls.{arm}={role!r}; accepted: {', '.join(CONTROL_ROLES)}")
    return dict(value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"report setting {name}={value!r} must be a number")
    return float(value)


def _primary(value: Any, accepted: tuple[str, ...] = METRIC_NAMES) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f"report setting primary={value!r} must be a non-empty list of metric names; "
            f"accepted names: {', '.join(accepted)}"
        )
    for name in value:
        if name not in accepted:
            raise ValueError(f"report setting primary names unknown metric {name!r}; accepted: {', '.join(accepted)}")
    if len(set(value)) != len(value):
        raise ValueError(f"report setting primary={list(value)!r} repeats a metric")
    return tuple(value)


def _margins(value: Any, accepted: tuple[str, ...] = METRIC_NAMES) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"report setting margins={value!r} must be a table of metric name = margin")
    out = {}
    for name, margin in value.items():
        if name not in accepted:
            raise ValueError(f"report setting margins names unknown metric {name!r}; accepted: {', '.join(accepted)}")
        out[name] = _number(f"margins.{name}", margin)
        if out[name] < 0:
            raise ValueError(f"report setting margins.{name}={margin!r} must be >= 0 (accepted: a number >= 0)")
    return out
