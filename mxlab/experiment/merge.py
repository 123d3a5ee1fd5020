"""Merge study folders of run records (from several machines or days) into one study folder.

The folders must be one study: the same spec (mxlab.experiment.records.spec_identity: everything but the
seeds, the execution and the paths), the same eval set and the same numerics version. The merged folder
holds study.json (the first folder's, with the union of the seeds, sorted, and `merged_from`) and records/;
its report (`mxlab report`) is the one the full run folders give.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mxlab import io
from mxlab.experiment.integrity import relative_to_study
from mxlab.experiment.records import (
    EVAL_SET,
    RECORDS,
    read_eval_set,
    read_record,
    record_path,
    spec_digest,
    spec_identity,
    study_records,
)
from mxlab.experiment.runner import changed_keys, short_value


def _read_source(folder: Path) -> dict[str, Any]:
    """study.json and the record files of a source folder. Refuses one without study.json or records."""
    study_path = folder / "study.json"
    if not study_path.is_file():
        raise ValueError(f"cannot merge {folder}: no study.json (a study folder written by `mxlab run`)")
    records = study_records(folder)
    if not records:
        raise ValueError(
            f"cannot merge {folder}: it holds no run records ({folder / RECORDS}/ARM/seedK.npz); "
            f"`mxlab run SPEC --resume --out {folder}` writes them for its finished runs"
        )
    return {"folder": folder, "study": io.read_json(study_path), "records": records}


def _check_same_study(first: dict[str, Any], other: dict[str, Any]) -> None:
    """Refuses (naming the first differing value) two folders whose specs or eval sets differ."""
    a, b = first["folder"], other["folder"]
    changed = changed_keys(spec_identity(first["study"]), spec_identity(other["study"]), "spec")
    if changed:
        key, old, new = changed[0]
        raise ValueError(
            f"cannot merge {b} into {a}: the specs differ at {key.removeprefix('spec.')}: "
            f"{short_value(old)} ({a}) vs {short_value(new)} ({b})"
        )
    has = [(f / RECORDS / EVAL_SET).is_file() for f in (a, b)]
    if not all(has):
        if any(has):
            missing = b if has[0] else a
            raise ValueError(f"cannot merge {b} into {a}: {missing / RECORDS / EVAL_SET} is missing")
        return
    sets = read_eval_set(a), read_eval_set(b)
    for key in sorted(set(sets[0]) | set(sets[1])):
        x, y = sets[0].get(key), sets[1].get(key)
        if x is None or y is None or x.dtype != y.dtype or not np.array_equal(x, y):
            what = "is absent from one" if x is None or y is None else f"differs ({x.size} vs {y.size} values)"
            raise ValueError(
                f"cannot merge {b} into {a}: the eval sets differ: {key!r} {what}; runs scored on different "
                f"eval sets cannot be paired"
            )


def _rebased(study: dict[str, Any], source: Path, out_dir: Path) -> dict[str, Any]:
    """study.json's file paths (written relative to `source`) rewritten relative to `out_dir`."""

    def move(path: str | None) -> str | None:
        return None if path is None else relative_to_study(out_dir, source / path)

    record = dict(study)
    record["recipes"] = {arm: move(path) for arm, path in (record.get("recipes") or {}).items()}
    record["spec_path"] = move(record.get("spec_path"))
    if isinstance(record.get("design"), dict) and record["design"].get("recipe"):
        record["design"] = {**record["design"], "recipe": move(record["design"]["recipe"])}
    if isinstance(record.get("recipe_files"), dict):
        record["recipe_files"] = {
            arm: {**entry, "path": move(entry.get("path"))} for arm, entry in record["recipe_files"].items()
        }
    return record


def merge_studies(out_dir: str | Path, folders: Sequence[str | Path]) -> dict[str, Any]:
    """Write OUT/study.json and OUT/records/ from the records of `folders`; return the study.json written.

    Refuses an OUT that exists and is not empty, a folder without study.json or records, folders whose specs,
    eval sets or numerics versions differ (one line naming the differing value), a record written for another
    spec than its folder's, and one arm and seed in two folders with different predictions."""
    out_dir = Path(out_dir)
    if not folders:
        raise ValueError("nothing to merge: name one or more study folders")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"merge output {out_dir} exists and is not an empty folder; choose a new folder")
    sources = [_read_source(Path(folder)) for folder in folders]
    for other in sources[1:]:
        _check_same_study(sources[0], other)
    chosen: dict[tuple[str, int], Any] = {}
    versions: dict[Any, Path] = {}
    for source in sources:
        digest = spec_digest(source["study"])
        for path in source["records"]:
            record = read_record(path)
            if record.meta["spec_sha256"] != digest:
                raise ValueError(f"cannot merge: {path} was written for another spec than {source['folder']}'s")
            versions.setdefault(record.meta["numerics_version"], path)
            if len(versions) > 1:
                (v1, p1), (v2, p2) = list(versions.items())[:2]
                raise ValueError(f"cannot merge: numerics version {v1} ({p1}) vs {v2} ({p2}): the numerics differ")
            key = (record.meta["arm"], int(record.meta["seed"]))
            before = chosen.get(key)
            if before is None:
                chosen[key] = record
            elif set(before.predictions) != set(record.predictions) or not all(
                np.array_equal(before.predictions[k], record.predictions[k]) for k in record.predictions
            ):
                raise ValueError(
                    f"cannot merge: {record.label} is in {before.path} and {path} with different predictions; "
                    f"leave one of them out"
                )
    first = sources[0]
    seeds = sorted({int(s) for source in sources for s in source["study"]["seeds"]})
    study = {
        **_rebased(first["study"], first["folder"], out_dir),
        "seeds": seeds,
        "merged_from": [
            {"folder": str(s["folder"]), "seeds": s["study"]["seeds"], "command": s["study"].get("command")}
            for s in sources
        ],
    }
    for (arm, seed), record in sorted(chosen.items()):
        target = record_path(out_dir, arm, seed)
        io.write_file(target, lambda temporary, source=record.path: shutil.copyfile(source, temporary))
    eval_set = first["folder"] / RECORDS / EVAL_SET
    if eval_set.is_file():
        io.write_file(out_dir / RECORDS / EVAL_SET, lambda temporary: shutil.copyfile(eval_set, temporary))
    io.write_json(out_dir / "study.json", study)
    return study
