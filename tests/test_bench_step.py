"""`mxlab bench step` on the CPU at the tiny size: every field of its JSON, the baseline first (no timing asserts)."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mxlab.cli import app
from mxlab.models.flops import model_flops

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.toml"


def test_bench_step_on_the_cpu_writes_every_field(tmp_path):
    out = tmp_path / "step.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "step",
            "--device",
            "cpu",
            "--spec",
            str(QUICKSTART),
            "--preset",
            "tiny",
            "--batch",
            "32",
            "--max-history",
            "8",
            "--arm",
            "mxfp8-floor",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--batches",
            "2",
            "--peak-tflops",
            "2",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| bf16 |" in result.output and "| mxfp8-floor |" in result.output
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["batch_size"] == 32 and record["batches"] == 2
    assert record["model"]["size"] == "tiny" and record["model"]["max_history"] == 8
    assert record["warmup"] == 1 and record["steps"] == 2 and record["peak_tflops"] == 2
    assert 0 <= record["history"]["mean"] <= record["history"]["max"] <= 8
    assert [row["arm"] for row in record["arms"]] == ["bf16", "mxfp8-floor"]  # the baseline first
    base, mx = record["arms"]
    assert base["ratio_to_baseline"] == 1.0
    assert mx["ratio_to_baseline"] == pytest.approx(mx["ms_per_step"] / base["ms_per_step"])
    assert record["complete"] is True
    assert "bf16 (eager): " in result.output and "mxfp8-floor (eager): " in result.output  # a line as each is timed
    for row in record["arms"]:
        assert row["ms_per_step"] > 0 and row["peak_memory_gib"] is None and row["note"] == ""
        assert row["warmup_s"] > 0
        assert row["model_tflops"] == pytest.approx(record["flops_per_step"] / (row["ms_per_step"] * 1e-3) / 1e12)
        assert row["mfu"] == pytest.approx(row["model_tflops"] / 2)
        assert 0 < row["last_loss"] < 5


def test_bench_step_flops_are_the_model_count_of_the_timed_batches():
    from mxlab.bench.step import bench_spec, device_batches

    spec = bench_spec(QUICKSTART, batch_size=16, max_history=8, batches=2)
    batches, info = device_batches(spec, 2, torch.device("cpu"))
    assert [batch.batch_size for batch in batches] == [16, 16]
    flops = [model_flops(spec.model, info, batch.history_lengths()).train_step for batch in batches]
    assert flops[0] != flops[1]  # the histories differ, and so does the work
    assert flops[0] == 3 * model_flops(spec.model, info, batches[0].history_lengths()).forward


def test_bench_step_refuses_bad_arguments():
    runner = CliRunner()
    unknown = runner.invoke(app, ["bench", "step", "--device", "cpu", "--spec", str(QUICKSTART), "--preset", "huge"])
    assert unknown.exit_code == 2 and "unknown model size 'huge'" in unknown.output
    arm = runner.invoke(app, ["bench", "step", "--device", "cpu", "--spec", str(QUICKSTART), "--arm", "nope"])
    assert arm.exit_code == 2 and "nope" in arm.output
    if not torch.cuda.is_available():
        cuda = runner.invoke(app, ["bench", "step", "--spec", str(QUICKSTART)])
        assert cuda.exit_code == 2 and "--device cpu" in cuda.output


@pytest.mark.gpu
def test_bench_step_compile_on_cuda_runs_torch_compile_of_every_arm():
    from mxlab.bench.step import run_step_bench

    result = run_step_bench(
        QUICKSTART,
        arms=["mxfp8-rceil"],
        batch_size=64,
        max_history=16,
        warmup=2,
        steps=2,
        batches=1,
        device="cuda",
        compile=True,
        echo=lambda text: None,
    )
    assert [(row["arm"], row["compiled"]) for row in result["arms"]] == [
        ("bf16", False),
        ("bf16", True),
        ("mxfp8-rceil", False),
        ("mxfp8-rceil", True),
    ]
    for row in result["arms"]:
        assert row["note"] == "" and row["ms_per_step"] > 0 and 0 < row["last_loss"] < 5


@pytest.mark.gpu
def test_bench_step_on_cuda_measures_peak_memory_per_arm(tmp_path):
    from mxlab.bench.step import run_step_bench

    result = run_step_bench(
        QUICKSTART,
        arms=["mxfp8-floor"],
        batch_size=64,
        max_history=16,
        warmup=2,
        steps=2,
        batches=2,
        device="cuda",
        json_path=tmp_path / "step.json",
        echo=lambda text: None,
    )
    assert json.loads((tmp_path / "step.json").read_text())["arms"] == result["arms"]
    for row in result["arms"]:
        assert row["note"] == "" and row["ms_per_step"] > 0 and 0 < row["peak_memory_gib"] < 10


TINY_CPU = dict(preset="tiny", batch_size=16, max_history=8, warmup=0, steps=1, batches=1, device="cpu")


def _time_arm_raising(monkeypatch: pytest.MonkeyPatch, recipe_name: str, error: BaseException) -> None:
    """bench step's `time_arm` raising `error` for the arm of `recipe_name`, timing the others as before."""
    import mxlab.bench.step as bench

    original = bench.time_arm

    def raising(spec, recipe, *args, **kwargs):
        if recipe.name == recipe_name:
            raise error
        return original(spec, recipe, *args, **kwargs)

    monkeypatch.setattr(bench, "time_arm", raising)


