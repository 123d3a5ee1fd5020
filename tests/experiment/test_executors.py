"""The executors on the real tiny model: a killed local worker is recorded and resumed; Ray matches local
bit for bit, and a Ray worker killed mid-run is retried from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

LONGER = MICRO + ['arms=["bf16"]', "seeds=[0, 1]", "train.epochs=12", "train.max_steps=48", "train.checkpoint_every=2"]


def _eval_bytes(run_dir: Path) -> dict[str, bytes]:
    with np.load(run_dir / "eval.npz") as npz:
        return {key: npz[key].tobytes() for key in npz.files}


def _kill_when_running(
    run_dir: Path, at_step: int, killed: list[int], timeout_s: float = 120.0, before_step: int = 40
) -> threading.Thread:
    """Kill (SIGKILL) the process that trains `run_dir` once its progress.json shows a step in
    [at_step, before_step): well before its last step, so the kill never lands on a run that has finished."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not killed:
            try:
                state = json.loads((run_dir / "progress.json").read_text())
            except (OSError, ValueError):
                state = {}
            if at_step <= state.get("step", 0) < before_step and state.get("pid") not in (None, os.getpid()):
                os.kill(state["pid"], signal.SIGKILL)
                killed.append(state["step"])
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _study_with_a_kill(out: Path, executor: str):
    """Run the LONGER study on `executor`, killing the process of bf16/seed0 between steps 4 and 40 (of 48)."""
    killed: list[int] = []
    watcher = _kill_when_running(out / "runs/bf16/seed0", 4, killed)
    result = run_study(
        load_spec(QUICKSTART, LONGER),
        out,
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor=executor),
    )
    watcher.join()
    assert killed, "the run finished before it could be killed"
    return result


