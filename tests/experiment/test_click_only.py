"""A click-only source (Criteo) end to end on the CPU: training metrics (held-out ones too), verdicts, the report,
`mxlab compare` and `mxlab power` name CTR endpoints only, never CVR or CTCVR; a spec or a re-judging settings
file naming another task is refused; a study folder written before eval.npz recorded its tasks reads as CTR-only."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from mxlab.data.criteo import N_CATEGORICAL, N_INTEGER
from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study

SPEC = """
name = "click-only"
seeds = [0, 1]
baseline = "bf16"
arms = ["bf16", "mxfp8-rceil"]

[data]
source = "criteo"
path = "{path}"
train_examples = 128
eval_examples = 256
hash_size = 97
shuffle_buffer = 64

[model]
size = "tiny"
dim = 16
max_history = 8
interaction_dim = 16
tower_dims = [16]
cross_rank = 8

[train]
batch_size = 64
eval_batch_size = 256
checkpoint_every = 4
log_every = 1
max_steps = 2
cpu_threads = 1
eval_every = 1
eval_slice = 128
{train_extra}
[report]
candidate = "mxfp8-rceil"
{report_extra}
"""
HELDOUT_KEYS = {"examples", "ctr.ne", "ctr.auc"}
OTHER_TASKS = re.compile(r"\b(cvr|ctcvr)\b", re.IGNORECASE)
MODULE = re.compile(r"\btowers\.cvr\.")  # the model's CVR tower: a module of the plan tables, not an endpoint


def write_criteo(path, rows: int) -> None:
    """A Criteo-format file: label, 13 integer counts (some empty), 26 hex hashes (some empty)."""
    lines = []
    for row in range(rows):
        integers = ["" if (row + i) % 7 == 0 else str((row * 31 + i * 17) % 50 - 3) for i in range(N_INTEGER)]
        hashes = [
            "" if (row + f) % 11 == 0 else f"{(row % 13 * 7919 + f * 104729) & 0xFFFFFFFF:08x}"
            for f in range(N_CATEGORICAL)
        ]
        label = int((row % 13) < 4)  # the label follows the first hashes, so the model can learn a little
        lines.append("\t".join([str(label), *integers, *hashes]))
    path.write_text("\n".join(lines) + "\n")


def run_cli(*args: str) -> str:
    from typer.testing import CliRunner

    from mxlab.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def other_tasks_in(text: str) -> list[str]:
    """The lines of `text` that name CVR or CTCVR."""
    return [line for line in text.splitlines() if OTHER_TASKS.search(MODULE.sub("", line))]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("click_only")
    write_criteo(root / "train.txt", 512)
    spec = root / "click-only.toml"
    spec.write_text(SPEC.format(path=root / "train.txt", train_extra="", report_extra=""))
    out = root / "study"
    run_study(load_spec(spec), out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    return out


def test_training_metrics_are_ctr_only(study):
    for arm in ("bf16", "mxfp8-rceil"):
        for seed in (0, 1):
            run = study / "runs" / arm / f"seed{seed}"
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            keys = {key for record in records for key in record}
            assert "loss_ctr" in keys, keys
            assert not [key for key in keys if OTHER_TASKS.search(key.replace("_", " "))], keys
            heldout = [record["heldout"] for record in records if "heldout" in record]
            assert [record["step"] for record in records if "heldout" in record] == [1, 2]
            for record in heldout:
                assert set(record) == HELDOUT_KEYS, record
                assert record["examples"] == 128 and 0 < record["ctr.ne"] < 2 and 0 <= record["ctr.auc"] <= 1, record


def test_report_verdicts_and_summary_are_ctr_only(study):
    run_cli("report", str(study))
    summary = json.loads((study / "summary.json").read_text())
    text = json.dumps(summary)
    assert "ctr." in text
    assert not re.search(r"\b(cvr|ctcvr)[._]", text), [m.group(0) for m in re.finditer(r"\b(cvr|ctcvr)[._]\w*", text)]
    report = (study / "report.md").read_text()
    assert "CTR" in report or "ctr." in report
    assert other_tasks_in(report) == []
    html = (study / "report.html").read_text()
    assert other_tasks_in(html) == []
    figures = [path.name for path in study.rglob("*") if path.suffix in (".png", ".svg")]
    assert not [name for name in figures if OTHER_TASKS.search(name.replace("_", " "))], figures


def test_compare_and_power_are_ctr_only(study):
    compared = run_cli("compare", str(study), str(study))
    assert "ctr" in compared.lower() and other_tasks_in(compared) == []
    power = run_cli("power", "--pilot", str(study), "--seeds", "2,3", "--studies", "50")
    assert "ctr." in power and other_tasks_in(power) == []


def write_spec(root, *, train_extra: str = "", report_extra: str = "", gate: str = ""):
    """The click-only spec in `root` (with a small data file), its tables extended; returns its path."""
    write_criteo(root / "train.txt", 64)
    spec = root / "click-only.toml"
    spec.write_text(SPEC.format(path=root / "train.txt", train_extra=train_extra, report_extra=report_extra) + gate)
    return spec


@pytest.mark.parametrize(
    ("report_extra", "named"),
    [
        ('primary = ["ctr.ne", "ctcvr.ne"]', "['ctcvr.ne']"),
        ('primary = ["cvr.auc"]', "['cvr.auc']"),
        ('margins = { "ctcvr.auc" = 0.002 }', "['ctcvr.auc']"),
        ('calibration_tasks = ["ctr", "cvr"]', "['cvr']"),
    ],
)
def test_a_report_table_naming_another_task_is_refused(tmp_path, report_extra, named):
    with pytest.raises(ValueError) as refused:
        load_spec(write_spec(tmp_path, report_extra=report_extra))
    message = str(refused.value)
    assert message.startswith("[report]: report setting names " + named), message
    assert "the data source labels only the tasks ['ctr']" in message, message
    assert message.endswith("accepted: metrics and calibration tasks of ctr"), message
    assert message.count(named) == 1, message


@pytest.mark.parametrize(
    ("gate", "named"),
    [
        ('median_band = ["ctr.ne", "ctcvr.ne"]', "gate.median_band names ['ctcvr.ne']"),
        ('beat_oracle = ["ctcvr.auc"]', "gate.beat_oracle names ['ctcvr.auc']"),
    ],
)
def test_a_gate_metric_of_another_task_is_refused(tmp_path, gate, named):
    fork = 'fork_from = "bf16"\nfork_steps = 2\n'
    with pytest.raises(ValueError) as refused:
        load_spec(write_spec(tmp_path, train_extra=fork, gate=f"\n[gate]\n{gate}\n"))
    message = str(refused.value)
    assert message.startswith(named), message
    assert "the data source labels only the tasks ['ctr']; accepted: ctr.auc, ctr.ne" in message, message


def test_the_ctr_endpoints_of_a_click_only_spec_load(tmp_path):
    spec = load_spec(write_spec(tmp_path, report_extra='primary = ["ctr.auc"]\nmargins = { "ctr.auc" = 0.002 }'))
    assert spec.report.primary == ("ctr.auc",) and spec.report.endpoints == ("ctr.auc", "ctr.calibration")
    assert load_spec(write_spec(tmp_path)).report.endpoints == ("ctr.ne", "ctr.calibration")


def test_report_settings_naming_another_task_are_refused_for_a_click_only_study(study, tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    settings = tmp_path / "rejudge.toml"
    settings.write_text('[report]\ncandidate = "mxfp8-rceil"\ncalibration_tasks = ["ctr", "ctcvr"]\n')
    before = {path.name: path.stat().st_mtime_ns for path in study.iterdir() if path.is_file()}
    result = CliRunner().invoke(app, ["report", str(study), "--settings", str(settings)])
    assert result.exit_code == 2, result.output
    assert f"--settings {settings} for a study of data source 'criteo'" in result.output, result.output
    assert "report setting names ['ctcvr']" in result.output, result.output
    assert "accepted: metrics and calibration tasks of ctr" in result.output, result.output
    assert {path.name: path.stat().st_mtime_ns for path in study.iterdir() if path.is_file()} == before


def copy_study(study, to):
    """A copy of the study's record and runs, without checkpoints or report files; returns its path."""
    shutil.copytree(study, to, ignore=shutil.ignore_patterns("*.pt", "report.*", "summary.json", "figures"))
    return to