def test_a_bench_stopped_part_way_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    from mxlab.bench.step import run_step_bench

    _time_arm_raising(monkeypatch, "mxfp4-all", KeyboardInterrupt())  # what a time limit's signal does part-way
    out = tmp_path / "step.json"
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_step_bench(QUICKSTART, json_path=out, echo=lines.append, **TINY_CPU)
    record = json.loads(out.read_text())
    assert record["complete"] is False and [row["arm"] for row in record["arms"]] == ["bf16", "mxfp8-rceil"]
    assert [row["warmup_s"] for row in record["arms"]] == [None, None]  # no warm-up steps: no figure, not 0.0
    assert [line.split(":")[0] for line in lines] == ["bf16 (eager)", "mxfp8-rceil (eager)"]


def test_an_arm_out_of_memory_gets_a_note_and_the_others_still_run(monkeypatch):
    from mxlab.bench.step import run_step_bench

    _time_arm_raising(monkeypatch, "mxfp8-rceil", torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    result = run_step_bench(QUICKSTART, echo=lambda text: None, **TINY_CPU)
    rows = {row["arm"]: row for row in result["arms"]}
    assert list(rows) == ["bf16", "mxfp8-rceil", "mxfp4-all"]
    assert rows["mxfp8-rceil"]["ms_per_step"] is None and rows["mxfp8-rceil"]["note"].startswith("out of memory")
    assert rows["mxfp4-all"]["ms_per_step"] > 0 and rows["mxfp4-all"]["ratio_to_baseline"] > 0


def test_bench_step_compile_times_every_arm_compiled_and_eager_against_the_eager_baseline(tmp_path, monkeypatch):
    """The rows, their order and ratios of `--compile`. torch.compile itself is stood in for by a recorder that
    returns the model: compiling the GEM model's step on this CPU takes minutes (Dynamo traces the emulation); the
    real compile runs in the GPU test below."""
    compiled: list[tuple[torch.nn.Module, dict]] = []

    def recorder(model, **settings):
        compiled.append((model, settings))
        return model

    monkeypatch.setattr(torch, "compile", recorder)
    out = tmp_path / "step.json"
    result = CliRunner().invoke(
        app,
        ["bench", "step", "--device", "cpu", "--spec", str(QUICKSTART), "--preset", "tiny", "--batch", "32"]
        + ["--max-history", "8", "--arm", "mxfp8-floor", "--warmup", "1", "--steps", "1", "--batches", "1"]
        + ["--compile", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    for line in ("| bf16 | eager |", "| bf16 | compiled |", "| mxfp8-floor | eager |", "| mxfp8-floor | compiled |"):
        assert line in result.output
    assert "x baseline: ms / ms of the eager bf16 in this run" in result.output
    record = json.loads(out.read_text())
    assert record["compile"] is True
    rows = [(row["arm"], row["compiled"]) for row in record["arms"]]
    assert rows == [("bf16", False), ("bf16", True), ("mxfp8-floor", False), ("mxfp8-floor", True)]
    base = record["arms"][0]
    assert base["ratio_to_baseline"] == 1.0
    for row in record["arms"][1:]:
        assert row["ratio_to_baseline"] == pytest.approx(row["ms_per_step"] / base["ms_per_step"])
    assert [settings for _, settings in compiled] == [{}, {}]  # default settings, once per compiled arm
    from mxlab.nn.linear import QLinear

    emulated = [
        any(isinstance(module, QLinear) and module.precision is not None for module in model.modules())
        for model, _ in compiled
    ]
    assert emulated == [False, True]  # each arm's own recipe-applied model is what is compiled
