import json

import pytest

from mxlab.report import write_report
from mxlab.report.alerts import NOTE, QUESTIONS, SEVERITIES, WEAKENS, Alert, ordered
from mxlab.report.costs import ArmCost, cost_cell, cost_header, duration_text
from tests.report.fake_study import make_fake_study


def test_alerts_are_ordered_by_what_they_change_and_refuse_an_unknown_severity():
    alerts = [
        Alert(NOTE, "n"),
        Alert(WEAKENS, "w1"),
        Alert(QUESTIONS, "q1"),
        Alert(WEAKENS, "w2"),
        Alert(QUESTIONS, "q2"),
    ]
    assert [a.text for a in ordered(alerts)] == ["q1", "q2", "w1", "w2", "n"]
    assert SEVERITIES == (QUESTIONS, WEAKENS, NOTE)
    with pytest.raises(ValueError, match="'fatal' is not one of"):
        Alert("fatal", "x")


def test_step_times_read_in_their_units_and_the_cpu_header_names_emulation():
    assert [duration_text(ms) for ms in (0.25, 61.23, 12_800.0, 200_000.0)] == [
        "250 us",
        "61.2 ms",
        "12.8 s",
        "3 min 20 s",
    ]
    assert cost_cell(ArmCost(2400.0, None), ArmCost(1000.0, None)) == "2.40x (2.4 s), -"
    cpu = {"environment": {"devices": ["cpu"]}}
    assert "the cost of emulating MX" in cost_header(cpu, "bf16")
    assert "emulating" not in cost_header({"environment": {"devices": ["cuda:0"]}}, "bf16")


@pytest.fixture(scope="module")
def report_text(tmp_path_factory):
    directory = make_fake_study(
        tmp_path_factory.mktemp("opening") / "study",
        arms={"bf16": "same", "mx-same": "same", "mx-diverged": "diverged"},
        seeds=(0, 1, 2),
        n_examples=4000,
        n_users=400,
        with_numerics=False,
        report={"candidate": ["mx-same"], "calibration_tasks": []},
    )
    spec = json.loads((directory / "study.json").read_text())
    spec["environment"]["devices"] = ["cpu"]
    (directory / "study.json").write_text(json.dumps(spec))
    for arm in ("bf16", "mx-same"):
        for seed in (0, 1, 2):
            done_path = directory / "runs" / arm / f"seed{seed}" / "done.json"
            done_path.write_text(json.dumps({**json.loads(done_path.read_text()), "step_ms": 1500.0 + seed}))
    write_report(directory)
    return (directory / "report.md").read_text()


def test_the_first_line_under_the_title_is_the_decision_and_warnings_follow_by_severity(report_text):
    lines = [line for line in report_text.splitlines() if line.strip()]
    assert lines[0] == "# Precision study: study"
    assert lines[1].startswith("**Decision on the candidate (post hoc)**: **")
    assert "mx-same" in lines[1] and "warning" in lines[1] and "question" in lines[1]
    assert any(word in lines[1] for word in (" ships** (", " does not ship** (", " not decided** ("))
    bullets = report_text.split("\n\n")[2].splitlines()  # the list right under the decision line
    order = [
        "**Not pre-registered**",
        "**This study is too small for its margin",
        "**mx-diverged diverged**",
        "**The runs ended at a constant learning rate**",
    ]
    positions = [next(i for i, b in enumerate(bullets) if b.startswith("- " + o)) for o in order]
    assert positions == sorted(positions), bullets  # questions the decision, then weakens it, then a note
    assert report_text.index("Baseline **bf16**") > report_text.index(bullets[-1])


def test_a_cpu_study_says_its_step_time_is_the_cost_of_emulation(report_text):
    ship = report_text.split("## Ship table")[1].split("##")[0]
    assert "step time on the CPU (x bf16; the cost of emulating MX, not MX hardware speed)" in ship
    assert "1.00x (1.5 s)" in ship and " ms" not in ship  # 1.5 s per step written in seconds, not 1.5e+03 ms
    assert "the ratio is the cost of that emulation" in ship
