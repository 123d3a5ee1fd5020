"""[train] compile: the training step calls the model through torch.compile; on the stand-in plug-ins (one hidden
layer) with real recipes on the CPU.

The bit-for-bit tests compile with the "aot_eager" backend (mxlab.experiment.train.COMPILE_BACKEND): Dynamo's
graphs and AOTAutograd's joint forward and backward, run by eager kernels, so what they check is that tracing the
model changes nothing; Inductor's code generation (the default backend) is exercised by the slow test only (on this
CPU it takes about 30 s to compile the stand-in model from an empty cache).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import mxlab.experiment.train as train_module
from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from mxlab.experiment.study_jobs import study_jobs
from mxlab.experiment.train import train_run
from mxlab.experiment.worker import make_data_source
from mxlab.recipe import find_recipe
from tests.experiment import standins

SHORT = ["seeds=[0]", "train.max_steps=8"]  # checkpoints at 4 and 8, log records at 3, 6 and 8
FORK = [
    'arms=["base", "noisy"]',
    'train.fork_from="base"',
    "train.fork_steps=4",
    "train.max_steps=4",
]  # warm-up 1-4, arms 5-8


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("spec")
    standins.write_recipes(folder, "base", "noisy")  # noisy: mxfp8-rceil (round to nearest: deterministic)
    stochastic = re.sub(r'^name = ".*"$', 'name = "sr"', find_recipe("mxfp8-rceil-sr").read_text(), count=1, flags=re.M)
    (folder / "recipes/sr.toml").write_text(stochastic)  # its products draw seeds: they run eagerly inside the graph
    path = folder / "compile.toml"
    path.write_text(
        standins.spec_text("compile", [0]).replace('arms = ["base", "noisy"]', 'arms = ["base", "noisy", "sr"]')
    )
    return path


class Compiles:
    """torch.compile's backend in train.py for a test: "aot_eager" behind a counter of the frames it compiles, and
    a record of the module each training step called."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, backend: str | None = "aot_eager") -> None:
        from torch._dynamo.testing import CompileCounterWithBackend

        self.counter = CompileCounterWithBackend(backend) if backend else None
        self.called: list[torch.nn.Module] = []
        step = train_module.train_step

        def recording(model, *args, **kwargs):
            self.called.append(model)
            return step(model, *args, **kwargs)

        monkeypatch.setattr(train_module, "train_step", recording)
        monkeypatch.setattr(train_module, "COMPILE_BACKEND", self.counter)


def _train(spec_path: Path, runs: Path, overrides: list[str], arm: str = "noisy", on_step=None):
    spec = load_spec(spec_path, SHORT + overrides)
    (job,) = [job for job in study_jobs(spec, runs) if job.arm == arm]
    result = train_run(job, make_data_source(spec), "cpu", on_step=on_step)
    return job.run_dir, result


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)


