"""`mxlab run --resume --rerun-diverged`: diverged runs moved aside, trained again with changed train settings,
recorded in study.json and warned about in the report; finished runs untouched; bad requests refused."""

from __future__ import annotations

import json

from tests.experiment import standins
from tests.experiment.faults import SPEC, cli, fingerprints, run_inline, write_spec

# the collapsing arm's gradients overflow from step 3 on, its loss scale falls 4 -> 2 -> 1 -> 0.5: below this
# floor it diverges, above 1e-6 it finishes
COLLAPSING = (
    SPEC.replace('arms = ["base", "noisy"]', 'arms = ["base", "collapsing"]').replace(
        "max_history = 4\n", "max_history = 4\ninf_grad_from_step = 3\n"
    )
    + "min_loss_scale = 1.0\n"
)


def _study(tmp_path, monkeypatch):
    run_inline(monkeypatch)
    spec = write_spec(tmp_path / "spec", COLLAPSING)
    standins.write_recipes(spec.parent, "collapsing")
    out = tmp_path / "out"
    code, lines = cli("run", str(spec), "--device", "cpu", "--out", str(out))
    assert code == 0, lines
    assert json.loads((out / "runs/collapsing/seed0/done.json").read_text())["status"] == "diverged"
    return spec, out


def test_diverged_runs_are_rerun_with_the_changed_setting_and_recorded(tmp_path, monkeypatch):
    spec, out = _study(tmp_path, monkeypatch)
    finished = {**fingerprints(out / "runs/base"), **fingerprints(out / "records/base")}
    first = fingerprints(out / "runs/collapsing/seed0")

    rerun = ("run", str(spec), "--device", "cpu", "--out", str(out), "--resume", "--rerun-diverged")
    code, lines = cli(*rerun, "--set", "train.min_loss_scale=1e-6")
    assert code == 0, lines
    assert "rerunning 1 diverged runs from scratch: collapsing/seed0" in lines
    assert fingerprints(out / "diverged/1/runs/collapsing/seed0") == first  # the first attempt kept as it was
    assert (out / "diverged/1/records/collapsing/seed0.npz").is_file()
    done = json.loads((out / "runs/collapsing/seed0/done.json").read_text())
    assert done["status"] == "finished" and done.get("resumed_from_step") is None
    config = json.loads((out / "runs/collapsing/seed0/config.json").read_text())
    assert config["train"]["min_loss_scale"] == 1e-6
    assert {**fingerprints(out / "runs/base"), **fingerprints(out / "records/base")} == finished

    study = json.loads((out / "study.json").read_text())
    assert study["train"]["min_loss_scale"] == 1.0  # the recorded spec stays
    [entry] = study["reruns"]
    assert entry["runs"] == ["collapsing/seed0"] and entry["reason"] == "diverged"
    assert entry["changed"] == {"train.min_loss_scale": [1.0, 1e-6]} and entry["moved_to"] == "diverged/1"
    assert "--rerun-diverged" in entry["command"] and "train.min_loss_scale=1e-6" in entry["command"]

    from mxlab.report.decision import rerun_warnings

    [warning] = rerun_warnings(study)
    assert "collapsing/seed0" in warning and "train.min_loss_scale 1.0 -> 1e-06" in warning

    # a plain --resume afterwards: nothing to train, nothing refused; nothing left to rerun either
    code, lines = cli("run", str(spec), "--device", "cpu", "--out", str(out), "--resume")
    assert code == 0 and "(0 runs trained, 2 already done)" in "\n".join(lines), lines
    code, lines = cli(*rerun, "--set", "train.min_loss_scale=1e-7")
    assert code == 0 and lines == [f"no diverged runs in {out}: nothing to rerun"]
    assert json.loads((out / "study.json").read_text())["reruns"] == [entry]


def test_the_report_warns_about_the_rerun(tmp_path, monkeypatch):
    from mxlab.report import write_report

    spec, out = _study(tmp_path, monkeypatch)
    rerun = ("run", str(spec), "--device", "cpu", "--out", str(out), "--resume", "--rerun-diverged")
    assert cli(*rerun, "--set", "train.min_loss_scale=1e-6")[0] == 0
    write_report(out)
    assert "**Runs collapsing/seed0 were rerun**" in (out / "report.md").read_text()


def test_a_rerun_is_refused_without_resume_or_with_other_changes(tmp_path, monkeypatch):
    spec, out = _study(tmp_path, monkeypatch)
    before = fingerprints(out)
    base = ("run", str(spec), "--device", "cpu", "--out", str(out))
    code, lines = cli(*base, "--rerun-diverged", "--set", "train.min_loss_scale=1e-6")
    assert code == 2 and lines == [
        "error: --rerun-diverged needs --resume: it reruns the diverged runs of an existing study"
    ]
    code, lines = cli(*base, "--resume", "--rerun-diverged", "--set", "model.dim=4")
    assert code == 2 and "model.dim differs from the recorded study" in lines[0], lines
    code, lines = cli(*base, "--resume", "--rerun-diverged")
    assert code == 2 and "needs a changed train setting" in lines[0], lines
    assert fingerprints(out) == before  # nothing moved, nothing recorded
