"""The CUDA MPS daemon of a study: started and stopped around the runs, refused where it cannot run.

A stand-in `nvidia-cuda-mps-control` on PATH records how it was called (arguments, standard input,
the pipe folder it was given) and, like the real one, creates the `control` pipe on `-d`.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.executors.mps import mps_daemon

STAND_IN = f"""#!{sys.executable}
import json, os, pathlib, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with open(os.environ["MPS_STAND_IN_LOG"], "a") as log:
    log.write(json.dumps({{"args": sys.argv[1:], "stdin": stdin, "pipe": pipe}}) + "\\n")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("MPS_STAND_IN_FAIL"):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    pathlib.Path(pipe, "control").write_text("")
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-cuda-mps-control"
    script.write_text(STAND_IN)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_STAND_IN_LOG", str(log))
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.delenv(key, raising=False)
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_daemon_is_started_for_the_study_and_told_to_quit_after(stand_in):
    with mps_daemon(True) as state:
        pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
        assert state == "started"
        assert (pipe / "control").exists() and Path(os.environ["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        assert [call["args"] for call in stand_in()] == [["-d"]]
    calls = stand_in()
    assert [(call["args"], call["stdin"]) for call in calls] == [(["-d"], ""), ([], "quit\n")]
    assert calls[0]["pipe"] == calls[1]["pipe"] == str(pipe)  # quit reaches the daemon that was started
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and not pipe.exists()  # environment and folder restored


def test_a_study_that_fails_still_stops_the_daemon(stand_in):
    with pytest.raises(RuntimeError, match="a run broke"):
        with mps_daemon(True):
            raise RuntimeError("a run broke")
    assert [call["args"] for call in stand_in()] == [["-d"], []]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_command_stopped_by_sigterm_stops_the_daemon_and_exits_as_interrupted(stand_in, capsys):
    import signal
    import time

    from mxlab.cli.study_commands import _guarded

    def body():
        with mps_daemon(True):
            os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` or a batch scheduler stops a study
            time.sleep(30)
        return 0

    before = signal.getsignal(signal.SIGTERM)
    assert _guarded(body, "Finished runs are kept.") == 130
    assert [call["args"] for call in stand_in()] == [["-d"], []]  # the daemon was told to quit
    assert "interrupted. Finished runs are kept." in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_daemon_already_running_is_used_and_left_running(stand_in, tmp_path, monkeypatch):
    pipe = tmp_path / "theirs"
    pipe.mkdir()
    (pipe / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    with mps_daemon(True) as state:
        assert state == "running"
    assert stand_in() == [] and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)


def test_off_touches_nothing(stand_in):
    with mps_daemon(False) as state:
        assert state == "off" and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert stand_in() == []


def test_a_daemon_that_does_not_start_is_an_error_with_its_words(stand_in, monkeypatch):
    monkeypatch.setenv("MPS_STAND_IN_FAIL", "1")
    with pytest.raises(RuntimeError, match="exited with 1: An instance of this daemon is already running"):
        with mps_daemon(True):
            pass
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_no_control_program_is_refused_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with pytest.raises(ValueError, match="needs nvidia-cuda-mps-control .* on PATH; none was found. Run without --mps"):
        with mps_daemon(True):
            pass


def test_a_study_on_the_cpu_refuses_mps_before_writing_anything(tmp_path):
    from mxlab.experiment.runner import run_study
    from mxlab.experiment.spec import load_spec

    spec = load_spec(Path(__file__).parents[2] / "experiments" / "quickstart.toml")
    with pytest.raises(ValueError, match=r"--mps needs CUDA devices and the local executor; got devices \['cpu'\]"):
        run_study(spec, tmp_path / "study", device="cpu", show_progress=False, options=ExecutionOptions(mps=True))
    assert not (tmp_path / "study").exists()


def test_the_spec_takes_mps_as_a_boolean():
    from mxlab.experiment.spec import load_spec

    spec_path = Path(__file__).parents[2] / "experiments" / "quickstart.toml"
    assert load_spec(spec_path, ["execution.mps=true"]).execution.mps is True
    assert load_spec(spec_path).execution.mps is False
    with pytest.raises(ValueError, match="execution.mps"):
        load_spec(spec_path, ['execution.mps="yes"'])


@pytest.mark.gpu
def test_gpu_a_study_under_mps_gives_the_bits_of_one_without(tmp_path):
    import shutil

    from mxlab.experiment.runner import run_study
    from mxlab.experiment.spec import load_spec
    from tests.experiment.test_end_to_end import MICRO, QUICKSTART
    from tests.experiment.test_executors import _eval_bytes

    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH")
    spec = load_spec(QUICKSTART, MICRO + ["seeds=[0, 1]", "train.max_steps=3"])
    plain = run_study(
        spec,
        tmp_path / "plain",
        device="cuda",
        show_progress=False,
        options=ExecutionOptions(gpus=1, runs_per_device=2),
    )
    shared = run_study(
        spec,
        tmp_path / "mps",
        device="cuda",
        show_progress=False,
        options=ExecutionOptions(gpus=1, runs_per_device=2, mps=True),
    )
    assert not plain.failed and not shared.failed and sorted(shared.trained) == sorted(plain.trained)
    assert json.loads((tmp_path / "mps/study.json").read_text())["execution"]["mps"] is True
    for label in plain.trained:
        assert _eval_bytes(tmp_path / "mps/runs" / label) == _eval_bytes(tmp_path / "plain/runs" / label), label
