"""A precision study of a model and a data source defined here, named in the spec by import path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from mxlab.data import DataInfo, JaggedBatch, make_source
from mxlab.models import build, check_outputs, head_logits
from mxlab.tasks import TaskSet, task_set

HERE = "tests.experiment.test_plugins"
N_DENSE = 4


class Clicks:
    """Dense features only; every head H is a 0/1 label drawn from its own logistic function of the features."""

    def __init__(self, table: dict, max_history: int) -> None:
        self.heads = tuple(table.get("heads", ("ctr",)))
        self.n_train, self.n_eval = int(table["train_examples"]), int(table["eval_examples"])
        self.info = DataInfo(N_DENSE, (5,), 1, 1, False, "clicks", has_conversion=False, has_history=False)
        generator = torch.Generator().manual_seed(7)
        total = self.n_train + self.n_eval
        self.dense = torch.randn(total, N_DENSE, generator=generator)
        weights = torch.randn(N_DENSE, len(self.heads), generator=generator)
        probability = torch.sigmoid(self.dense @ weights * 1.5)
        self.labels = {h: torch.bernoulli(probability[:, i], generator=generator) for i, h in enumerate(self.heads)}

    def _batch(self, index: torch.Tensor) -> JaggedBatch:
        rows = index.numel()
        labels = {head: label[index] for head, label in self.labels.items()}
        return JaggedBatch(
            dense=self.dense[index],
            sparse=torch.zeros(rows, 1, dtype=torch.int64),
            history_items=torch.zeros(0, dtype=torch.int64),
            history_actions=torch.zeros(0, dtype=torch.int64),
            history_offsets=torch.zeros(rows + 1, dtype=torch.int64),
            click=labels.get("ctr", torch.zeros(rows)),
            conversion=torch.zeros(rows),
            user_id=index % 23,
            has_conversion=False,
            labels=labels,
        )

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]:
        order = torch.randperm(self.n_train, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for start in range(0, self.n_train, batch_size):
            yield self._batch(order[start : start + batch_size])

    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]:
        for start in range(self.n_train, self.n_train + self.n_eval, batch_size):
            yield self._batch(torch.arange(start, min(start + batch_size, self.n_train + self.n_eval)))


class Heads(nn.Module):
    """An MLP over the dense features with one linear output per head."""

    def __init__(self, n_dense: int, heads: tuple[str, ...], hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_dense, hidden), nn.ReLU())
        self.out = nn.ModuleDict({head: nn.Linear(hidden, 1) for head in heads})

    def forward(self, batch: JaggedBatch) -> dict[str, torch.Tensor]:
        hidden = self.body(batch.dense)
        return {head: layer(hidden).squeeze(-1) for head, layer in self.out.items()}


def build_heads(info: DataInfo, heads: tuple[str, ...], hidden: int = 8) -> nn.Module:
    return Heads(info.n_dense, heads, hidden)


def build_two_heads(info: DataInfo, heads: tuple[str, ...]) -> nn.Module:
    return Heads(info.n_dense, ("ctr", "other"), 8)


def build_nothing(info: DataInfo, heads: tuple[str, ...]) -> str:
    return "not a model"


def no_source(table: dict, max_history: int) -> object:
    class Half:
        info = None
        n_train = 1

    return Half()


SPEC = """
name = "plugin-study"
seeds = [0, 1]
baseline = "bf16"
arms = ["bf16", "mxfp8-rceil"]

[data]
source = "{here}:Clicks"
train_examples = 256
eval_examples = 2048
heads = {heads}

[model]
builder = "{here}:build_heads"
hidden = 8

[tasks]
relation = "independent"
heads = {heads}

[train]
batch_size = 64
max_steps = 3
eval_batch_size = 2048
checkpoint_every = 3
log_every = 1
cpu_threads = 1

