"""Rerunning a study's diverged runs with changed train settings (`mxlab run --resume --rerun-diverged`).

Each diverged run's folder and record are moved aside to DIR/diverged/N/ (runs/ARM/seedK, records/ARM/seedK.npz;
N counts the study's reruns from 1), never deleted; the run then trains from scratch with the spec's settings,
which may differ from the recorded study in train.* keys only (its config.json shows them). study.json keeps
the spec as recorded and gains one "reruns" entry per invocation: {runs, changed: {"train.KEY": [recorded, now]},
reason: "diverged", command, moved_to}. A plain `--resume` afterwards compares against the recorded spec and
refuses while a rerun is unfinished; the report warns about every rerun (mxlab.report.decision).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mxlab import io
from mxlab.experiment.artefacts import read_done, run_is_complete
from mxlab.experiment.integrity import RERUNS, unfinished_reruns
from mxlab.experiment.records import read_record, record_is_done, record_path, study_records
from mxlab.experiment.runner import settings_changes
from mxlab.experiment.spec import ExperimentSpec
from mxlab.experiment.study_jobs import FORK_DIR

ASIDE = "diverged"  # DIR/diverged/N: the folders and records of the runs the N-th rerun replaced


def train_changes(spec: ExperimentSpec, study: dict[str, Any]) -> dict[str, list[Any]]:
    """{"train.KEY": [recorded, now]} for each train setting of `spec` that differs from the study record.

    Refuses (ValueError naming the key) a changed data or model setting, and no changed train setting at all.
    """
    changes = settings_changes(study, spec)
    other = [key for key, _, _ in changes if not key.startswith("train.")]
    if other:
        raise ValueError(
            f"--rerun-diverged may change train.* settings only; {other[0]} differs from the recorded study "
            f"({', '.join(other)}); use the recorded value, or a fresh --out for other settings"
        )
    if not changes:
        raise ValueError(
            "--rerun-diverged needs a changed train setting (--set train.KEY=VALUE): with the recorded settings "
            "the runs would diverge again"
        )
    return {key: [old, new] for key, old, new in changes}


def diverged_runs(out_dir: Path) -> list[str]:
    """Labels (ARM/seedK) of the runs whose done.json, or record when the folder is gone, says diverged."""
    out_dir = Path(out_dir)
    runs = out_dir / "runs"
    labels = {
        f"{folder.parent.name}/{folder.name}"
        for folder in (runs.glob("*/seed*") if runs.is_dir() else [])
        if (read_done(folder) or {}).get("status") == "diverged"
    }
    for path in study_records(out_dir):
        label = f"{path.parent.name}/{path.stem}"
        if not (runs / label).is_dir() and read_record(path, predictions=False).done.get("status") == "diverged":
            labels.add(label)
    return sorted(labels)


def _not_done(spec: ExperimentSpec, out_dir: Path) -> list[str]:
    """Labels of the spec's runs (warm-ups included) with neither a done run folder nor a record."""
    arms = [*spec.arms, *([FORK_DIR] if spec.train.fork_from else [])]
    return [
        f"{arm}/seed{seed}"
        for seed in spec.seeds
        for arm in arms
        if not run_is_complete(out_dir / "runs" / arm / f"seed{seed}") and not record_is_done(out_dir, arm, seed)
    ]


def prepare_rerun(spec: ExperimentSpec, out_dir: Path, command: str) -> list[str]:
    """Move the diverged runs of the study in `out_dir` aside and record the rerun in its study.json; return the
    labels to train now (those of an unfinished earlier rerun with the same changes, else the diverged runs;
    [] when none diverged).

    Refuses a folder without study.json, changed settings outside train.* or none changed, an unfinished rerun
    with other changes, and runs that are neither done nor diverged (finish them with a plain --resume first).
    """
    out_dir = Path(out_dir)
    study_path = out_dir / "study.json"
    if not study_path.is_file():
        raise ValueError(f"--rerun-diverged: {out_dir} is not a study folder (no study.json); run the study first")
    study = io.read_json(study_path)
    changed = train_changes(spec, study)
    unfinished = unfinished_reruns(out_dir, study)
    if unfinished:
        entry = next(iter(unfinished.values()))
        if entry.get("changed") != changed:
            raise ValueError(
                f"runs {', '.join(unfinished)} are being rerun with {entry.get('changed')}, not {changed}; "
                f"continue that rerun with its --set values"
            )
        return sorted(unfinished)
    labels = diverged_runs(out_dir)
    open_runs = [label for label in _not_done(spec, out_dir) if label not in labels]
    if open_runs:
        raise ValueError(
            f"runs {', '.join(open_runs)} are not done; finish them with a plain --resume before --rerun-diverged"
        )
    if not labels:
        return []
    reruns = list(study.get(RERUNS) or [])
    aside = out_dir / ASIDE / str(len(reruns) + 1)
    for label in labels:
        arm, _, seed = label.partition("/seed")
        for source, target in (
            (out_dir / "runs" / label, aside / "runs" / label),
            (record_path(out_dir, arm, int(seed)), aside / "records" / f"{label}.npz"),
        ):
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
    entry = {
        "runs": labels,
        "changed": changed,
        "reason": "diverged",
        "command": command,
        "moved_to": str(aside.relative_to(out_dir)),
    }
    io.write_json(study_path, {**study, RERUNS: [*reruns, entry]})
    return labels