def test_a_killed_local_worker_is_recorded_and_the_study_goes_on(tmp_path):
    spec = load_spec(QUICKSTART, LONGER)
    out = tmp_path / "out"
    result = _study_with_a_kill(out, "local")
    failed = json.loads((out / "runs/bf16/seed0/done.json").read_text())
    assert failed["status"] == "failed" and "SIGKILL" in failed["reason"]
    assert list(result.failed) == ["bf16/seed0"]
    assert json.loads((out / "runs/bf16/seed1/done.json").read_text())["status"] == "finished"
    stamps = {path.name: path.stat().st_mtime_ns for path in (out / "runs/bf16/seed1").iterdir()}

    again = run_study(
        spec, out, device="cpu", resume=True, show_progress=False, options=ExecutionOptions(executor="local")
    )
    assert again.trained == ["bf16/seed0"] and again.already_done == ["bf16/seed1"] and not again.failed
    done = json.loads((out / "runs/bf16/seed0/done.json").read_text())
    assert done["status"] == "finished" and done["steps"] == 48 and done["resumed_from_step"] >= 2
    assert {path.name: path.stat().st_mtime_ns for path in (out / "runs/bf16/seed1").iterdir()} == stamps

    reference = tmp_path / "reference"
    run_study(
        load_spec(QUICKSTART, LONGER + ["seeds=[0]"]),
        reference,
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    assert _eval_bytes(reference / "runs/bf16/seed0") == _eval_bytes(out / "runs/bf16/seed0")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_gives_the_same_bits_as_local(local_ray, tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ['arms=["mxfp8-rceil-sr"]', 'baseline="mxfp8-rceil-sr"'])
    run_study(spec, tmp_path / "local", device="cpu", show_progress=False, options=ExecutionOptions(executor="local"))
    result = run_study(
        spec, tmp_path / "ray", device="cpu", show_progress=False, options=ExecutionOptions(executor="ray")
    )
    assert result.trained == ["mxfp8-rceil-sr/seed0"] and not result.failed
    run = "runs/mxfp8-rceil-sr/seed0"
    assert _eval_bytes(tmp_path / "local" / run) == _eval_bytes(tmp_path / "ray" / run)
    assert json.loads((tmp_path / "ray/study.json").read_text())["execution"]["executor"] == "ray"


def test_a_killed_ray_worker_is_retried_from_its_checkpoint(local_ray, tmp_path):
    spec = load_spec(QUICKSTART, LONGER)
    out = tmp_path / "out"
    result = _study_with_a_kill(out, "ray")
    assert sorted(result.trained) == ["bf16/seed0", "bf16/seed1"] and not result.failed
    retried = json.loads((out / "runs/bf16/seed0/done.json").read_text())
    assert retried["status"] == "finished" and retried["steps"] == 48 and retried["resumed_from_step"] >= 2
    untouched = json.loads((out / "runs/bf16/seed1/done.json").read_text())
    assert untouched["status"] == "finished" and untouched["resumed_from_step"] is None
    again = run_study(
        spec, out, device="cpu", resume=True, show_progress=False, options=ExecutionOptions(executor="ray")
    )
    assert again.trained == [] and again.already_done == ["bf16/seed0", "bf16/seed1"]


def _overlap(first: Path, second: Path) -> bool:
    """Whether two runs trained at the same time: each started (config.json) before the other ended (done.json)."""
    start = {run: (run / "config.json").stat().st_mtime for run in (first, second)}
    end = {run: (run / "done.json").stat().st_mtime for run in (first, second)}
    return start[first] < end[second] and start[second] < end[first]


def test_two_runs_per_device_train_at_once_and_give_the_same_bits(tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ['arms=["bf16"]', "seeds=[0, 1]", "train.max_steps=48"])
    done_when_all_started: list[list[str]] = []  # the runs with a done.json when the hook ran
    result = run_study(
        spec,
        tmp_path / "shared",
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="local", runs_per_device=2),
        when_all_started=lambda: done_when_all_started.append(
            sorted(path.parent.name for path in (tmp_path / "shared/runs").glob("*/*/done.json"))
        ),
    )
    assert sorted(result.trained) == ["bf16/seed0", "bf16/seed1"] and not result.failed
    assert done_when_all_started == [[]]  # once, as both runs had started and neither had finished
    runs = tmp_path / "shared/runs/bf16"
    assert _overlap(runs / "seed0", runs / "seed1")
    assert json.loads((tmp_path / "shared/study.json").read_text())["execution"]["runs_per_device"] == 2
    run_study(spec, tmp_path / "inline", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    for seed in ("seed0", "seed1"):
        assert _eval_bytes(runs / seed) == _eval_bytes(tmp_path / "inline/runs/bf16" / seed), seed


def test_runs_per_device_refuses_zero_and_ddp(tmp_path):
    spec = load_spec(QUICKSTART, MICRO)
    with pytest.raises(ValueError, match="runs-per-device must be >= 1, got 0"):
        run_study(
            spec,
            tmp_path / "a",
            device="cpu",
            show_progress=False,
            options=ExecutionOptions(executor="local", runs_per_device=0),
        )
    with pytest.raises(ValueError, match="does not combine with --runs-per-device 2"):
        run_study(
            spec,
            tmp_path / "b",
            device="cpu",
            show_progress=False,
            options=ExecutionOptions(executor="local", nproc_per_node=2, runs_per_device=2),
        )
    with pytest.raises(ValueError, match="execution.runs_per_device must be >= 1, got 0"):
        load_spec(QUICKSTART, MICRO + ["execution.runs_per_device=0"])


@pytest.mark.gpu
def test_gpu_local_executor_runs_on_the_gpus_asked_for(tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ["seeds=[0, 1]", "train.max_steps=3"])
    result = run_study(
        spec, tmp_path / "out", device="cuda", show_progress=False, options=ExecutionOptions(gpus=1, executor="local")
    )
    assert sorted(result.trained) == ["bf16/seed0", "bf16/seed1", "mxfp8-rceil-sr/seed0", "mxfp8-rceil-sr/seed1"]
    assert not result.failed
    execution = json.loads((tmp_path / "out/study.json").read_text())["execution"]
    assert execution["devices"] == ["cuda:0"] and execution["gpus"] == 1
    for label in result.trained:
        assert json.loads((tmp_path / "out/runs" / label / "config.json").read_text())["device"] == "cuda:0"
    shared = run_study(
        spec,
        tmp_path / "shared",
        device="cuda",
        show_progress=False,
        options=ExecutionOptions(gpus=1, executor="local", runs_per_device=2),
    )
    assert sorted(shared.trained) == sorted(result.trained) and not shared.failed
    first_two = [tmp_path / "shared/runs" / label for label in ("bf16/seed0", "mxfp8-rceil-sr/seed0")]  # the job order
    assert _overlap(*first_two)


def test_a_fork_study_gives_the_same_bits_inline_local_and_on_ray(local_ray, tmp_path):
    from tests.experiment.test_fork import FORK, RUNS

    spec = load_spec(QUICKSTART, FORK)
    for executor in ("inline", "local", "ray"):
        result = run_study(
            spec, tmp_path / executor, device="cpu", show_progress=False, options=ExecutionOptions(executor=executor)
        )
        assert not result.failed and sorted(result.trained) == sorted(RUNS), executor
    for run in RUNS:
        assert (
            _eval_bytes(tmp_path / "inline/runs" / run)
            == _eval_bytes(tmp_path / "local/runs" / run)
            == _eval_bytes(tmp_path / "ray/runs" / run)
        ), run
