"""`[train] stop_after`: a run stopped early in its schedule takes the first steps of the full run."""

from __future__ import annotations

import json

import pytest

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

SCHEDULE = MICRO + [
    'arms=["bf16"]',
    "train.fork_from=''",
    "train.fork_steps=0",
    "train.epochs=2",  # 12 batches of 64: the step cap, not the data, ends the run
    "train.max_steps=8",
    "train.warmup_share=0.5",
    "train.lr_decay_steps=2",
    "train.checkpoint_every=2",
]


def _rates(monkeypatch, overrides, out):
    """Run the study inline; return the learning rate of every training step taken."""
    import mxlab.experiment.train as train_module

    taken: list[float] = []
    original = train_module.train_step

    def recording(model, batch, optimizer, *args, **kwargs):
        taken.append(optimizer.param_groups[0]["lr"])
        return original(model, batch, optimizer, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "train_step", recording)
        spec = load_spec(QUICKSTART, SCHEDULE + overrides)
        run_study(spec, out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    return taken


def test_a_stopped_run_takes_the_first_steps_of_the_full_schedule(tmp_path, monkeypatch):
    full = _rates(monkeypatch, [], tmp_path / "full")
    stopped = _rates(monkeypatch, ["train.stop_after=3"], tmp_path / "stopped")
    assert len(full) == 8 and len(stopped) == 3
    assert stopped == pytest.approx(full[:3])  # the warm-up of 8 steps' schedule, not of 3 steps'
    assert full[1] < full[3] and full[-1] < full[-3]  # rising at steps 2-4 (a 3-step schedule: at lr by step 2)
    done = json.loads((tmp_path / "stopped/runs/bf16/seed0/done.json").read_text())
    assert done["status"] == "finished" and done["steps"] == 3

    def losses(out):
        lines = (out / "runs/bf16/seed0/metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines]

    assert losses(tmp_path / "stopped") == losses(tmp_path / "full")[:3]  # the same steps, bit for bit


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.stop_after=-1"], r"train.stop_after must be >= 0 \(0 = off\), got -1"),
        (["train.stop_after=9"], r"train.stop_after \(9\) must be <= train.max_steps \(8\)"),
        (["train.fork_from=bf16", "train.fork_steps=2", "train.stop_after=3"], r"needs a from-scratch study"),
    ],
)
def test_bad_stop_after_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_spec(QUICKSTART, SCHEDULE + overrides)
