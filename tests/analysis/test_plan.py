"""`mxlab power --plan`: a larger study sized from a pilot's spread and priced by benched step times."""

from __future__ import annotations

import json

import pytest

from mxlab.analysis.pilot import read_pilot
from mxlab.analysis.plan import plan_pilot, read_bench_steps
from mxlab.cli.power import power_main
from mxlab.experiment.spec import load_spec
from tests.analysis.test_power_decision import write_pilot

PLAN_STEPS = 3600
PLAN = f"""
name = "plan"
seeds = [0, 1, 2]
baseline = "bf16"
arms = ["bf16", "placebo", "mxfp8-rceil", "mxfp8-square32"]

[data]
source = "synthetic"

[model]
dim = 16
layers = 1
heads = 1
max_history = 8
activation = "silu"

[train]
batch_size = 32
max_steps = {PLAN_STEPS}

[report]
primary = ["ctr.ne"]
calibration_tasks = ["ctr"]
ne_regression_pct = 0.1
candidate = "mxfp8-rceil"
controls = ["placebo"]
"""
BENCH = {
    "spec": "experiments/bench-shape.toml",
    "device": "Test GPU",
    "model": {"dim": 16, "layers": 1, "heads": 1, "max_history": 8, "activation": "softmax"},
    "batch_size": 32,
    "history": {"mean": 5.0, "max": 8},
    "arms": [{"arm": "bf16", "ms_per_step": 10.0}, {"arm": "mxfp8-rceil", "ms_per_step": 15.0}],
}


@pytest.fixture
def files(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    return write_pilot(tmp_path / "pilot"), plan, bench


def test_the_plan_is_priced_by_its_steps_and_the_benched_times_and_scales_the_spread(files):
    pilot, plan, bench = files
    priced, notes = plan_pilot(read_pilot(pilot), load_spec(plan), read_bench_steps(bench), spread_scale=2.0)
    hours = PLAN_STEPS / 3.6e6
    assert priced.run_hours == pytest.approx({"bf16": 10 * hours, "placebo": 10 * hours, "mxfp8-rceil": 15 * hours})
    assert priced.arms == ["bf16", "mxfp8-rceil", "placebo"] and priced.hours(4, priced.arms) == pytest.approx(
        4 * 35 * hours
    )
    assert priced.hours(4, priced.all_arms) != priced.hours(4, priced.all_arms)  # square32 was not benched: nan
    original = read_pilot(pilot).models
    assert priced.models["ctr.ne"].seed_sd == pytest.approx(2 * original["ctr.ne"].seed_sd)
    assert priced.models["ctr.ne"].eval_sd == original["ctr.ne"].eval_sd
    text = "\n".join(notes)
    assert "no step time benched for mxfp8-square32" in text and "placebo priced at bf16's step time" in text
    assert "activation 'softmax' (benched) vs" in text


def test_power_prints_the_plans_seeds_and_hours(files):
    pilot, plan, bench = files
    lines: list[str] = []
    status = power_main(pilot, seeds="8", margins="0.1", studies=200, echo=lines.append, plan=plan, step_times=bench)
    assert status == 0, lines
    assert lines[0].startswith("plan plan sized from pilot pilot's paired spread over 8 seeds of cand")
    row = next(line.split() for line in lines if line.strip().startswith("0.1 "))
    assert float(row[-2]) == pytest.approx(int(row[1]) * 35 * PLAN_STEPS / 3.6e6, rel=0.01) and row[-1] == "n/a"


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(batch_size=64), "train.batch_size 64 (benched) vs 32 (plan)"),
        (dict(model={**BENCH["model"], "dim": 32}), "model.dim 32 (benched) vs 16 (plan)"),
        (dict(arms="none"), "is not a `mxlab bench step --json` file"),
    ],
)
def test_step_times_of_another_shape_or_no_bench_are_refused(files, change, message):
    pilot, plan, bench = files
    bench.write_text(json.dumps({**BENCH, **change}))
    lines: list[str] = []
    assert power_main(pilot, studies=10, echo=lines.append, plan=plan, step_times=bench) == 2
    assert len(lines) == 1 and message in lines[0], lines


def test_plan_options_are_refused_alone_or_against_a_pilot_without_the_plans_endpoints(files, tmp_path):
    pilot, plan, bench = files
    lines: list[str] = []
    assert power_main(pilot, studies=10, echo=lines.append, plan=plan) == 2
    assert "--plan SPEC and --step-times BENCH.json go together" in lines[-1]
    assert power_main(None, studies=10, echo=lines.append, plan=plan, step_times=bench) == 2
    assert "--plan needs --pilot DIR" in lines[-1]
    assert power_main(pilot, studies=10, echo=lines.append, plan=plan, step_times=bench, spread_scale=0) == 2
    assert "--spread-scale must be > 0, got 0" in lines[-1]
    plan.write_text(PLAN.replace('primary = ["ctr.ne"]', 'primary = ["ctr.ne", "ctcvr.ne"]'))
    assert power_main(pilot, studies=10, echo=lines.append, plan=plan, step_times=bench) == 2
    assert "the plan's co-primary endpoints ctcvr.ne have no spread in pilot 'pilot'; it has ctr.ne" in lines[-1]
