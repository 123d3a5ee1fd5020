"""The runner's own logic on the stand-in plug-ins and real recipes: pairing, resume, divergence, refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from tests.experiment import standins

SPEC = standins.spec_text("logic", [0, 1])


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, list[float]]]:
    """The training batches the stand-in source serves, as (seed, epoch, each example's first feature)."""
    served: list[tuple[int, int, list[float]]] = []
    train_batches = standins.StandinSource.train_batches

    def recording(self, batch_size, seed, epoch):
        for batch in train_batches(self, batch_size, seed, epoch):
            served.append((seed, epoch, batch.dense[:, 0].tolist()))
            yield batch

    monkeypatch.setattr(standins.StandinSource, "train_batches", recording)
    return served


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    standins.write_recipes(tmp_path, "base", "noisy", "poisoned", "collapsing")
    path = tmp_path / "logic.toml"
    path.write_text(SPEC)
    return path


def _eval(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "eval.npz") as npz:
        return {key: npz[key] for key in npz.files}


def test_pairing_same_data_order_and_init_within_a_seed(served, spec_path, tmp_path, monkeypatch):
    initial_states: list[dict[str, torch.Tensor]] = []
    build = standins.build_standin

    def recording_build(info, heads, /, **keywords):
        model = build(info, heads, **keywords)
        initial_states.append({k: v.clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(standins, "build_standin", recording_build)
    monkeypatch.setattr("mxlab.experiment.runner.preflight", lambda jobs, source, device: None)  # count run builds only
    spec = load_spec(spec_path)
    run_study(spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))

    # seed-major order: (seed0, base), (seed0, noisy), (seed1, base), (seed1, noisy)
    assert len(initial_states) == 4
    for key in initial_states[0]:
        assert torch.equal(initial_states[0][key], initial_states[1][key])
        assert torch.equal(initial_states[2][key], initial_states[3][key])
    assert not torch.equal(initial_states[0]["out.weight"], initial_states[2]["out.weight"])

    steps_per_run = 2 * (96 // 16)
    orders = [served[i * steps_per_run : (i + 1) * steps_per_run] for i in range(4)]
    assert orders[0] == orders[1] and orders[2] == orders[3]
    assert orders[0] != orders[2]
    assert {seed for seed, _, _ in orders[2]} == {1}

    out = tmp_path / "out"
    base, noisy = _eval(out / "runs/base/seed0"), _eval(out / "runs/noisy/seed0")
    np.testing.assert_array_equal(base["click"], noisy["click"])  # same eval examples, same order
    assert not np.array_equal(base["p_ctr"], noisy["p_ctr"])  # the arms really differ
    np.testing.assert_allclose(base["p_ctcvr"], base["p_ctr"] * base["p_cvr"], rtol=1e-6)
    done = json.loads((out / "runs/base/seed0/done.json").read_text())
    assert done["status"] == "finished" and done["steps"] == steps_per_run
    metrics = [json.loads(line) for line in (out / "runs/base/seed0/metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == [3, 6, 9, 12]
    study = json.loads((out / "study.json").read_text())
    assert study["arms"] == ["base", "noisy"] and study["environment"]["torch"] == torch.__version__
    assert "mxlab run" in study["command"] and "--device cpu" in study["command"]


class Kill(Exception):
    pass


def test_resume_after_kill_is_bit_identical_and_recomputes_nothing_finished(spec_path, tmp_path):
    spec = load_spec(spec_path, ["seeds=[0]"])
    reference = tmp_path / "reference"
    run_study(spec, reference, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))

    interrupted = tmp_path / "interrupted"

    def kill_second_run(job, step):
        if job.arm == "noisy" and step == 7:  # after the checkpoint at step 4, before the one at 8
            raise Kill()

    with pytest.raises(Kill):
        run_study(
            spec,
            interrupted,
            device="cpu",
            show_progress=False,
            on_step=kill_second_run,
            options=ExecutionOptions(executor="inline"),
        )
    finished = interrupted / "runs/base/seed0"
    killed = interrupted / "runs/noisy/seed0"
    assert (finished / "done.json").exists() and not (killed / "done.json").exists()
    assert torch.load(killed / "checkpoint.pt", weights_only=True)["step"] == 4
    stamps = {path.name: path.stat().st_mtime_ns for path in finished.iterdir()}

    with pytest.raises(ValueError, match="--resume"):
        run_study(spec, interrupted, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    changed = load_spec(spec_path, ["seeds=[0]", "train.lr=0.5"])
    with pytest.raises(ValueError, match=r"cannot resume .*: train\.lr 0\.05 \(recorded\) vs 0\.5 \(now\); use"):
        run_study(
            changed,
            interrupted,
            device="cpu",
            resume=True,
            show_progress=False,
            options=ExecutionOptions(executor="inline"),
        )

    steps_seen: list[tuple[str, int]] = []
    result = run_study(
        spec,
        interrupted,
        device="cpu",
        resume=True,
        show_progress=False,
        on_step=lambda job, step: steps_seen.append((job.arm, step)),
        options=ExecutionOptions(executor="inline"),
    )
    assert result.already_done == ["base/seed0"] and result.trained == ["noisy/seed0"]
    assert {path.name: path.stat().st_mtime_ns for path in finished.iterdir()} == stamps
    assert steps_seen[0] == ("noisy", 5) and steps_seen[-1][1] == 12  # continued from step 4
    assert json.loads((killed / "done.json").read_text())["resumed_from_step"] == 4

    for arm in ("base", "noisy"):
        a, b = _eval(reference / f"runs/{arm}/seed0"), _eval(interrupted / f"runs/{arm}/seed0")
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].tobytes() == b[key].tobytes(), (arm, key)
    strip = lambda path: [
        {k: v for k, v in json.loads(line).items() if k not in ("time_s", "examples_per_s")}
        for line in path.read_text().splitlines()
    ]
    assert strip(reference / "runs/noisy/seed0/metrics.jsonl") == strip(killed / "metrics.jsonl")


def test_only_arms_trains_a_subset_and_resume_trains_the_rest_as_one_call_would(spec_path, tmp_path):
    spec = load_spec(spec_path, ["seeds=[0]"])
    inline = ExecutionOptions(executor="inline")
    whole = tmp_path / "whole"
    run_study(spec, whole, device="cpu", show_progress=False, options=inline)
    split = tmp_path / "split"
    with pytest.raises(ValueError, match=r"--only-arms names 'nosiy'; the spec 'logic' has arms base, noisy"):
        run_study(spec, split, device="cpu", show_progress=False, options=inline, only_arms=["nosiy"])
    assert not split.exists()
    first = run_study(spec, split, device="cpu", show_progress=False, options=inline, only_arms=["noisy"])
    assert first.trained == ["noisy/seed0"] and not (split / "runs/base").exists()
    assert json.loads((split / "study.json").read_text())["arms"] == ["base", "noisy"]
    second = run_study(spec, split, device="cpu", resume=True, show_progress=False, options=inline)
    assert second.already_done == ["noisy/seed0"] and second.trained == ["base/seed0"]
    for arm in ("base", "noisy"):
        a, b = _eval(whole / f"runs/{arm}/seed0"), _eval(split / f"runs/{arm}/seed0")
        assert {k: v.tobytes() for k, v in a.items()} == {k: v.tobytes() for k, v in b.items()}, arm


def test_a_report_before_the_candidate_has_run_says_so(spec_path, tmp_path):
    from mxlab.report import write_report

    spec_path.write_text(SPEC + '\n[report]\ncandidate = "noisy"\n')
    spec = load_spec(spec_path, ["seeds=[0]"])
    out = tmp_path / "out"
    run_study(
        spec, out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"), only_arms=["base"]
    )
    write_report(out)
    opening = (out / "report.md").read_text().splitlines()[2]
    assert opening.startswith("**Decision: not decided**: the pre-registered candidate noisy has no finished run")


def test_divergence_is_recorded_and_the_study_goes_on(spec_path, tmp_path):
    # the NaN loss from step 5 is planted in quantized models only: the poisoned (MXFP8) arm, not base (BF16)
    spec = load_spec(spec_path, ['arms=["base", "poisoned"]', "seeds=[0]", "model.nan_loss_from_step=5"])
    result = run_study(
        spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
    )
    runs = tmp_path / "out/runs"
    poisoned = json.loads((runs / "poisoned/seed0/done.json").read_text())
    assert poisoned["status"] == "diverged" and poisoned["diverged_at_step"] == 5
    assert "non-finite loss" in poisoned["reason"]
    assert not (runs / "poisoned/seed0/eval.npz").exists()
    metrics = [json.loads(line) for line in (runs / "poisoned/seed0/metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 5 and np.isnan(metrics[-1]["loss"])
    assert json.loads((runs / "base/seed0/done.json").read_text())["status"] == "finished"
    assert (runs / "base/seed0/eval.npz").exists()
    assert result.diverged == ["poisoned/seed0"]


def test_loss_scale_collapse_is_a_divergence_but_skipped_steps_are_not(spec_path, tmp_path):
    # gradients overflow from step 3 on; the dynamic scaler skips and halves 4 -> 2 -> 1 -> 0.5 (< floor 1)
    collapsing = ['arms=["collapsing"]', 'baseline="collapsing"', "seeds=[0]", "model.inf_grad_from_step=3"]
    spec = load_spec(spec_path, [*collapsing, "train.min_loss_scale=1.0"])
    run_study(spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    done = json.loads((tmp_path / "out/runs/collapsing/seed0/done.json").read_text())
    assert done["status"] == "diverged" and "loss scale 0.5" in done["reason"]
    assert done["diverged_at_step"] == 5 and done["skipped_steps"] == 3

    # the same overflow with a floor low enough: steps are skipped, the run finishes
    spec = load_spec(spec_path, collapsing)
    run_study(spec, tmp_path / "out2", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    done = json.loads((tmp_path / "out2/runs/collapsing/seed0/done.json").read_text())
    assert done["status"] == "finished" and done["skipped_steps"] == 10


def test_sweep_layers_command_ranks_every_module(spec_path, tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    out = tmp_path / "study"
    result = CliRunner().invoke(
        app,
        [
            "sweep-layers",
            str(spec_path),
            "--recipe",
            "noisy",
            "--seeds",
            "0",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Layer sensitivity of `noisy`" in result.output
    ranking = json.loads((out / "sweep/sweep.json").read_text())["ranking"]
    modules = ["tower.0", "out"]
    assert sorted(entry["module"] for entry in ranking) == sorted(modules)
    scores = [entry["only"]["ne_pct_mean"] for entry in ranking]
    assert scores == sorted(scores, reverse=True) and all(np.isfinite(scores))
    for module in modules:  # every run was trained for 2 steps, only-this and all-but-this
        for kind in ("only", "allbut"):
            done = json.loads((out / f"sweep/runs/{kind}--{module}/seed0/done.json").read_text())
            assert done["steps"] == 2 and done["status"] == "finished"
    table = (out / "sweep/sweep.md").read_text()
    assert all(f"`{module}`" in table for module in modules)
    assert "Noise floor: not measured (one seed)" in table

    two_seeds = CliRunner().invoke(
        app,
        [
            "sweep-layers",
            str(spec_path),
            "--recipe",
            "noisy",
            "--seeds",
            "0,1",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "two"),
        ],
    )
    assert two_seeds.exit_code == 0, two_seeds.output
    noise = json.loads((tmp_path / "two/sweep/sweep.json").read_text())["noise_floor_ne_pct"]
    assert noise > 0 and f"moves NE by {noise:.3f}%" in two_seeds.output

    again = CliRunner().invoke(
        app,
        [
            "sweep-layers",
            str(spec_path),
            "--recipe",
            "noisy",
            "--seeds",
            "0",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert again.exit_code == 2 and "--resume" in again.output
    bad = CliRunner().invoke(
        app, ["sweep-layers", str(spec_path), "--recipe", "nope", "--device", "cpu", "--out", str(out)]
    )
    assert bad.exit_code == 2 and "unknown arm/recipe 'nope'" in bad.output


def test_run_command_refuses_bad_input_before_training(served, spec_path, tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    runner = CliRunner()
    result = runner.invoke(
        app,
        ["run", str(spec_path), "--device", "cpu", "--out", str(tmp_path / "o"), "--set", 'arms=["base", "missing"]'],
    )
    assert (
        result.exit_code == 2
        and "unknown arm/recipe 'missing'" in result.output
        and "available recipes" in result.output
    )
    assert not (tmp_path / "o").exists() and served == []
    result = runner.invoke(app, ["run", str(spec_path), "--device", "tpu"])
    assert result.exit_code == 2 and "unknown device 'tpu'" in result.output
    result = runner.invoke(app, ["run", str(spec_path), "--set", "train.lr"])
    assert result.exit_code == 2 and "key=value" in result.output