[execution]
runs_per_device = 1
"""


def _run_study(tmp_path: Path, heads: list[str]) -> Path:
    from typer.testing import CliRunner

    from mxlab.cli import app

    spec = tmp_path / "plugin.toml"
    spec.write_text(SPEC.format(here=HERE, heads=json.dumps(heads)))
    out = tmp_path / "study"
    result = CliRunner().invoke(app, ["run", str(spec), "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("heads", [["ctr"], ["ctr", "like", "share"]])
def test_a_study_of_a_plug_in_model_and_source_reports_the_declared_tasks(tmp_path, heads):
    out = _run_study(tmp_path, heads)
    study = json.loads((out / "study.json").read_text())
    assert study["tasks"] == {"heads": heads, "relation": "independent"}
    summary = json.loads((out / "summary.json").read_text())
    endpoints = {f"{head}.{kind}" for head in heads for kind in ("ne", "calibration")}
    assert set(summary["verdicts"]["mxfp8-rceil"]) == endpoints
    compared = {row["metric"].split(".")[0] for row in summary["comparisons"]}
    assert compared == set(heads)
    assert {row["metric"] for row in summary["comparisons"] if row["primary"]} == endpoints
    report = (out / "report.md").read_text()
    for head in heads:
        assert f"| mxfp8-rceil | {head}.auc |" in report
    assert "cvr" not in report


def test_a_builder_path_that_does_not_import_is_refused():
    with pytest.raises(ValueError, match=r"model builder 'no_such_pkg.models:build_x': module 'no_such_pkg.models'"):
        build({"builder": "no_such_pkg.models:build_x"}, Clicks(_TABLE, 1).info, TaskSet(("ctr",), "independent"))
    with pytest.raises(ValueError, match=r"has no attribute 'build_x'.*"):
        build({"builder": f"{HERE}:build_x"}, Clicks(_TABLE, 1).info, TaskSet(("ctr",), "independent"))


def test_a_builder_returning_the_wrong_type_is_refused():
    with pytest.raises(ValueError, match=rf"model builder '{HERE}:build_nothing' returned str; expected a torch.nn"):
        build({"builder": f"{HERE}:build_nothing"}, Clicks(_TABLE, 1).info, TaskSet(("ctr",), "independent"))


def test_a_source_missing_a_required_field_is_refused():
    with pytest.raises(
        ValueError, match=r"data source '.*:no_source' built a Half without \['n_eval', 'train_batches'"
    ):
        make_source({"source": f"{HERE}:no_source"}, 8)


def test_tasks_that_do_not_match_the_model_outputs_are_refused():
    source = Clicks({**_TABLE, "heads": ["ctr", "like"]}, 1)
    tasks = task_set({"relation": "independent", "heads": ["ctr", "like"]})
    model = build({"builder": f"{HERE}:build_two_heads"}, source.info, tasks)
    batch = next(source.eval_batches(4))
    with pytest.raises(
        ValueError, match=r"returns the heads \['ctr', 'other'\]; the \[tasks\] declare \['ctr', 'like'\]"
    ):
        check_outputs(model, batch, tasks)
    with pytest.raises(ValueError, match=r"model builder 'gem' has the heads \['ctr', 'cvr'\]; the \[tasks\] declare"):
        build({}, source.info, tasks)
    with pytest.raises(ValueError, match=r"returns one tensor of shape \(4, 2\); the \[tasks\] declare"):
        head_logits(torch.zeros(4, 2), ("ctr", "like"))


def test_a_bad_tasks_table_is_refused():
    with pytest.raises(ValueError, match=r"tasks.relation='chain'; accepted: esmm, independent"):
        task_set({"relation": "chain"})
    with pytest.raises(
        ValueError, match=r"tasks.heads=\['ctr', 'like'\] with relation 'esmm'; accepted: \['ctr', 'cvr'\]"
    ):
        task_set({"heads": ["ctr", "like"]})
    with pytest.raises(ValueError, match=r"tasks.heads names \['cvr'\], ESMM's derived tasks"):
        task_set({"relation": "independent", "heads": ["ctr", "cvr"]})
    assert task_set({"relation": "independent", "heads": ["a", "b"]}).tasks == ("a", "b")
    assert task_set(None).tasks == ("ctr", "cvr", "ctcvr")


_TABLE = {"train_examples": 8, "eval_examples": 8}


def test_mxlab_run_refuses_a_model_whose_heads_are_not_the_declared_tasks(tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    spec = tmp_path / "plugin.toml"
    text = SPEC.format(here=HERE, heads=json.dumps(["ctr", "like"]))
    spec.write_text(text.replace(f"{HERE}:build_heads", f"{HERE}:build_two_heads").replace("hidden = 8\n", ""))
    result = CliRunner().invoke(app, ["run", str(spec), "--device", "cpu", "--out", str(tmp_path / "study")])
    assert result.exit_code != 0
    assert "returns the heads ['ctr', 'other']; the [tasks] declare ['ctr', 'like']" in " ".join(result.output.split())
    assert not (tmp_path / "study" / "runs").exists()


def test_mxlab_run_refuses_a_declared_head_the_source_does_not_label(tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    spec = tmp_path / "dcn.toml"
    spec.write_text(
        'name = "unlabelled"\nseeds = [0]\nbaseline = "bf16"\narms = ["bf16"]\n'
        '[data]\nsource = "synthetic"\ntrain_examples = 256\neval_examples = 256\nn_users = 20\n'
        '[model]\nbuilder = "dcn"\nmax_history = 8\n'
        '[tasks]\nrelation = "independent"\nheads = ["ctr", "like"]\n'
    )
    result = CliRunner().invoke(app, ["run", str(spec), "--device", "cpu", "--out", str(tmp_path / "study")])
    assert result.exit_code != 0
    assert "the batch has no label for the head 'like'; it labels: ['ctr']" in " ".join(result.output.split())


def test_a_study_of_a_torchrec_model_through_the_plug_in_path(tmp_path):
    pytest.importorskip("torchrec", reason="torchrec not installed (docs/applying.md)")
    from mxlab.cli.study_commands import write_study_report
    from mxlab.experiment import load_spec
    from mxlab.experiment.execution import ExecutionOptions
    from mxlab.experiment.runner import run_study

    spec = tmp_path / "torchrec.toml"
    spec.write_text(
        'name = "torchrec-dcn"\nseeds = [0]\nbaseline = "bf16"\narms = ["bf16", "mxfp8-rceil"]\n'
        '[data]\nsource = "synthetic"\ntrain_examples = 256\neval_examples = 1024\nn_users = 40\n'
        "base_ctr = 0.2\nbase_cvr = 0.3\n"
        '[model]\nbuilder = "experiments.examples.torchrec_dcn:build_dlrm_dcn"\nmax_history = 8\n'
        "[train]\nbatch_size = 64\nmax_steps = 2\neval_batch_size = 1024\ncpu_threads = 1\n"
    )
    out = tmp_path / "study"
    # one process: one import
    run_study(load_spec(spec), out, device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    write_study_report(out)
    quantized = json.loads((out / "runs/mxfp8-rceil/seed0/plan.json").read_text())["quantized"]
    assert any(name.startswith("dlrm.dense_arch.") for name in quantized)
    assert any(name.startswith("dlrm.over_arch.") for name in quantized)
    summary = json.loads((out / "summary.json").read_text())
    assert {row["metric"].split(".")[0] for row in summary["comparisons"]} == {"ctr", "cvr", "ctcvr"}


def test_the_warm_up_gate_judges_independent_tasks_by_their_own_metrics():
    from mxlab.experiment.gate import gate_from_table

    tasks = ("ctr", "like")
    gate = gate_from_table({"median_band": ["like.ne", "ctr.auc"]}, seeds=[0], fork=True, has_truth=False, tasks=tasks)
    assert gate.median_band == ("like.ne", "ctr.auc")
    with pytest.raises(ValueError, match=r"gate.median_band names \['ctcvr.ne'\], .* accepted: ctr.auc, ctr.ne, like"):
        gate_from_table({"median_band": ["ctcvr.ne"]}, seeds=[0], fork=True, has_truth=False, tasks=tasks)
    with pytest.raises(ValueError, match=r"gate.median_band names unknown metric 'share.ne'; accepted: ctr.auc"):
        gate_from_table({"median_band": ["share.ne"]}, seeds=[0], fork=True, has_truth=False, tasks=tasks)
