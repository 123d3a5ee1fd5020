"""The runner with the real data, model, recipes and report, on a micro configuration of the quickstart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.runner import run_study

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.toml"
MICRO = [
    "seeds=[0]",
    'arms=["bf16", "mxfp8-rceil-sr"]',
    "report.candidate=[]",  # the tests choose their own arms: the quickstart's candidate and control may be absent
    "report.controls=[]",
    "data.train_examples=384",
    "data.eval_examples=512",
    "data.n_users=40",
    "data.base_ctr=0.2",
    "data.base_cvr=0.3",
    "model.max_history=8",
    "model.dim=16",
    "model.interaction_dim=16",
    "model.tower_dims=[16]",
    "model.cross_rank=8",
    "train.batch_size=64",
    "train.eval_batch_size=512",
    "train.checkpoint_every=2",
    "train.log_every=1",
    "train.max_steps=4",
    "train.cpu_threads=1",
    'train.fork_from=""',  # from scratch: the quickstart's fork design is tested in tests/experiment/test_fork.py
    "train.fork_steps=0",
    "execution.runs_per_device=1",
]
RUN_FILES = ("config.json", "plan.json", "plan.txt", "metrics.jsonl", "eval.npz", "checkpoint.pt", "done.json")


def _eval_bytes(run_dir: Path) -> dict[str, bytes]:
    with np.load(run_dir / "eval.npz") as npz:
        return {key: npz[key].tobytes() for key in npz.files}


def test_cli_run_report_and_compare(tmp_path):
    from typer.testing import CliRunner

    from mxlab.cli import app

    out = tmp_path / "study"
    overrides = MICRO + ["train.diagnostics_every=2"]
    args = ["run", str(QUICKSTART), "--device", "cpu", "--out", str(out)] + [
        item for o in overrides for item in ("--set", o)
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "report.md" in result.output and "report.html" in result.output
    for arm in ("bf16", "mxfp8-rceil-sr"):
        run_dir = out / "runs" / arm / "seed0"
        assert all((run_dir / name).is_file() for name in RUN_FILES), sorted(p.name for p in run_dir.iterdir())
        done = json.loads((run_dir / "done.json").read_text())
        assert done["status"] == "finished" and done["step_ms"] > 0 and done["peak_memory_bytes"] is None  # a CPU run
        assert done["trained_with"]["device"] and done["trained_with"]["code"]["commit"]
    assert (
        "step time on the CPU (x bf16; the cost of emulating MX, not MX hardware speed)"
        in (out / "report.md").read_text()
    )
    study = json.loads((out / "study.json").read_text())
    assert study["arms"] == ["bf16", "mxfp8-rceil-sr"] and study["data"]["train_examples"] == 384
    assert study["model"]["size"] == "tiny" and study["environment"]["torch"] == torch.__version__
    assert "--set seeds=[0]" in study["command"] or "--set 'seeds=[0]'" in study["command"]
    oracles = study["oracles"]  # a synthetic source: the stability endpoint's no-history oracle is recorded
    assert set(oracles) == {"truth", "no_history", "no_item_bias"}
    assert 0.5 <= oracles["no_history"]["ctr.auc"] <= oracles["truth"]["ctr.auc"] <= 1
    plan = json.loads((out / "runs/mxfp8-rceil-sr/seed0/plan.json").read_text())
    assert "towers.ctr.out" in plan["quantized"]
    assert json.loads((out / "runs/bf16/seed0/plan.json").read_text())["quantized"] == []
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    numerics = [
        json.loads(line) for line in (out / "runs/mxfp8-rceil-sr/seed0/numerics.jsonl").read_text().splitlines()
    ]
    assert {record["step"] for record in numerics} == {2, 4}
    assert {"module", "gemm", "sqnr_db", "saturated_frac"} <= set(numerics[0])
    assert any(record["module"] == "towers.ctr.out" and record["gemm"] == "wgrad" for record in numerics)

    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "--resume" in again.output
    trained_on = {**study, "environment": {**study["environment"], "device": "the training machine"}}
    (out / "study.json").write_text(json.dumps(trained_on))
    resumed = CliRunner().invoke(app, args + ["--resume"])
    assert resumed.exit_code == 0 and "0 runs trained, 2 already done" in resumed.output, resumed.output
    assert json.loads((out / "study.json").read_text()) == trained_on  # nothing trained: the record stays

    rerun = CliRunner().invoke(app, ["report", str(out)])
    assert rerun.exit_code == 0, rerun.output
    compared = CliRunner().invoke(app, ["compare", str(out), str(out)])
    assert compared.exit_code == 0, compared.output
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no study.json" in missing.output


def test_bf16_baseline_runs_its_gemms_in_bf16_with_fp32_master_weights(tmp_path, monkeypatch):
    import mxlab.models

    linear_output_dtypes: set[torch.dtype] = set()
    build = mxlab.models.build_model

    def recording_build(config, info):
        model = build(config, info)
        for module in model.modules():
            if type(module) is nn.Linear:
                module.register_forward_hook(lambda mod, args, output: linear_output_dtypes.add(output.dtype))
        return model

    monkeypatch.setattr(mxlab.models, "build_model", recording_build)
    spec = load_spec(QUICKSTART, MICRO + ['arms=["bf16"]', "train.max_steps=2"])
    run_study(spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    assert linear_output_dtypes == {torch.bfloat16}
    checkpoint = torch.load(tmp_path / "out/runs/bf16/seed0/checkpoint.pt", weights_only=True)
    assert {value.dtype for value in checkpoint["model"].values() if value.is_floating_point()} == {torch.float32}
    moments = [state["exp_avg"] for state in checkpoint["optimizer"]["dense"]["state"].values()]
    accumulators = [state["sum"] for state in checkpoint["optimizer"]["embeddings"]["state"].values()]
    assert moments and {moment.dtype for moment in moments + accumulators} == {torch.float32}

    linear_output_dtypes.clear()
    spec = load_spec(QUICKSTART, MICRO + ['arms=["bf16"]', "train.max_steps=2", 'train.precision="fp32"'])
    run_study(spec, tmp_path / "fp32", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    assert linear_output_dtypes == {torch.float32}


class Kill(Exception):
    pass


def test_resume_with_stochastic_rounding_is_bit_identical(tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ['arms=["mxfp8-rceil-sr"]', 'baseline="mxfp8-rceil-sr"'])
    run_study(
        spec, tmp_path / "reference", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
    )

    def kill(job, step):
        if step == 3:
            raise Kill()

    with pytest.raises(Kill):
        run_study(
            spec,
            tmp_path / "resumed",
            device="cpu",
            show_progress=False,
            on_step=kill,
            options=ExecutionOptions(executor="inline"),
        )
    run_study(
        spec,
        tmp_path / "resumed",
        device="cpu",
        resume=True,
        show_progress=False,
        options=ExecutionOptions(executor="inline"),
    )
    run = "runs/mxfp8-rceil-sr/seed0"
    assert json.loads((tmp_path / "resumed" / run / "done.json").read_text())["resumed_from_step"] == 2
    assert _eval_bytes(tmp_path / "reference" / run) == _eval_bytes(tmp_path / "resumed" / run)


def test_parallel_workers_match_the_sequential_runner(tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ['arms=["bf16"]', "seeds=[0, 1]", "train.max_steps=2"])
    run_study(
        spec, tmp_path / "sequential", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
    )
    result = run_study(
        spec,
        tmp_path / "parallel",
        show_progress=False,
        devices=["cpu", "cpu"],
        options=ExecutionOptions(executor="local"),
    )
    assert sorted(result.trained) == ["bf16/seed0", "bf16/seed1"]
    for seed in (0, 1):
        run = f"runs/bf16/seed{seed}"
        assert _eval_bytes(tmp_path / "sequential" / run) == _eval_bytes(tmp_path / "parallel" / run)
    configs = [json.loads((tmp_path / f"parallel/runs/bf16/seed{seed}/config.json").read_text()) for seed in (0, 1)]
    assert all(config["world_size"] == 1 for config in configs)


def test_a_recipe_that_does_not_fit_the_model_is_refused_before_any_training(tmp_path):
    recipes = QUICKSTART.parent / "recipes"
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "bf16.toml").write_text((recipes / "bf16.toml").read_text())
    misfit = (recipes / "mxfp8-rceil.toml").read_text().replace('name = "mxfp8-rceil"', 'name = "misfit"')
    (tmp_path / "recipes" / "misfit.toml").write_text(misfit + '\n[[rules]]\nmatch = "no.such.module"\npolicy = "mx"\n')
    spec_path = tmp_path / "study.toml"
    spec_path.write_text(QUICKSTART.read_text())
    spec = load_spec(spec_path, MICRO + ['arms=["bf16", "misfit"]'])
    with pytest.raises(ValueError, match=r"arm 'misfit' .* does not fit the model: .*no\.such\.module"):
        run_study(
            spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline")
        )
    assert not (tmp_path / "out/runs").exists()


@pytest.mark.gpu
def test_cuda_study_runs_one_job_per_gpu(tmp_path):
    spec = load_spec(QUICKSTART, MICRO + ["seeds=[0, 1]", "train.max_steps=3"])
    result = run_study(
        spec, tmp_path / "out", device="cuda", show_progress=False, options=ExecutionOptions(executor="local")
    )
    assert sorted(result.trained) == ["bf16/seed0", "bf16/seed1", "mxfp8-rceil-sr/seed0", "mxfp8-rceil-sr/seed1"]
    study = json.loads((tmp_path / "out/study.json").read_text())
    assert study["environment"]["devices"] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    for label in result.trained:
        done = json.loads((tmp_path / "out/runs" / label / "done.json").read_text())
        assert done["status"] == "finished" and done["steps"] == 3
        assert done["step_ms"] > 0 and done["peak_memory_bytes"] > 0  # the run process's own CUDA peak
        config = json.loads((tmp_path / "out/runs" / label / "config.json").read_text())
        assert config["device"].startswith("cuda")


def test_pairing_with_the_real_source_and_model(tmp_path, monkeypatch):
    import hashlib

    import mxlab.experiment.runner as runner_module
    import mxlab.models

    served: list[tuple[int, str]] = []
    initial: list[dict[str, torch.Tensor]] = []
    make_source, build = runner_module.make_data_source, mxlab.models.build_model

    def recording_source(spec):
        source = make_source(spec)
        train_batches = source.train_batches

        def recorded(batch_size, seed, epoch):
            for batch in train_batches(batch_size, seed, epoch):
                digest = hashlib.sha256(
                    batch.history_items.numpy().tobytes() + batch.click.numpy().tobytes()
                ).hexdigest()
                served.append((seed, digest))
                yield batch

        source.train_batches = recorded
        return source

    def recording_build(config, info):
        model = build(config, info)
        initial.append({key: value.clone() for key, value in model.state_dict().items()})
        return model

    monkeypatch.setattr(runner_module, "make_data_source", recording_source)
    monkeypatch.setattr(runner_module, "preflight", lambda jobs, source, device: None)
    monkeypatch.setattr(mxlab.models, "build_model", recording_build)
    spec = load_spec(QUICKSTART, MICRO + ['arms=["bf16", "mxfp8-floor"]', "seeds=[0, 1]", "train.max_steps=3"])
    run_study(spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))

    runs = [served[index * 3 : index * 3 + 3] for index in range(4)]  # (seed0 bf16, seed0 mx, seed1 bf16, seed1 mx)
    assert runs[0] == runs[1] and runs[2] == runs[3] and runs[0] != runs[2]
    assert all(
        torch.equal(initial[0][key], initial[1][key]) and torch.equal(initial[2][key], initial[3][key])
        for key in initial[0]
    )
    assert not all(torch.equal(initial[0][key], initial[2][key]) for key in initial[0])
