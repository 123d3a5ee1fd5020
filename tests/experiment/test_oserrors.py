"""Every operating-system error is one line with the path and what to do; nothing finished is lost."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from mxlab import io
from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.oserrors import is_disk_full, os_error_line, stopped
from mxlab.experiment.runner import run_study
from mxlab.experiment.worker import record_failure
from tests.experiment.faults import cli, fingerprints, run_inline, write_spec


@pytest.fixture
def spec_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_inline(monkeypatch)
    return write_spec(tmp_path / "spec")


def _errors(lines: list[str]) -> list[str]:
    assert not any("Traceback" in line for line in lines), lines
    return [line for line in lines if line.startswith("error:")]


def test_a_read_only_out_folder_is_one_line_and_exit_1(spec_path, tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "ro" / ".x.tmp"))

    monkeypatch.setattr(io.tempfile, "mkstemp", read_only)
    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(tmp_path / "ro"))
    assert code == 1
    assert _errors(lines) == [
        f"error: {tmp_path / 'ro' / 'study.json'}: Read-only file system; "
        f"the file system is read-only: choose a writable --out"
    ]


def test_a_full_disk_mid_study_is_one_line_keeps_finished_runs_and_resumes(spec_path, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    run_study(
        load_spec(spec_path), reference, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
    )
    write_file = io.write_file

    def no_space(temporary):  # as a write() on a full disk fails: errno ENOSPC, no file name
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_for_noisy(path, write):
        full = "noisy" in str(path) and Path(path).name == "checkpoint.pt"
        write_file(path, no_space if full else write)

    monkeypatch.setattr(io, "write_file", full_for_noisy)
    out = tmp_path / "out"
    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(out))
    assert code == 1
    assert _errors(lines) == [
        f"error: {out / 'runs/noisy/seed0/checkpoint.pt'}: No space left on device; the disk is full: free space "
        f"(or choose another --out) and continue with --resume; finished runs are kept"
    ]
    assert json.loads((out / "runs/base/seed0/done.json").read_text())["status"] == "finished"
    eval_bytes = (reference / "runs/base/seed0/eval.npz").read_bytes()
    assert (out / "runs/base/seed0/eval.npz").read_bytes() == eval_bytes
    finished = fingerprints(out / "runs/base")

    monkeypatch.setattr(io, "write_file", write_file)  # space again
    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(out), "--resume")
    assert code == 0, lines
    assert fingerprints(out / "runs/base") == finished
    noisy = (reference / "runs/noisy/seed0/eval.npz").read_bytes()
    assert (out / "runs/noisy/seed0/eval.npz").read_bytes() == noisy


def test_a_record_that_cannot_be_written_does_not_end_the_driver(tmp_path, monkeypatch):
    def full(path, payload):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(io, "_atomic_write_bytes", full)
    result = record_failure(tmp_path / "run", "RuntimeError: boom")
    assert result.status == "failed" and "done.json could not be written: No space left on device" in result.reason
    assert not (tmp_path / "run" / "done.json").exists()


def test_disk_full_is_told_apart_and_stops_the_study_in_one_line():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/run/checkpoint.pt")
    assert is_disk_full(full) and is_disk_full("OSError: [Errno 28] No space left on device: '/x'")
    assert not is_disk_full("RuntimeError: CUDA out of memory") and not is_disk_full(None)
    assert os_error_line(full).startswith("/data/run/checkpoint.pt: No space left on device; the disk is full")
    line = os_error_line(stopped("noisy/seed0", "OSError: [Errno 28] No space left on device", 3))
    assert line.startswith("the disk is full: noisy/seed0 failed (") and "3 runs were not started" in line
    assert "\n" not in line
