"""The fork design and post-training arms on the real tiny model and synthetic data (inline executor)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from mxlab.experiment.study_jobs import study_jobs
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

FORK = MICRO + [
    'arms=["bf16", "mxfp8-rceil", "post:mxfp8-rceil"]',
    "train.fork_from=bf16",
    # warm-up steps 1-4 (checkpoint at 3); arms steps 5-8 (checkpoint at 6), across the epoch end at 6
    "train.fork_steps=4",
    "train.checkpoint_every=3",
    "train.eval_every=2",
    "train.eval_slice=128",
]
RUNS = ("_fork/seed0", "bf16/seed0", "mxfp8-rceil/seed0", "post:mxfp8-rceil/seed0")


def _spec(extra=()):
    return load_spec(QUICKSTART, FORK + list(extra))


def _eval_bytes(run_dir: Path) -> dict[str, bytes]:
    with np.load(run_dir / "eval.npz") as npz:
        return {key: npz[key].tobytes() for key in npz.files}


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    result = run_study(_spec(), out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    assert not result.failed and set(result.trained) == set(RUNS)
    return out


def test_fork_study_layout_design_and_continued_data_stream(reference):
    study = json.loads((reference / "study.json").read_text())
    assert (
        study["design"]["kind"] == "fork" and study["design"]["from"] == "bf16" and study["design"]["warmup_steps"] == 4
    )
    warmup = reference / "runs/_fork/seed0"
    assert json.loads((warmup / "done.json").read_text())["steps"] == 4
    assert json.loads((warmup / "config.json").read_text())["train"]["max_steps"] == 4
    for arm in ("bf16", "mxfp8-rceil"):
        records = _metrics(reference / "runs" / arm / "seed0")
        assert [r["step"] for r in records] == [5, 6, 7, 8]
        assert [r["epoch"] for r in records] == [0, 0, 1, 1]  # 6 batches an epoch: the stream goes on past the warm-up
        assert [r["step"] for r in records if "heldout" in r] == [6, 8]
        assert records[1]["heldout"]["examples"] == 128 and 0 < records[1]["heldout"]["ctr.ne"] < 2
        assert json.loads((reference / "runs" / arm / "seed0/config.json").read_text())["fork"]["from"].endswith(
            "_fork/seed0"
        )
    assert [r["step"] for r in _metrics(warmup) if "heldout" in r] == [2, 4]


@pytest.mark.parametrize(
    "kill",
    [("_fork", 1), ("_fork", 3), ("bf16", 5), ("mxfp8-rceil", 7)],
    ids=["warmup-before-checkpoint", "warmup-after-checkpoint", "between-warmup-and-arms", "during-arm"],
)
def test_fork_study_resumes_after_a_kill_bit_identical(reference, tmp_path, kill):
    def hook(job, step):
        if (job.arm, step) == kill:
            raise KeyboardInterrupt(f"killed at {job.label} step {step}")

    with pytest.raises(KeyboardInterrupt):
        run_study(
            _spec(),
            tmp_path,
            device="cpu",
            show_progress=False,
            on_step=hook,
            options=ExecutionOptions(executor="inline"),
        )
    assert not (tmp_path / "runs/post:mxfp8-rceil/seed0/done.json").exists()
    resumed = run_study(
        _spec(), tmp_path, device="cpu", show_progress=False, resume=True, options=ExecutionOptions(executor="inline")
    )
    assert not resumed.failed
    for label in RUNS:
        assert _eval_bytes(tmp_path / "runs" / label) == _eval_bytes(reference / "runs" / label), label
        strip = lambda records: [{k: v for k, v in r.items() if k not in ("time_s", "examples_per_s")} for r in records]
        assert strip(_metrics(tmp_path / "runs" / label)) == strip(_metrics(reference / "runs" / label)), label


def test_the_arms_of_a_seed_start_from_the_warmup_weights_and_optimizer_state(tmp_path, monkeypatch):
    import mxlab.experiment.train as train_module

    loaded: list[tuple[int, dict[str, torch.Tensor], int]] = []
    original = train_module.start_from_fork

    def recording(fork_dir, model, optimizer=None):
        position = original(fork_dir, model, optimizer)
        moments = len(optimizer.state_dict()["dense"]["state"]) if optimizer is not None else -1
        loaded.append((position[0], {k: v.clone() for k, v in model.state_dict().items()}, moments))
        return position

    monkeypatch.setattr(train_module, "start_from_fork", recording)
    run_study(
        _spec(['arms=["bf16", "mxfp8-rceil", "mxfp4-all"]']),
        tmp_path,
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    warmup = torch.load(tmp_path / "runs/_fork/seed0/checkpoint.pt", weights_only=True)
    assert [entry[0] for entry in loaded] == [4, 4, 4]
    for _, weights, moments in loaded:
        assert weights.keys() == warmup["model"].keys() and all(
            torch.equal(weights[k], warmup["model"][k]) for k in weights
        )
        assert moments == len(warmup["optimizer"]["dense"]["state"]) > 0  # AdamW's moments carried over
    assert _eval_bytes(tmp_path / "runs/bf16/seed0") != _eval_bytes(tmp_path / "runs/mxfp4-all/seed0")


def test_post_training_arm_is_a_forward_pass_of_the_baseline_model(reference):
    from mxlab.experiment.evaluate import evaluate_model
    from mxlab.experiment.step import autocast
    from mxlab.experiment.train import build_run_model
    from mxlab.experiment.worker import make_data_source

    spec = _spec()
    post = reference / "runs/post:mxfp8-rceil/seed0"
    assert _metrics(post) == [] and json.loads((post / "done.json").read_text())["status"] == "finished"
    baseline = torch.load(reference / "runs/bf16/seed0/checkpoint.pt", weights_only=True)
    assert torch.equal(
        torch.load(post / "checkpoint.pt", weights_only=True)["model"]["towers.ctr.out.weight"],
        baseline["model"]["towers.ctr.out.weight"],
    )  # nothing trained
    job = next(job for job in study_jobs(spec, reference / "runs") if job.arm == "post:mxfp8-rceil")
    source = make_data_source(spec)
    model, _ = build_run_model(job, source.info)
    model.load_state_dict(baseline["model"])
    with autocast(torch.device("cpu"), spec.train.precision):
        arrays = evaluate_model(model, source, spec.train.eval_batch_size, "cpu")
    assert {k: v.tobytes() for k, v in arrays.items()} == _eval_bytes(post)
    assert (
        _eval_bytes(post)["p_ctr"] != _eval_bytes(reference / "runs/bf16/seed0")["p_ctr"]
    )  # the recipe changed the forward


def test_a_diverged_warmup_fails_its_arms_and_says_why(tmp_path):
    result = run_study(
        _spec(["train.min_loss_scale=1e30"]),
        tmp_path,
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    assert "_fork/seed0" in result.diverged
    assert set(result.failed) == {"bf16/seed0", "mxfp8-rceil/seed0", "post:mxfp8-rceil/seed0"}
    assert "_fork/seed0, diverged" in result.failed["bf16/seed0"]
    assert "bf16/seed0, failed" in result.failed["post:mxfp8-rceil/seed0"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.fork_from=nope"], r"train.fork_from: unknown arm/recipe 'nope'.*bf16"),
        (["train.fork_steps=0"], r"fork_from \('bf16'\) and train.fork_steps \(0\) go together"),
        (['train.fork_from=""'], r"fork_from \(''\) and train.fork_steps \(4\) go together"),
        (["train.fork_steps=-2"], r"train.fork_steps must be >= 0.*-2"),
        (["train.fork_steps=2.5"], r"train.fork_steps must be an integer, got 2.5"),
        (
            ["train.eval_every=3", "train.log_every=2"],
            r"train.eval_every \(3\) must be a multiple of train.log_every \(2\)",
        ),
        (['arms=["bf16", "post:nope"]'], r"unknown arm/recipe 'nope'"),
        (['baseline="post:bf16"', 'arms=["post:bf16", "bf16"]'], r"baseline 'post:bf16' is a post-training arm"),
    ],
)
def test_bad_fork_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        _spec(overrides)


def test_the_report_names_the_design_and_draws_the_held_out_curves(reference):
    from mxlab.report import write_report

    written = write_report(reference)
    text = (reference / "report.md").read_text()
    assert "Design: **fork**" in text and "trained 4 steps" in text and "figures/heldout.png" in written


def test_a_study_recorded_before_the_fork_keys_existed_still_resumes(tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ["train.max_steps=2"])
    run_study(spec, tmp_path, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    study = json.loads((tmp_path / "study.json").read_text())
    for key in ("fork_from", "fork_steps", "eval_every", "eval_slice"):
        del study["train"][key]
    (tmp_path / "study.json").write_text(json.dumps(study))
    resumed = run_study(
        spec, tmp_path, device="cpu", show_progress=False, resume=True, options=ExecutionOptions(executor="inline")
    )
    assert resumed.trained == [] and len(resumed.already_done) == 2
    # that resume rendered only, so study.json still lacks the key: recorded as null, not at its default
    with pytest.raises(ValueError, match=r"train.fork_from null \(recorded\) vs \"bf16\""):
        run_study(
            load_spec(QUICKSTART, MICRO + ["train.max_steps=2", "train.fork_from=bf16", "train.fork_steps=2"]),
            tmp_path,
            device="cpu",
            show_progress=False,
            resume=True,
            options=ExecutionOptions(executor="inline"),
        )


def test_the_layer_sweep_continues_from_the_warmup_in_the_fork_design(tmp_path, monkeypatch):
    from mxlab.experiment import sweep

    spec = _spec(['arms=["bf16", "mxfp8-rceil"]'])
    monkeypatch.setattr(
        "mxlab.recipe.quantizable_modules", lambda model, recipe: ["towers.ctr.out", "towers.cvr.out"]
    )  # two, for time
    result = sweep.sweep_layers(
        spec, "mxfp8-rceil", seeds=[0], steps=2, out_dir=tmp_path, device="cpu", show_progress=False
    )
    runs = tmp_path / "sweep/runs"
    assert json.loads((runs / "_fork/seed0/done.json").read_text())["steps"] == 4
    for arm in ("bf16", "mxfp8-rceil", "only--towers.ctr.out", "allbut--towers.cvr.out"):
        done = json.loads((runs / arm / "seed0/done.json").read_text())
        assert done["status"] == "finished" and done["steps"] == 6, arm  # 4 warm-up steps, then 2 of its own
        assert [m["step"] for m in _metrics(runs / arm / "seed0")][0] > 4, arm
    assert "from the seed's bf16 warm-up of 4 steps" in result.table
    assert json.loads(result.json_path.read_text())["design"]["kind"] == "fork"


def test_a_sweep_in_worker_processes_gives_the_ranking_of_one_in_this_process(tmp_path, monkeypatch):
    from mxlab.experiment import sweep

    spec = _spec(['arms=["bf16", "mxfp8-rceil"]'])
    monkeypatch.setattr("mxlab.recipe.quantizable_modules", lambda model, recipe: ["towers.ctr.out"])  # one, for time
    inline = sweep.sweep_layers(
        spec, "mxfp8-rceil", seeds=[0], steps=2, out_dir=tmp_path / "inline", device="cpu", show_progress=False
    )
    workers = sweep.sweep_layers(
        spec,
        "mxfp8-rceil",
        seeds=[0],
        steps=2,
        out_dir=tmp_path / "workers",
        device="cpu",
        show_progress=False,
        runs_per_device=2,
    )
    ranking = [json.loads(result.json_path.read_text())["ranking"] for result in (inline, workers)]
    assert ranking[0] == ranking[1] and ranking[0][0]["module"] == "towers.ctr.out"
    with pytest.raises(ValueError, match="--mps needs CUDA devices"):
        sweep.sweep_layers(spec, "mxfp8-rceil", seeds=[0], steps=2, out_dir=tmp_path / "mps", device="cpu", mps=True)
    with pytest.raises(ValueError, match="runs_per_device must be >= 1, got 0"):
        sweep.sweep_layers(
            spec, "mxfp8-rceil", seeds=[0], steps=2, out_dir=tmp_path / "zero", device="cpu", runs_per_device=0
        )


DECAY = ["train.lr_decay_steps=3"]  # the arms' steps 5-8: rates lr, lr, 2/3 lr, 1/3 lr


def test_learning_rate_is_constant_then_decays_linearly_over_the_last_steps():
    from mxlab.experiment.optim import learning_rate

    train = _spec(DECAY).train
    assert [learning_rate(train, step, 8) for step in range(1, 9)] == pytest.approx(
        [train.lr] * 6 + [train.lr * 2 / 3, train.lr / 3]
    )
    assert learning_rate(train, 9, 8) == pytest.approx(train.lr / 3)  # past an estimated end: the last step's rate
    assert [learning_rate(_spec().train, step, 8) for step in (1, 8)] == [train.lr, train.lr]
    with pytest.raises(ValueError, match="steps count from 1, got 0"):
        learning_rate(train, 0, 8)


def test_lr_decay_ends_each_arm_and_leaves_the_warmup_constant(tmp_path, monkeypatch):
    import mxlab.experiment.train as train_module

    taken: list[float] = []  # the rate of every step, in the inline executor's order: warm-up, bf16, mxfp8-rceil
    original = train_module.train_step

    def recording(model, batch, optimizer, *args, **kwargs):
        taken.append(optimizer.param_groups[0]["lr"])
        return original(model, batch, optimizer, *args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", recording)
    spec = _spec(DECAY + ['arms=["bf16", "mxfp8-rceil"]'])
    run_study(spec, tmp_path, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    lr = spec.train.lr
    arm = [lr, lr, lr * 2 / 3, lr / 3]
    assert taken == pytest.approx([lr] * 4 + arm + arm)
    assert json.loads((tmp_path / "runs/_fork/seed0/config.json").read_text())["train"]["lr_decay_steps"] == 0


def test_a_decaying_fork_study_resumes_after_a_kill_bit_identical(reference, tmp_path):
    def hook(job, step):
        if (job.arm, step) == ("mxfp8-rceil", 7):  # inside the decay, after the checkpoint at step 6
            raise KeyboardInterrupt("killed")

    spec = _spec(DECAY + ['arms=["bf16", "mxfp8-rceil"]'])
    run_study(spec, tmp_path / "whole", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    with pytest.raises(KeyboardInterrupt):
        run_study(
            spec,
            tmp_path / "killed",
            device="cpu",
            show_progress=False,
            on_step=hook,
            options=ExecutionOptions(executor="inline"),
        )
    run_study(
        spec,
        tmp_path / "killed",
        device="cpu",
        show_progress=False,
        resume=True,
        options=ExecutionOptions(executor="inline"),
    )
    for label in ("bf16/seed0", "mxfp8-rceil/seed0"):
        assert _eval_bytes(tmp_path / "killed/runs" / label) == _eval_bytes(tmp_path / "whole/runs" / label), label
    assert _eval_bytes(tmp_path / "whole/runs/bf16/seed0") != _eval_bytes(
        reference / "runs/bf16/seed0"
    )  # the decay trains differently


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lr_decay_steps=-1"], r"train.lr_decay_steps must be >= 0 \(0 = off\), got -1"),
        (["train.lr_decay_steps=5"], r"train.lr_decay_steps \(5\) must be <= train.max_steps \(4\)"),
    ],
)
def test_bad_lr_decay_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        _spec(overrides)


def test_swapped_pairs_keeps_the_prefix_and_swaps_each_following_pair():
    from mxlab.experiment.data_order import swapped_pairs

    assert list(swapped_pairs(range(7), 2)) == [0, 1, 3, 2, 5, 4, 6]
    assert list(swapped_pairs(range(4), 0)) == [1, 0, 3, 2]
    assert list(swapped_pairs(range(3), 5)) == [0, 1, 2]


def _recorded_batches(monkeypatch, spec, out, **kwargs):
    """Run the study inline; return a fingerprint (sparse ids and users) of every batch trained, in order."""
    import mxlab.experiment.train as train_module

    seen: list[bytes] = []
    original = train_module.train_step

    def recording(model, batch, *args, **inner):
        seen.append(batch.sparse.numpy().tobytes() + batch.user_id.numpy().tobytes())
        return original(model, batch, *args, **inner)

    monkeypatch.setattr(train_module, "train_step", recording)
    run_study(spec, out, device="cpu", show_progress=False, **kwargs, options=ExecutionOptions(executor="inline"))
    monkeypatch.setattr(train_module, "train_step", original)
    return seen


def test_the_fork_placebo_takes_the_baselines_batches_swapped_in_pairs(tmp_path, monkeypatch):
    seen = _recorded_batches(monkeypatch, _spec(['arms=["bf16", "placebo"]']), tmp_path)
    warmup, bf16, placebo = seen[:4], seen[4:8], seen[8:]
    assert len(placebo) == 4 and len(set(warmup + bf16)) == 8
    # steps 5-6 end epoch 0 (the warm-up took 4 of its 6 batches), steps 7-8 open epoch 1: a pair in each
    assert placebo == [bf16[1], bf16[0], bf16[3], bf16[2]]
    config = json.loads((tmp_path / "runs/placebo/seed0/config.json").read_text())
    assert config["data_order_seed"] == 0


def test_a_fork_placebo_killed_mid_pair_resumes_bit_identical(tmp_path, monkeypatch):
    spec = _spec(
        ['arms=["bf16", "placebo"]', "train.checkpoint_every=5"]
    )  # the placebo's checkpoint at step 5: mid-pair

    def hook(job, step):
        if (job.arm, step) == ("placebo", 6):
            raise KeyboardInterrupt("killed")

    whole = _recorded_batches(monkeypatch, spec, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run_study(
            spec,
            tmp_path / "killed",
            device="cpu",
            show_progress=False,
            on_step=hook,
            options=ExecutionOptions(executor="inline"),
        )
    resumed = _recorded_batches(monkeypatch, spec, tmp_path / "killed", resume=True)
    assert resumed == whole[-3:]  # steps 6-8 again from the checkpoint at 5, in the same swapped order
    assert _eval_bytes(tmp_path / "killed/runs/placebo/seed0") == _eval_bytes(tmp_path / "whole/runs/placebo/seed0")
