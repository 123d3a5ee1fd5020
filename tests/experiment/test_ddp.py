"""One run over two gloo processes trains the tiny model to the parameters one process reaches with
the same global batch, for BF16 and an MX recipe; a checkpoint written at world size 2 resumes at 1.

The runs use float32 GEMMs outside the recipe's MX ones (train.precision = "fp32"), where the two
agree within float32 reduction tolerance. Under BF16 autocast each weight gradient leaves its GEMM
rounded to bfloat16, once for the whole batch in one process but once per shard in two, so there
they agree only to bfloat16 precision (as on any BF16 data-parallel system).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study
from mxlab.experiment.study_jobs import study_jobs
from mxlab.experiment.train import train_run
from mxlab.experiment.worker import make_data_source
from tests.experiment.test_end_to_end import MICRO, QUICKSTART

ROOT = Path(__file__).resolve().parents[2]
# MX forward and dgrad (their blocks run along rows and features, which a shard of the batch keeps
# whole); wgrad contracts over the batch, whose 32-row blocks a shard boundary would split, so it
# stays high precision here.
MX_RECIPE = """name = "mx-fwd-dgrad"
default = "mx"
[policies.mx]
fwd = { input = "e4m3", weight = "e4m3" }
dgrad = { grad_output = "e4m3", weight = "e4m3" }
wgrad = { grad_output = "fp32", input = "fp32" }
block = 32
scale_mode = "rceil"
rounding = "nearest_even"
[attention]
qk = "e4m3"
pv = "e4m3"
"""
# SGD: an update linear in the gradient (Adam's first steps take the sign of each gradient entry,
# so a float32 rounding difference in an entry near zero would move it by a whole learning rate).
SGD = ['train.optimizer="sgd"', "train.lr=0.1"]
ARMS = [
    'arms=["bf16", "mx-fwd-dgrad"]',
    "report.candidate=[]",
    "report.controls=[]",
    "train.max_steps=3",
    "train.checkpoint_every=0",
    'train.precision="fp32"',
    *SGD,
]


def _spec_path(tmp_path: Path) -> Path:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "bf16.toml").write_text((QUICKSTART.parent / "recipes" / "bf16.toml").read_text())
    (tmp_path / "recipes" / "mx-fwd-dgrad.toml").write_text(MX_RECIPE)
    path = tmp_path / "study.toml"
    path.write_text(QUICKSTART.read_text())
    return path


def _parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if a[key].is_floating_point():
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=lambda text, key=key: f"{key}: {text}")
        else:
            assert torch.equal(a[key], b[key]), key


def test_torchrun_over_two_gloo_processes_matches_one_process(tmp_path):
    spec_path = _spec_path(tmp_path)
    overrides = MICRO + ARMS
    run_study(
        load_spec(spec_path, overrides),
        tmp_path / "one",
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "mxlab.experiment.ddp",
        str(spec_path),
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "two"),
    ]
    command += [item for override in overrides for item in ("--set", override)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-4000:]
    assert "mxlab report" in finished.stdout
    for arm in ("bf16", "mx-fwd-dgrad"):
        run = f"runs/{arm}/seed0"
        assert json.loads((tmp_path / "two" / run / "config.json").read_text())["world_size"] == 2
        assert json.loads((tmp_path / "two" / run / "done.json").read_text())["steps"] == 3
        _assert_close(_parameters(tmp_path / "one" / run), _parameters(tmp_path / "two" / run))
    assert json.loads((tmp_path / "two/study.json").read_text())["execution"]["nproc_per_node"] == 2


def test_a_checkpoint_written_at_world_size_two_resumes_at_one(tmp_path):
    spec_path = _spec_path(tmp_path)
    short = load_spec(
        spec_path,
        MICRO
        + ['arms=["mx-fwd-dgrad"]', 'baseline="mx-fwd-dgrad"', "train.max_steps=2", 'train.precision="fp32"', *SGD],
    )
    result = run_study(
        short,
        tmp_path / "two",
        device="cpu",
        show_progress=False,
        options=ExecutionOptions(executor="local", nproc_per_node=2),
    )
    assert result.trained == ["mx-fwd-dgrad/seed0"] and not result.failed
    run_dir = tmp_path / "two/runs/mx-fwd-dgrad/seed0"
    assert json.loads((run_dir / "config.json").read_text())["world_size"] == 2
    (run_dir / "done.json").unlink()
    (run_dir / "eval.npz").unlink()

    longer = short.with_train(max_steps=4)
    [job] = study_jobs(longer, tmp_path / "two/runs")
    continued = train_run(job, make_data_source(longer), "cpu")
    assert continued.resumed_from_step == 2 and continued.steps == 4
    [reference] = study_jobs(longer, tmp_path / "one/runs")
    train_run(reference, make_data_source(longer), "cpu")
    _assert_close(_parameters(reference.run_dir), _parameters(run_dir))


@pytest.mark.gpu
def test_gpu_two_ranks_sharing_one_gpu_match_one_process(tmp_path):
    spec = load_spec(_spec_path(tmp_path), MICRO + ARMS)
    run_study(spec, tmp_path / "one", device="cuda", show_progress=False, options=ExecutionOptions(executor="inline"))
    result = run_study(
        spec,
        tmp_path / "two",
        device="cuda",
        show_progress=False,
        options=ExecutionOptions(gpus=1, executor="local", nproc_per_node=2),
    )
    assert sorted(result.trained) == ["bf16/seed0", "mx-fwd-dgrad/seed0"] and not result.failed
    for arm in ("bf16", "mx-fwd-dgrad"):
        run = f"runs/{arm}/seed0"
        config = json.loads((tmp_path / "two" / run / "config.json").read_text())
        assert config["world_size"] == 2 and config["device"] == "cuda:0"
        one, two = _parameters(tmp_path / "one" / run), _parameters(tmp_path / "two" / run)
        for key in one:  # float32 on the GPU; its scatter-add backward of embeddings adds in any order
            torch.testing.assert_close(one[key], two[key], rtol=1e-4, atol=1e-5)
