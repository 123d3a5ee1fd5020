"""Run records: written by two study runs into two folders, merged, and reported like the full run folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.merge import merge_studies
from mxlab.experiment.records import read_eval_set, read_record, record_path, runs_for_report
from mxlab.experiment.runner import run_study
from mxlab.report import write_report
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

ARMS = ("bf16", "mxfp8-rceil-sr")
SPEC = [item for item in MICRO if not item.startswith("seeds=")]


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory) -> tuple[Path, Path]:
    """Seed 0 and seed 1 of one study, each run on its own into its own folder (run folders kept): seed 0 by
    `mxlab run` in another OS process (its runs in worker processes of their own), seed 1 in this one."""
    root = tmp_path_factory.mktemp("records")
    overrides = [part for item in [*SPEC, "seeds=[0]"] for part in ("--set", item)]
    command = [sys.executable, "-m", "mxlab.cli", "run", str(QUICKSTART), "--device", "cpu", "--out", str(root / "a")]
    finished = subprocess.run([*command, *overrides], capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    spec = load_spec(QUICKSTART, [*SPEC, "seeds=[1]"])
    run_study(spec, root / "b", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    return root / "a", root / "b"


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_merged_records_give_the_report_of_the_full_run_folders(two_machines, tmp_path):
    a, b = two_machines
    for folder, seed in ((a, 0), (b, 1)):
        for arm in ARMS:
            record = read_record(record_path(folder, arm, seed))
            with np.load(folder / "runs" / arm / f"seed{seed}" / "eval.npz") as npz:
                full = {key: npz[key] for key in npz.files}
            eval_set = read_eval_set(folder)
            assert set(full) == set(eval_set) | {"p_ctr", "p_cvr", "p_ctcvr"}
            for key, value in {**eval_set, **record.predictions}.items():
                assert value.dtype == full[key].dtype and value.tobytes() == full[key].tobytes(), key
            assert record.done == json.loads((folder / "runs" / arm / f"seed{seed}" / "done.json").read_text())
    # the full run folders of both seeds in one study folder, no record: today's report
    full = tmp_path / "full"
    full.mkdir()
    study = json.loads((a / "study.json").read_text())
    (full / "study.json").write_text(json.dumps({**study, "seeds": [0, 1]}))
    for folder in (a, b):
        shutil.copytree(folder / "runs", full / "runs", dirs_exist_ok=True)
    write_report(full)
    merged = tmp_path / "merged"
    merge_studies(merged, [a, b])
    assert not (merged / "runs").exists()
    assert sorted(p.name for p in (merged / "records").iterdir()) == sorted([*ARMS, "eval-set.npz"])
    write_report(merged)
    expected, got = _summary(full), _summary(merged)
    assert got["inputs"]["deltas"] and got["run_metrics"]["bf16"].keys() == {"0", "1"}
    assert got == expected
    sizes = sum(path.stat().st_size for path in (merged / "records").rglob("*.npz"))
    assert sizes < sum(path.stat().st_size for path in (full / "runs").rglob("*") if path.is_file()) / 4


def test_a_merge_is_refused_when_the_eval_sets_or_the_specs_differ(two_machines, tmp_path):
    a, b = two_machines
    other = tmp_path / "other"
    shutil.copytree(b, other, ignore=shutil.ignore_patterns("runs"))
    eval_set = read_eval_set(other)
    eval_set["user_id"] = eval_set["user_id"][::-1].copy()  # the same examples, other users: no pairing
    np.savez_compressed(other / "records" / "eval-set.npz", **eval_set)
    with pytest.raises(ValueError, match=r"the eval sets differ: 'user_id'"):
        merge_studies(tmp_path / "out", [a, other])
    assert not (tmp_path / "out").exists()
    shutil.rmtree(other)
    shutil.copytree(b, other, ignore=shutil.ignore_patterns("runs"))
    study = json.loads((other / "study.json").read_text())
    study["data"]["eval_examples"] = 1024
    (other / "study.json").write_text(json.dumps(study))
    with pytest.raises(ValueError, match=r"the specs differ at data\.eval_examples: 512 \(.*\) vs 1024"):
        merge_studies(tmp_path / "out", [a, other])


def test_resume_counts_runs_kept_only_as_records_as_done(two_machines, tmp_path):
    a, _ = two_machines
    folder = tmp_path / "a"
    shutil.copytree(a, folder)
    spec = load_spec(QUICKSTART, [*SPEC, "seeds=[0]"])
    first = run_study(
        spec,
        folder,
        device="cpu",
        resume=True,
        show_progress=False,
        options=ExecutionOptions(executor="inline", keep_runs=False),
    )
    assert first.trained == [] and not (folder / "runs").exists()
    again = run_study(
        spec, folder, device="cpu", resume=True, show_progress=False, options=ExecutionOptions(executor="inline")
    )
    assert again.trained == [] and sorted(again.already_done) == [f"{arm}/seed0" for arm in ARMS]
    with pytest.raises(ValueError, match="already holds runs"):
        run_study(spec, folder, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    with runs_for_report(folder) as root:
        assert sorted(p.parent.parent.name for p in root.glob("*/seed0/eval.npz")) == sorted(ARMS)
    write_report(folder)
    write_report(a)  # from its run folders
    assert _summary(folder) == _summary(a)


def test_an_interrupted_study_keeps_its_finished_runs_as_records_and_the_cut_run_as_a_folder(tmp_path):
    """A study stopped in its second run (the way a device visit's time limit stops it) writes the finished run's
    record at once and, without --keep-runs, drops its folder; the cut run keeps its folder and checkpoint, and
    --resume finishes the study as an uninterrupted one."""
    spec = load_spec(QUICKSTART, [*SPEC, "seeds=[0]"])
    options = ExecutionOptions(executor="inline", keep_runs=False)

    def cut(job, step):
        if (job.arm, step) == ("mxfp8-rceil-sr", 3):  # after its checkpoint at step 2
            raise KeyboardInterrupt("time limit")

    folder = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_study(spec, folder, device="cpu", show_progress=False, on_step=cut, options=options)
    assert record_path(folder, "bf16", 0).is_file() and not (folder / "runs/bf16").exists()
    assert not record_path(folder, "mxfp8-rceil-sr", 0).is_file()
    assert (folder / "runs/mxfp8-rceil-sr/seed0/checkpoint.pt").is_file()
    resumed = run_study(spec, folder, device="cpu", resume=True, show_progress=False, options=options)
    assert resumed.trained == ["mxfp8-rceil-sr/seed0"] and not (folder / "runs").exists()
    whole = tmp_path / "whole"
    run_study(spec, whole, device="cpu", show_progress=False, options=options)
    for arm in ARMS:
        got, expected = read_record(record_path(folder, arm, 0)), read_record(record_path(whole, arm, 0))
        assert {k: v.tobytes() for k, v in got.predictions.items()} == {
            k: v.tobytes() for k, v in expected.predictions.items()
        }, arm
