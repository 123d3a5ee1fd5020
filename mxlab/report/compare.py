"""How two studies differ: their specs key by key, and the primary verdicts and deltas of the arms they share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mxlab.analysis import analyze_study, load_study
from mxlab.report.build import format_interval


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def compare_studies(dir_a: str | os.PathLike, dir_b: str | os.PathLike) -> str:
    """Markdown: how two studies differ in their spec (study.json, key by key) and in their primary verdicts and
    deltas for the arms they share (each analyzed from its files). Refuses folders without study.json."""
    a_dir, b_dir = Path(dir_a), Path(dir_b)
    study_a, study_b = load_study(a_dir), load_study(b_dir)
    flat_a, flat_b = _flatten(study_a.spec), _flatten(study_b.spec)
    lines = [f"# Comparing studies A = `{a_dir}` ({study_a.name}) and B = `{b_dir}` ({study_b.name})", ""]
    differing = [
        k
        for k in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(k, "(absent)") != flat_b.get(k, "(absent)") and not k.startswith("truth.") and k != "created"
    ]
    lines += ["## Spec differences", ""]
    if differing:
        lines += ["| key | A | B |", "|---|---|---|"]
        lines += [
            f"| {k} | {json.dumps(flat_a.get(k, '(absent)'))} | {json.dumps(flat_b.get(k, '(absent)'))} |"
            for k in differing
        ]
    else:
        lines.append("The two specs are identical.")
    if study_a.baseline != study_b.baseline:
        lines += [
            "",
            f"**The baselines differ** (A: {study_a.baseline}, B: {study_b.baseline}): deltas are not comparable.",
        ]
    analysis_a, analysis_b = analyze_study(study_a), analyze_study(study_b)
    arms = [a for a in study_a.arms if a in study_b.arms and a not in (study_a.baseline, study_b.baseline)]
    lines += ["", "## Primary verdicts", ""]
    if not arms:
        return "\n".join(lines + ["The studies share no compared arm."]) + "\n"
    lines += ["| arm | metric | A | B |", "|---|---|---|---|"]
    for arm in arms:
        for metric in dict.fromkeys(list(analysis_a.settings.primary) + list(analysis_b.settings.primary)):
            ca, cb = analysis_a.comparison(arm, metric), analysis_b.comparison(arm, metric)
            cell = lambda c: "-" if c is None else f"{c.verdict or 'secondary'}: {format_interval(c)}"  # noqa: E731
            changed = " (changed)" if ca and cb and ca.verdict != cb.verdict else ""
            lines.append(f"| {arm} | {metric} | {cell(ca)} | {cell(cb)}{changed} |")
    return "\n".join(lines) + "\n"
