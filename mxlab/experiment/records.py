"""Compact run records: one file per finished or diverged run, small enough for git, enough for the report.

A record (DIR/records/ARM/seedK.npz, deflated, written atomically) holds what the report reads from a run
folder and nothing else: the run's exact float32 predictions (p_ctr, p_cvr; p_ctcvr only where it is not
their float32 product; p_T of each independent task T), and in its `meta` entry (UTF-8 JSON) the run's small
files verbatim (done.json with
its step time, memory and health, config.json, plan.json, plan.txt, metrics.jsonl, numerics.jsonl), the
study's spec digest, the eval set's fingerprint and the numerics version. The eval set itself (labels, users,
true probabilities: the same for every run of a study) is stored once, DIR/records/eval-set.npz.

Per-example predictions are kept because per-user sums cannot give every endpoint exactly: the DeLong test
of an arm against its baseline needs the covariance of both runs' per-example AUC components, and the
recalibrated NE and the reliability bins need each prediction. No checkpoint is kept: a record is read, never
resumed from (docs/INTERFACES.md, "Run records").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mxlab import io
from mxlab.experiment.artefacts import DONE, DONE_STATUSES, EVAL, read_done, run_is_complete
from mxlab.metrics import LABEL_PREFIX

RECORDS = "records"
EVAL_SET = "eval-set.npz"
RECORD_FORMAT = 1
RUN_TEXT_FILES = (DONE, "config.json", "plan.json", "plan.txt", "metrics.jsonl", "numerics.jsonl")
EVAL_SET_KEYS = ("click", "conversion", "user_id", "true_ctr", "true_cvr")
PREDICTION_KEYS = ("p_ctr", "p_cvr", "p_ctcvr")
# what two folders must share to be one study; seeds may differ (a merge takes their union)
SPEC_KEYS = ("baseline", "arms", "data", "model", "train", "report", "gate")


@dataclass(frozen=True)
class RunRecord:
    """A record read back: its meta (arm, seed, spec_sha256, eval_set, numerics_version, files) and predictions."""

    path: Path
    meta: dict[str, Any]
    predictions: dict[str, np.ndarray]

    @property
    def label(self) -> str:
        return f"{self.meta['arm']}/seed{self.meta['seed']}"

    @property
    def done(self) -> dict[str, Any]:
        return json.loads(self.meta["files"][DONE])


def record_path(out_dir: Path, arm: str, seed: int) -> Path:
    """DIR/records/ARM/seedK.npz."""
    return Path(out_dir) / RECORDS / arm / f"seed{seed}.npz"


def spec_identity(study: dict[str, Any]) -> dict[str, Any]:
    """The part of a study.json that two folders must share to merge: SPEC_KEYS, the design (its recipe path
    left out) and each recipe file's SHA-256. Seeds, execution, paths and provenance are left out."""
    identity = {key: study.get(key) for key in SPEC_KEYS}
    design = dict(study.get("design") or {})
    design.pop("recipe", None)
    identity["design"] = design
    identity["recipe_sha256"] = {arm: entry.get("sha256") for arm, entry in (study.get("recipe_files") or {}).items()}
    return identity


def spec_digest(study: dict[str, Any]) -> str:
    """SHA-256 of `spec_identity` (canonical JSON)."""
    return hashlib.sha256(io.to_json(spec_identity(study), indent=None).encode()).hexdigest()