def test_report_settings_of_a_click_only_study_default_to_ctr(study, tmp_path):
    rejudged = copy_study(study, tmp_path / "rejudged")
    settings = tmp_path / "rejudge.toml"
    settings.write_text('[report]\ncandidate = "mxfp8-rceil"\nne_regression_pct = 0.05\n')
    run_cli("report", str(rejudged), "--settings", str(settings))
    summary = json.loads((rejudged / "summary.json").read_text())
    assert summary["settings"]["primary"] == ["ctr.ne"] and summary["settings"]["calibration_tasks"] == ["ctr"]
    assert summary["settings"]["ne_regression_pct"] == 0.05
    assert summary["preregistration"]["status"] == "post hoc"
    assert summary["preregistration"]["changed"] == ["ne_regression_pct"]


def test_an_eval_set_without_its_tasks_array_takes_the_study_source_tasks(study, tmp_path):
    """A click-only study from before eval.npz recorded its tasks (and before its [report] defaults followed the
    source) is analysed as CTR-only from study.json's data source."""
    old = copy_study(study, tmp_path / "old-study")
    for path in sorted((old / "runs").glob("*/seed*/eval.npz")):
        with np.load(path) as npz:
            arrays = {key: npz[key] for key in npz.files}
        assert arrays.pop("tasks").tolist() == ["ctr"]
        np.savez(path, **arrays)
    record = json.loads((old / "study.json").read_text())
    earlier = {"primary": ["ctr.ne", "ctcvr.ne"], "calibration_tasks": ["ctr", "cvr", "ctcvr"]}
    record["report"].update(earlier)
    record["preregistered"]["report"].update(earlier)
    (old / "study.json").write_text(json.dumps(record))

    run_cli("report", str(old))
    summary = json.loads((old / "summary.json").read_text())
    assert summary["settings"]["primary"] == ["ctr.ne"] and summary["settings"]["calibration_tasks"] == ["ctr"]
    assert summary["preregistration"]["status"] == "pre-registered"
    assert summary["n_eval_examples"] == {"ctr": 256}
    assert {c["metric"] for c in summary["comparisons"] if c["primary"]} == {"ctr.ne", "ctr.calibration"}
    text = json.dumps({key: value for key, value in summary.items() if key != "preregistration"})
    assert not re.search(r"\b(cvr|ctcvr)[._]", text), [m.group(0) for m in re.finditer(r"\b(cvr|ctcvr)[._]\w*", text)]
    report = (old / "report.md").read_text()
    record_block = re.compile(
        r"<details><summary>resolved study spec \(study\.json\)</summary>.*?</details>", re.DOTALL
    )
    assert len(record_block.findall(report)) == 1  # the record, shown verbatim, keeps its earlier settings
    assert other_tasks_in(record_block.sub("", report)) == []


def test_load_eval_labels_an_eval_set_without_tasks_only_when_told():
    from mxlab import metrics

    arrays = {key: np.zeros(4, dtype=np.float32) for key in metrics.EVAL_REQUIRED_KEYS}
    assert metrics.eval_tasks(metrics.load_eval(arrays)) == metrics.TASKS
    assert metrics.eval_tasks(metrics.load_eval(arrays, ("ctr",))) == ("ctr",)
    assert metrics.eval_tasks(metrics.load_eval({**arrays, "tasks": np.array(["ctr"])}, metrics.TASKS)) == ("ctr",)
    with pytest.raises(ValueError, match=r"eval array 'tasks' is \['cvr'\]; accepted: ctr and any of"):
        metrics.load_eval(arrays, ("cvr",))
