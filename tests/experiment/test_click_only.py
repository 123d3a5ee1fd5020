"""A click-only source (Criteo) end to end on the CPU: training metrics, verdicts, the report, `mxlab compare`
and `mxlab power` name CTR endpoints only, never CVR or CTCVR."""

from __future__ import annotations

import json
import re

import pytest

from mxlab.data.criteo import N_CATEGORICAL, N_INTEGER
from mxlab.experiment import load_spec
from mxlab.experiment.runner import run_study

SPEC = """
name = "click-only"
seeds = [0, 1]
baseline = "bf16"
arms = ["bf16", "mxfp8-rceil"]

[data]
source = "criteo"
path = "{path}"
train_examples = 256
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
max_steps = 3
cpu_threads = 1

[report]
candidate = "mxfp8-rceil"
"""
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
    spec.write_text(SPEC.format(path=root / "train.txt"))
    out = root / "study"
    run_study(load_spec(spec), out, device="cpu", executor="inline", show_progress=False)
    return out


def test_training_metrics_are_ctr_only(study):
    for arm in ("bf16", "mxfp8-rceil"):
        for seed in (0, 1):
            run = study / "runs" / arm / f"seed{seed}"
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            keys = {key for record in records for key in record}
            assert "loss_ctr" in keys, keys
            assert not [key for key in keys if OTHER_TASKS.search(key.replace("_", " "))], keys


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
