"""Pack a study's finished run folders on the GPU machine for the trip back through its size limits
(at most 8 files of 16 MiB per command), and rebuild them here; how `reports/gem-synthetic-seed0/` came back.

    python3 benchmarks/pack_runs.py pack STUDY_DIR OUT HAVE_FILE [MAX_FILES]   # on the GPU machine
    python3 benchmarks/pack_runs.py unpack STUDY_DIR TAR ...                     # here

pack: every file of each finished or diverged run not listed in HAVE_FILE (lines ARM/seedK), except
checkpoint.pt; eval.npz is split into pred.npz (the run's p_ctr, p_cvr, p_ctcvr, compressed) and, once
per study, shared.npz (labels, user ids and truth), checked equal across the runs (a run whose eval set
differs is packed whole). Runs go into tars of at most 15 MiB, OUT/runs0.tar, runs1.tar, ...
unpack: the run folders under STUDY_DIR/runs, each eval.npz rebuilt from shared.npz and its pred.npz
(the arrays of the original, bit for bit). Not imported by the library.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

PREDICTIONS = ("p_ctr", "p_cvr", "p_ctcvr")
TAR_LIMIT = 15 * 2**20


def _npz_bytes(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def _run_files(run: Path, shared: dict | None) -> tuple[list[tuple[str, bytes]], dict | None]:
    """The (name, bytes) a run travels as, and the study's shared eval arrays (set by the first run)."""
    files = []
    for path in sorted(p for p in run.iterdir() if p.is_file() and p.name != "checkpoint.pt"):
        if path.name != "eval.npz":
            files.append((path.name, path.read_bytes()))
            continue
        with np.load(path) as npz:
            arrays = {key: npz[key] for key in npz.files}
        rest = {k: v for k, v in arrays.items() if k not in PREDICTIONS}
        if shared is None:
            shared = rest
            files.append(("shared.npz", _npz_bytes(rest)))
        if set(rest) != set(shared) or any(not np.array_equal(rest[k], shared[k]) for k in rest):
            print(f"{run}: eval set differs from the shared one; packed whole")
            files.append((path.name, path.read_bytes()))
        else:
            files.append(("pred.npz", _npz_bytes({k: arrays[k] for k in PREDICTIONS})))
    return files, shared


def pack(study: Path, out: Path, have_file: Path, max_files: int = 5) -> None:
    have = set(have_file.read_text().split()) if have_file.exists() else set()
    shared_path = study.parent / f"{study.name}-shared.npz"
    shared = dict(np.load(shared_path)) if shared_path.exists() else None
    bundles: list[list[tuple[str, list[tuple[str, bytes]]]]] = [[]]
    size = 0
    for done in sorted(study.glob("runs/*/seed*/done.json")):
        key = f"{done.parent.parent.name}/{done.parent.name}"
        if key in have or json.loads(done.read_text()).get("status") not in ("finished", "diverged"):
            continue
        files, first = _run_files(done.parent, shared)
        if shared is None:
            shared = first
            np.savez_compressed(shared_path, **shared)
        n = sum(len(data) for _, data in files)
        if bundles[-1] and size + n > TAR_LIMIT:
            bundles.append([])
            size = 0
        bundles[-1].append((key, files))
        size += n
    for index, bundle in enumerate(b for b in bundles if b):
        if index >= max_files:
            print("not packed (file limit):", [key for key, _ in bundle])
            continue
        with tarfile.open(out / f"runs{index}.tar", "w") as tar:
            for key, files in bundle:
                for name, data in files:
                    info = tarfile.TarInfo(f"{key}/{name}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        print(
            f"runs{index}.tar: {[key for key, _ in bundle]} {(out / f'runs{index}.tar').stat().st_size / 2**20:.1f} MiB"
        )


def unpack(study: Path, tars: list[Path]) -> None:
    for tar_path in tars:
        with tarfile.open(tar_path) as tar:
            members = [(m.name.rsplit("/", 1), tar.extractfile(m).read()) for m in tar.getmembers()]
        for (_key, name), data in members:  # shared.npz first: a tar's pred.npz may need it
            if name == "shared.npz":
                (study / "shared.npz").write_bytes(data)
        for (key, name), data in members:
            run = study / "runs" / key
            run.mkdir(parents=True, exist_ok=True)
            if name == "pred.npz":
                shared = dict(np.load(study / "shared.npz"))
                np.savez(run / "eval.npz", **shared, **dict(np.load(io.BytesIO(data))))
                print("rebuilt", key)
            elif name != "shared.npz":
                (run / name).write_bytes(data)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "pack":
        pack(Path(args[0]), Path(args[1]), Path(args[2]), *(int(a) for a in args[3:4]))
    elif command == "unpack":
        unpack(Path(args[0]), [Path(a) for a in args[1:]])
    else:
        sys.exit(f"unknown command {command!r}; accepted: pack, unpack")
