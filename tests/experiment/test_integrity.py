"""A study folder never mixes, and corrupt artefacts heal or say how (planted faults, the stand-in plug-ins)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.integrity import mixed_arm_warnings
from mxlab.experiment.runner import run_study
from tests.experiment.faults import Kill, cli, fingerprints, run_inline, write_spec


@pytest.fixture
def spec_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_inline(monkeypatch)
    return write_spec(tmp_path / "spec")


def _interrupted(spec_path: Path, out: Path, arm: str = "noisy", at: int = 7) -> None:
    def kill(job, step):
        if job.arm == arm and step == at:
            raise Kill()

    with pytest.raises(Kill):
        run_study(
            load_spec(spec_path),
            out,
            device="cpu",
            show_progress=False,
            on_step=kill,
            options=ExecutionOptions(executor="inline"),
        )


def test_resume_refuses_a_recipe_edited_since_the_study_started(spec_path, tmp_path):
    out = tmp_path / "out"
    _interrupted(spec_path, out)
    before = fingerprints(out / "runs")
    recipe = spec_path.parent / "recipes/noisy.toml"
    text = recipe.read_text()
    config = json.loads((out / "runs/noisy/seed0/config.json").read_text())
    assert config["recipe_file"]["text"] == text and len(config["recipe_file"]["sha256"]) == 64
    assert (
        json.loads((out / "study.json").read_text())["recipe_files"]["noisy"]["sha256"]
        == config["recipe_file"]["sha256"]
    )
    line = text.splitlines().index('scale_mode = "rceil"') + 1
    recipe.write_text(text.replace('scale_mode = "rceil"', 'scale_mode = "floor"'))

    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(out), "--resume")
    assert code == 2 and len(lines) == 1, lines
    assert "arm 'noisy'" in lines[0] and "recipes/noisy.toml changed" in lines[0]
    assert f"""line {line}: 'scale_mode = "rceil"' (recorded) vs 'scale_mode = "floor"' (now)""" in lines[0]
    assert fingerprints(out / "runs") == before  # nothing trained, nothing rewritten

    recipe.write_text(text)  # put back: resumes
    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(out), "--resume")
    assert code == 0, lines
    assert {k: v for k, v in fingerprints(out / "runs").items() if k.startswith("base/")} == {
        k: v for k, v in before.items() if k.startswith("base/")
    }


def test_the_report_flags_an_arm_whose_runs_trained_different_recipes(spec_path, tmp_path):
    out = tmp_path / "out"
    run_study(
        load_spec(spec_path, ["seeds=[0, 1]"]),
        out,
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    assert mixed_arm_warnings(out / "runs", ["base", "noisy"], [0, 1]) == []
    config_path = out / "runs/noisy/seed1/config.json"  # as an older mxlab let an edited recipe train on
    config = json.loads(config_path.read_text())
    config["recipe_file"]["sha256"] = "0" * 64
    config_path.write_text(json.dumps(config))
    (warning,) = mixed_arm_warnings(out / "runs", ["base", "noisy"], [0, 1])
    assert warning.startswith("**noisy mixes recipes** (recipe files differ: seed 0 ")


def test_out_into_a_folder_that_is_not_a_study_is_refused(spec_path, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "report.md").write_text("my notes\n")
    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(foreign))
    assert code == 2 and lines == [
        f"error: --out {foreign} is not a study folder (no study.json or runs/) and is not empty: "
        f"it holds report.md; choose an empty or new folder"
    ]
    assert (
        sorted(p.name for p in foreign.iterdir()) == ["report.md"]
        and (foreign / "report.md").read_text() == "my notes\n"
    )


def test_a_truncated_eval_npz_is_named_by_report_and_evaluated_again_on_resume(spec_path, tmp_path):
    out = tmp_path / "out"
    run_study(load_spec(spec_path), out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    base = fingerprints(out / "runs/base")
    evaluated = (out / "runs/noisy/seed0/eval.npz").read_bytes()
    (out / "runs/noisy/seed0/eval.npz").write_bytes(evaluated[: len(evaluated) // 2])

    code, lines = cli("report", str(out))
    assert code == 2 and len(lines) == 1, lines
    assert "runs/noisy/seed0/eval.npz cannot be read" in lines[0] and "--resume" in lines[0]

    result = run_study(
        load_spec(spec_path),
        out,
        device="cpu",
        resume=True,
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    assert result.trained == ["noisy/seed0"] and result.already_done == ["base/seed0"]
    assert (out / "runs/noisy/seed0/eval.npz").read_bytes() == evaluated  # the same model evaluated again
    assert fingerprints(out / "runs/base") == base


def test_an_unreadable_checkpoint_falls_back_to_the_previous_one_or_to_step_0(spec_path, tmp_path):
    reference = tmp_path / "reference"
    run_study(
        load_spec(spec_path), reference, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
    )
    expected = (reference / "runs/noisy/seed0/eval.npz").read_bytes()

    for planted, note in (
        (["checkpoint.pt"], "resumed from"),
        (["checkpoint.pt", "checkpoint.prev.pt"], "restarted from step 0"),
    ):
        out = tmp_path / f"out{len(planted)}"
        _interrupted(spec_path, out, at=10)  # checkpoints at steps 4 (previous) and 8 (last)
        run = out / "runs/noisy/seed0"
        base = fingerprints(out / "runs/base")
        for name in planted:
            data = (run / name).read_bytes()
            (run / name).write_bytes(data[: len(data) // 3])
        run_study(
            load_spec(spec_path),
            out,
            device="cpu",
            resume=True,
            show_progress=False,
            options=ExecutionOptions(executor="inline"),
        )
        done = json.loads((run / "done.json").read_text())
        assert done["status"] == "finished" and note in done["recovered"] and "checkpoint.pt" in done["recovered"]
        assert done["resumed_from_step"] == (4 if len(planted) == 1 else None)
        assert (run / "eval.npz").read_bytes() == expected
        assert fingerprints(out / "runs/base") == base


def test_a_truncated_study_json_is_named_with_its_line(spec_path, tmp_path):
    out = tmp_path / "out"
    _interrupted(spec_path, out)
    before = fingerprints(out / "runs")
    text = (out / "study.json").read_text()
    (out / "study.json").write_text(text[: len(text) // 2])
    code, lines = cli("run", str(spec_path), "--device", "cpu", "--out", str(out), "--resume")
    assert code == 2 and len(lines) == 1, lines
    assert f"{out / 'study.json'}: not valid JSON at line " in lines[0] and "restore it or delete it" in lines[0]
    assert fingerprints(out / "runs") == before