def eval_set_fingerprint(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the eval-set arrays present (EVAL_SET_KEYS): each one's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for key in EVAL_SET_KEYS:
        if key in arrays:
            value = np.ascontiguousarray(arrays[key])
            digest.update(f"{key}:{value.dtype.str}:{value.shape};".encode())
            digest.update(value.tobytes())
    return digest.hexdigest()


def _ctcvr(predictions: dict[str, np.ndarray]) -> np.ndarray:
    return (predictions["p_ctr"] * predictions["p_cvr"]).astype(np.float32)


def read_eval_set(out_dir: Path) -> dict[str, np.ndarray]:
    """The arrays of DIR/records/eval-set.npz. Refuses a missing or unreadable file (OSError / ValueError)."""
    path = Path(out_dir) / RECORDS / EVAL_SET
    if not path.is_file():
        raise ValueError(f"{path} is missing: a folder of records needs the eval set its runs were scored on")
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def _write_eval_set(out_dir: Path, arrays: dict[str, np.ndarray]) -> str:
    """Write DIR/records/eval-set.npz once; return its fingerprint. Refuses an eval set other than the one there."""
    eval_set = {key: arrays[key] for key in arrays if key in EVAL_SET_KEYS or key.startswith(LABEL_PREFIX)}
    fingerprint = eval_set_fingerprint(eval_set)
    path = Path(out_dir) / RECORDS / EVAL_SET
    if path.is_file():
        there = eval_set_fingerprint(read_eval_set(out_dir))
        if there != fingerprint:
            raise ValueError(
                f"{path} holds eval set {there[:12]}, but this run was scored on {fingerprint[:12]}: "
                f"the runs of one study folder must share the eval set"
            )
        return fingerprint
    io.write_npz(path, eval_set, compressed=True)
    return fingerprint


def write_record(out_dir: Path, arm: str, seed: int, run_dir: Path, study: dict[str, Any]) -> Path:
    """Write the record of the finished or diverged run in `run_dir` (and the eval set, once); return its path.
    `study`: the folder's study.json. Refuses a run that is not done."""
    from mxlab.numerics import NUMERICS_VERSION

    run_dir = Path(run_dir)
    if not run_is_complete(run_dir):
        raise ValueError(f"{run_dir} is not a finished or diverged run; only those get a record")
    files = {name: (run_dir / name).read_text() for name in RUN_TEXT_FILES if (run_dir / name).is_file()}
    predictions: dict[str, np.ndarray] = {}
    fingerprint = None
    if (read_done(run_dir) or {}).get("status") == "finished":
        with np.load(run_dir / EVAL, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        fingerprint = _write_eval_set(out_dir, arrays)
        if "p_cvr" in arrays:
            predictions = {key: arrays[key] for key in ("p_ctr", "p_cvr")}
            if not np.array_equal(_ctcvr(predictions), arrays["p_ctcvr"]):
                predictions["p_ctcvr"] = arrays["p_ctcvr"]
        else:  # independent tasks (mxlab.tasks): p_T of each
            predictions = {key: arrays[key] for key in arrays if key.startswith("p_")}
    meta = {
        "format": RECORD_FORMAT,
        "arm": arm,
        "seed": int(seed),
        "spec_sha256": spec_digest(study),
        "eval_set": fingerprint,
        "numerics_version": NUMERICS_VERSION,
        "files": files,
    }
    path = record_path(out_dir, arm, seed)
    encoded = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    io.write_npz(path, {"meta": encoded, **predictions}, compressed=True)
    return path


def read_record(path: Path, predictions: bool = True) -> RunRecord:
    """The record at `path` (without its predictions when `predictions` is False). Refuses (ValueError naming
    the file) one that cannot be read or is not a record."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files if predictions or key == "meta"}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path} is not a readable run record ({type(error).__name__}: {error})") from error
    if meta.get("format") != RECORD_FORMAT or json.loads(meta["files"][DONE]).get("status") not in DONE_STATUSES:
        raise ValueError(f"{path}: record format {meta.get('format')!r} or status not readable by this version")
    return RunRecord(path, meta, arrays)


def record_is_done(out_dir: Path, arm: str, seed: int) -> bool:
    """True when DIR/records/ARM/seedK.npz reads back as a finished or diverged run's record."""
    path = record_path(out_dir, arm, seed)
    if not path.is_file():
        return False
    try:
        read_record(path, predictions=False)
    except ValueError:
        return False
    return True


def study_records(out_dir: Path) -> list[Path]:
    """Every record file of a study folder (records/ARM/seedK.npz), sorted."""
    root = Path(out_dir) / RECORDS
    return sorted(root.glob("*/seed*.npz")) if root.is_dir() else []


def write_missing_records(out_dir: Path) -> list[Path]:
    """Write the record of every done run under DIR/runs that has none; return the records written."""
    out_dir = Path(out_dir)
    study = io.read_json(out_dir / "study.json")
    written = []
    for run_dir in sorted((out_dir / "runs").glob("*/seed*")):
        arm, seed = run_dir.parent.name, int(run_dir.name.removeprefix("seed"))
        if run_is_complete(run_dir) and not record_is_done(out_dir, arm, seed):
            written.append(write_record(out_dir, arm, seed, run_dir, study))
    return written


def unpack_record(record: RunRecord, eval_set: dict[str, np.ndarray], run_dir: Path) -> None:
    """Write the run folder a record was made from (its small files, and eval.npz for a finished run), without
    its checkpoint."""
    run_dir = Path(run_dir)
    for name, text in record.meta["files"].items():
        io.write_text(run_dir / name, text)
    if record.done.get("status") == "finished":
        predictions = dict(record.predictions)
        if "p_cvr" in predictions:
            predictions.setdefault("p_ctcvr", _ctcvr(predictions))
        io.write_npz(run_dir / EVAL, {**eval_set, **predictions})


@contextlib.contextmanager
def runs_for_report(out_dir: Path) -> Iterator[Path]:
    """The runs root a report reads: DIR/runs when every record has its run folder; else a temporary folder where
    every run is its run folder when that has a done.json (linked: a corrupt one is named by the report, as
    without records) and its record otherwise (unpacked)."""
    out_dir = Path(out_dir)
    records = study_records(out_dir)
    if all((out_dir / "runs" / path.parent.name / path.stem / DONE).is_file() for path in records):
        yield out_dir / "runs"  # every record's run folder is there
        return
    eval_set: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="mxlab-runs-") as temporary:
        root = Path(temporary)
        for run_dir in sorted((out_dir / "runs").glob("*/seed*")) if (out_dir / "runs").is_dir() else []:
            if (run_dir / DONE).is_file():
                (root / run_dir.parent.name).mkdir(exist_ok=True)
                os.symlink(run_dir.resolve(), root / run_dir.parent.name / run_dir.name)
        for path in records:
            target = root / path.parent.name / path.stem
            if target.exists():
                continue
            record = read_record(path)
            if record.meta["eval_set"] is not None:
                eval_set = eval_set or read_eval_set(out_dir)
                if record.meta["eval_set"] != eval_set_fingerprint(eval_set):
                    raise ValueError(f"{path} was scored on another eval set than {out_dir / RECORDS / EVAL_SET}")
            unpack_record(record, eval_set, target)
        yield root


def recorded_results(jobs: Sequence[Any], out_dir: Path) -> dict[str, Any]:
    """{label: RunResult} of the jobs without a done.json in their run folder (a corrupt one is evaluated again)
    whose record is done (`--resume` counts them finished), less the runs that a job still to train starts
    from (a warm-up, the baseline of a post-training arm): a record holds no weights, so those train again."""
    from mxlab.experiment.worker import result_from_done

    folders = {job.label for job in jobs if (Path(job.run_dir) / DONE).is_file()}
    recorded = {
        job.label: job for job in jobs if job.label not in folders and record_is_done(out_dir, job.arm, job.seed)
    }
    done = {job.label for job in jobs if run_is_complete(job.run_dir)}
    changed = True
    while changed:
        pending = [job for job in jobs if job.label not in done and job.label not in recorded]
        starts = {f"{Path(job.fork_dir).parent.name}/{Path(job.fork_dir).name}" for job in pending if job.fork_dir}
        changed = bool(starts & set(recorded))
        for label in starts & set(recorded):
            del recorded[label]
    return {
        label: result_from_done(read_record(record_path(out_dir, job.arm, job.seed), predictions=False).done)
        for label, job in recorded.items()
    }


@contextlib.contextmanager
def records_on_exit(out_dir: Path, keep_runs: bool) -> Iterator[None]:
    """When the block ends, also by an interruption or a crash: write the record of every done run of a started
    study (DIR/study.json exists), then, unless `keep_runs`, drop the run folders that have one (a run cut off
    keeps its folder and checkpoint for --resume)."""
    try:
        yield
    finally:
        if (Path(out_dir) / "study.json").is_file():
            write_missing_records(out_dir)
            if not keep_runs:
                drop_run_folders(out_dir)


def drop_run_folders(out_dir: Path) -> list[Path]:
    """Remove every run folder of DIR/runs that has a record (checkpoints included; `--no-keep-runs`), then
    runs/ itself when empty; return the folders removed."""
    runs = Path(out_dir) / "runs"
    removed = []
    for run_dir in sorted(runs.glob("*/seed*")) if runs.is_dir() else []:
        if record_is_done(out_dir, run_dir.parent.name, int(run_dir.name.removeprefix("seed"))):
            shutil.rmtree(run_dir)
            removed.append(run_dir)
    for folder in sorted(runs.glob("*")) if runs.is_dir() else []:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    if runs.is_dir() and not any(runs.iterdir()):
        runs.rmdir()
    return removed