def _metrics(run_dir: Path) -> list[dict]:
    keep = lambda record: {k: v for k, v in record.items() if k not in ("time_s", "examples_per_s")}
    return [keep(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _eval_bytes(run_dir: Path) -> dict[str, bytes]:
    with np.load(run_dir / "eval.npz") as npz:
        return {key: npz[key].tobytes() for key in npz.files}


def _assert_same_run(got: Path, want: Path) -> None:
    """The same losses, gradient norms and loss scales in every log record, the same final weights and optimizer
    state bit for bit, the same eval.npz; checkpoints with the same keys (the plain model's)."""
    assert _metrics(got) == _metrics(want)
    got_checkpoint, want_checkpoint = _checkpoint(got), _checkpoint(want)
    assert list(got_checkpoint["model"]) == list(want_checkpoint["model"])
    assert not any(key.startswith("_orig_mod.") for key in got_checkpoint["model"])
    for key, tensor in want_checkpoint["model"].items():
        assert torch.equal(got_checkpoint["model"][key], tensor), key
    assert torch.equal(
        torch.cat([t.reshape(-1) for t in _state_tensors(got_checkpoint["optimizer"])]),
        torch.cat([t.reshape(-1) for t in _state_tensors(want_checkpoint["optimizer"])]),
    )
    assert _eval_bytes(got) == _eval_bytes(want)


def _state_tensors(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state.float()]
    if isinstance(state, dict):
        return [t for key in sorted(state, key=str) for t in _state_tensors(state[key])]
    if isinstance(state, (list, tuple)):
        return [t for item in state for t in _state_tensors(item)]
    return []


@pytest.fixture(scope="module")
def eager_run(spec_path, tmp_path_factory) -> Path:
    run_dir, result = _train(spec_path, tmp_path_factory.mktemp("eager"), [])
    assert result.status == "finished" and result.steps == 8
    return run_dir


def test_a_compiled_run_trains_through_the_compiled_module_and_records_it(spec_path, tmp_path, monkeypatch):
    compiles = Compiles(monkeypatch)
    run_dir, result = _train(spec_path, tmp_path, ["train.compile=true"])
    assert result.status == "finished" and result.steps == 8
    assert len(compiles.called) == 8 and all(isinstance(m, torch._dynamo.OptimizedModule) for m in compiles.called)
    assert type(compiles.called[0]._orig_mod).__name__ == "StandinModel"
    assert compiles.counter.frame_count == 1  # one graph: no recompile from step to step
    assert json.loads((run_dir / "config.json").read_text())["train"]["compile"] is True


def test_an_eager_run_records_compile_false(spec_path, eager_run):
    assert json.loads((eager_run / "config.json").read_text())["train"]["compile"] is False
    assert load_spec(spec_path).train.compile is False  # the default


@pytest.mark.parametrize("arm", ["noisy", "sr"], ids=["mxfp8-rceil", "mxfp8-rceil-sr"])
def test_a_compiled_run_of_an_mx_recipe_has_the_eager_runs_bits(spec_path, eager_run, arm, tmp_path, monkeypatch):
    want = eager_run if arm == "noisy" else _train(spec_path, tmp_path / "eager", [], arm)[0]
    Compiles(monkeypatch)
    got, _ = _train(spec_path, tmp_path / "compiled", ["train.compile=true"], arm)
    _assert_same_run(got, want)
    if arm == "sr":  # the stochastic-rounding counters advanced as in eager mode
        assert _checkpoint(got)["rounding"] == _checkpoint(want)["rounding"]


def test_a_compiled_runs_checkpoint_resumes_to_the_same_bits(spec_path, eager_run, tmp_path, monkeypatch):
    compiles = Compiles(monkeypatch)

    def kill(step: int) -> None:
        if step == 6:  # after the checkpoint of step 4
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        _train(spec_path, tmp_path, ["train.compile=true"], on_step=kill)
    written = _checkpoint(tmp_path / "noisy/seed0")
    assert written["step"] == 4 and list(written["model"]) == list(_checkpoint(eager_run)["model"])
    run_dir, result = _train(spec_path, tmp_path, ["train.compile=true"])
    assert result.resumed_from_step == 4 and result.steps == 8
    assert compiles.counter.frame_count == 2  # each attempt compiled its own model
    _assert_same_run(run_dir, eager_run)


def test_fork_arms_start_from_a_compiled_warmup(spec_path, tmp_path, monkeypatch):
    options = ExecutionOptions(executor="inline")
    run_study(
        load_spec(spec_path, SHORT + FORK), tmp_path / "eager", device="cpu", show_progress=False, options=options
    )
    compiles = Compiles(monkeypatch)
    compiled = load_spec(spec_path, SHORT + FORK + ["train.compile=true"])
    result = run_study(compiled, tmp_path / "compiled", device="cpu", show_progress=False, options=options)
    assert not result.failed and sorted(result.trained) == ["_fork/seed0", "base/seed0", "noisy/seed0"]
    assert compiles.counter.frame_count == 3 and len(compiles.called) == 12  # 4 warm-up steps, 4 in each arm
    for run in ("_fork/seed0", "base/seed0", "noisy/seed0"):
        assert json.loads((tmp_path / "compiled/runs" / run / "config.json").read_text())["train"]["compile"]
        _assert_same_run(tmp_path / "compiled/runs" / run, tmp_path / "eager/runs" / run)
    assert [r["step"] for r in _metrics(tmp_path / "compiled/runs/noisy/seed0")] == [6, 8]


@pytest.mark.parametrize("value", ['"yes"', "1"])
def test_a_compile_value_other_than_true_or_false_is_refused(spec_path, value):
    with pytest.raises(ValueError, match=r"train\.compile must be true or false, got .*(yes|1)"):
        load_spec(spec_path, [f"train.compile={value}"])
    with pytest.raises(ValueError, match=r"train\.compile must be true or false"):
        load_spec(spec_path).with_train(compile="yes")


@pytest.mark.slow
def test_a_run_compiled_by_inductor_trains_close_to_eager(spec_path, eager_run, tmp_path, monkeypatch):
    """Inductor, torch.compile's default backend, on the CPU (it needs a C++ compiler; about 30 s from an empty
    cache). Its generated kernels need not keep eager mode's bits: the losses agree closely."""
    compiles = Compiles(monkeypatch, backend=None)
    run_dir, result = _train(spec_path, tmp_path, ["train.compile=true"])
    assert result.status == "finished" and result.steps == 8
    assert all(isinstance(m, torch._dynamo.OptimizedModule) for m in compiles.called)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    losses = [record["loss"] for record in _metrics(run_dir)]
    assert losses == pytest.approx([record["loss"] for record in _metrics(eager_run)], rel=1e-3)
