import json
import re

import pytest

from mxlab.report import compare_studies, write_report
from mxlab.report.document import BulletList, Heading, Paragraph, Table, render_html, render_markdown
from tests.report.fake_study import make_fake_study

ARMS = {"bf16": "same", "mx-same": "same", "mx-regress": "regress", "mx-diverged": "diverged"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    directory = make_fake_study(
        tmp_path_factory.mktemp("report") / "study",
        arms=ARMS,
        seeds=(0, 1, 2, 3),
        n_examples=10000,
        n_users=1000,
        report={"calibration_tasks": []},
    )
    runs_before = {p: p.stat().st_mtime_ns for p in (directory / "runs").rglob("*")}
    written = write_report(directory)
    runs_after = {p: p.stat().st_mtime_ns for p in (directory / "runs").rglob("*")}
    return directory, written, runs_before, runs_after


def test_report_files_are_written_and_runs_untouched(rendered):
    directory, written, before, after = rendered
    assert set(written) == {
        "report.md",
        "report.html",
        "summary.json",
        "figures/forest.png",
        "figures/reliability.png",
        "figures/training.png",
        "figures/numerics.png",
    }
    for name, path in written.items():
        assert path == directory / name and path.stat().st_size > 1000
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_MAGIC
    assert before == after  # reading only: no run file written or touched
    assert not list(directory.glob(".*"))  # no temporary left behind


def test_markdown_report_opens_with_the_ship_table(rendered):
    directory, *_ = rendered
    text = (directory / "report.md").read_text()
    assert (
        text.index("## Ship table")
        < text.index("## Truth ceiling")
        < text.index("figures/forest.png")
        < text.index("## Details")
    )
    for needle in (
        "Secondary metrics: unadjusted 95% intervals, no verdict",
        "Controls: assay checks and A/A noise floor",
        "tests of two fitted models, not of the recipe",
        "Method and conventions",
        "commit 0123abc",
        "mxlab run experiments/study.toml",
        "towers.ctr.fc1    e4m3",
        "smallest regression called (80% power)",
        "smallest margin shown (80% power, true delta 0)",
        "**Not pre-registered**",
        "**mx-diverged diverged** (seed 1 at step 37)",
        "its verdicts rest on seeds [0, 2, 3]",
        "**This study is too small for its margin on ctr.ne**",
        "**The runs ended at a constant learning rate**",
    ):
        assert needle in text, needle
    assert "neutral" not in text.split("## Details")[0]
    ship = text.split("## Ship table")[1].split("##")[0]
    regress_row = next(line for line in ship.splitlines() if line.startswith("| mx-regress"))
    assert "**▼ regression**" in regress_row
    same_row = next(line for line in ship.splitlines() if line.startswith("| mx-same"))
    assert "regression" not in same_row and "inconclusive" in same_row or "non-inferior" in same_row
    # the DeLong diagnostics are folded away from the verdicts
    assert text.index("DeLong") > text.index("## Details")


def test_html_report_is_self_contained(rendered):
    directory, *_ = rendered
    page = (directory / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert 'src="figures/' not in page and "http://" not in page and "https://" not in page
    assert '<tr class="regression">' in page


def test_summary_json_holds_verdicts_and_re_renders_without_runs(rendered, tmp_path):
    directory, *_ = rendered
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["verdicts"]["mx-regress"]["ctr.ne"] == "regression"
    comparison = next(
        c for c in summary["comparisons"] if (c["arm"], c["metric"]) == ("mx-regress", "ctr.calibration_error")
    )
    assert comparison["delta"] > 0 and comparison["verdict"] is None and comparison["level"] == 0.95
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("study.json", "summary.json"):
        (copy / name).write_text((directory / name).read_text())
    (copy / "figures").mkdir()
    (copy / "figures" / "training.png").write_bytes((directory / "figures" / "training.png").read_bytes())
    write_report(copy)
    again = json.loads((copy / "summary.json").read_text())
    assert again["verdicts"] == summary["verdicts"] and again["comparisons"] == summary["comparisons"]
    # a figure drawn from the runs by the earlier render stays, is shown, and is listed with the files
    assert (copy / "figures" / "training.png").is_file() and "figures/training.png" in again["files"]
    assert (
        "figures/training.png" in (copy / "report.md").read_text() and "figures/reliability.png" not in again["files"]
    )


def test_compare_studies_shows_spec_and_verdict_differences(tmp_path):
    a = make_fake_study(
        tmp_path / "a", arms={"bf16": "same", "mx": "regress"}, seeds=(0, 1, 2, 3), n_examples=10000, n_users=1000
    )
    b = make_fake_study(
        tmp_path / "b",
        arms={"bf16": "same", "mx": "same"},
        seeds=(0, 1, 2, 3),
        n_examples=10000,
        n_users=1000,
        report={"ne_regression_pct": 0.5},
    )
    text = compare_studies(a, b)
    assert '| report.ne_regression_pct | "(absent)" | 0.5 |' in text
    assert re.search(
        r"\| mx \| ctr.ne \| regression: \+[\d.]+% .*\| (inconclusive|non-inferior): .*\(changed\) \|", text
    )
    assert "The two specs are identical." in compare_studies(a, a)


def test_document_rendering_escapes():
    blocks = [
        Heading("T", 1),
        Paragraph("a **b** `c<d>`"),
        BulletList(["x | y"]),
        Table(["h|1", "h2"], [["<script>", "v"]], ["regression"]),
    ]
    markdown = render_markdown(blocks)
    assert "| h\\|1 | h2 |" in markdown
    page = render_html(blocks, "t", base_dir=None)
    assert "<strong>b</strong>" in page and "<code>c&lt;d&gt;</code>" in page
    assert "<script>" not in page and '<tr class="regression">' in page


def test_the_ship_table_shows_each_arms_step_time_and_memory_against_the_baseline(tmp_path):
    directory = make_fake_study(tmp_path / "study", arms={"bf16": "same", "mx": "regress"}, seeds=(0, 1, 2))
    for arm, step_ms, gib in (("bf16", [10.0, 11.0, 12.0], 2.0), ("mx", [24.0, 22.0, 40.0], 3.0)):
        for seed, ms in enumerate(step_ms):
            done_path = directory / "runs" / arm / f"seed{seed}" / "done.json"
            done = json.loads(done_path.read_text())
            done_path.write_text(json.dumps({**done, "step_ms": ms, "peak_memory_bytes": int(gib * 2**30)}))
    write_report(directory)
    ship = (directory / "report.md").read_text().split("## Ship table")[1].split("##")[0]
    assert "step time, peak memory (x bf16)" in ship
    mx_row = next(line for line in ship.splitlines() if line.startswith("| mx "))
    assert "2.18x (24 ms), 1.50x (3 GiB)" in mx_row  # medians 24 / 11 ms and 3 / 2 GiB
    assert "the baseline's: 11 ms, 2 GiB" in ship
    runs = json.loads((directory / "summary.json").read_text())["runs"]
    assert {r["step_ms"] for r in runs if r["arm"] == "mx"} == {24.0, 22.0, 40.0}


def test_the_environment_names_the_code_and_device_each_run_was_trained_with(tmp_path):
    directory = make_fake_study(tmp_path / "study", arms={"bf16": "same", "mx": "same"}, seeds=(0, 1, 2))
    for arm in ("bf16", "mx"):
        for seed in (0, 1, 2):
            done_path = directory / "runs" / arm / f"seed{seed}" / "done.json"
            commit = "aaa111" if seed == 0 else "bbb222"
            trained = (
                None
                if (arm, seed) == ("mx", 2)
                else {"code": {"commit": commit, "dirty": False, "source": "git"}, "device": "GPU X"}
            )
            done_path.write_text(json.dumps({**json.loads(done_path.read_text()), "trained_with": trained}))
    write_report(directory)
    environment = (directory / "report.md").read_text().split("## Environment and reproduction")[1]
    assert "**runs trained with** commit aaa111 on GPU X: bf16/0, mx/0" in environment
    assert "**runs trained with** commit bbb222 on GPU X: bf16/1, bf16/2, mx/1" in environment
    assert "**runs trained with** not recorded: mx/2" in environment


def test_the_ship_table_has_no_cost_column_when_the_runs_recorded_none(rendered):
    directory, *_ = rendered
    assert "step time, peak memory" not in (directory / "report.md").read_text()


def test_a_study_whose_runs_decayed_the_rate_gets_no_constant_rate_note(tmp_path):
    directory = make_fake_study(tmp_path / "study", arms={"bf16": "same", "mx": "same"}, seeds=(0, 1, 2, 3))
    spec = json.loads((directory / "study.json").read_text())
    spec["train"]["lr_decay_steps"] = 20
    (directory / "study.json").write_text(json.dumps(spec))
    write_report(directory)
    text = (directory / "report.md").read_text()
    assert "**This study is too small for its margin on ctr.ne**" in text and "constant learning rate" not in text


def test_a_baseline_seed_that_trained_badly_is_named_in_the_warnings():
    from types import SimpleNamespace

    from mxlab.report.decision import _baseline_outlier_warnings

    ctcvr = [0.869, 0.8557, 0.8601, 0.9512, 0.8571, 0.9363, 0.861, 0.8541]  # gem-mxfp8's BF16, 2026-12-03
    ctr = [0.9027, 0.893, 0.8945, 0.9384, 0.89, 0.9429, 0.8979, 0.8927]
    run_metrics = {
        "bf16": {seed: {"ctr": {"ne": a}, "ctcvr": {"ne": b}} for seed, (a, b) in enumerate(zip(ctr, ctcvr))}
    }
    analysis = SimpleNamespace(
        study=SimpleNamespace(baseline="bf16"),
        inputs=SimpleNamespace(run_metrics=run_metrics),
        settings=SimpleNamespace(primary=("ctr.excess_ne", "ctcvr.excess_ne", "ctcvr.ne")),
    )
    warnings = _baseline_outlier_warnings(analysis)
    assert len(warnings) == 1  # CTCVR once (excess NE is NE shifted); CTR's seeds 3 and 5 stay under the cut for 8
    assert warnings[0].startswith("**The baseline's ctcvr.ne is an outlier on seed(s) 3, 5**")
    assert "seed 5 at 0.9363" in warnings[0] and "1% of studies" in warnings[0]
    steady = {"bf16": {seed: {"ctr": {"ne": 0.9 + 0.001 * seed}, "ctcvr": {"ne": 0.86}} for seed in range(8)}}
    assert (
        _baseline_outlier_warnings(
            SimpleNamespace(
                study=analysis.study, inputs=SimpleNamespace(run_metrics=steady), settings=analysis.settings
            )
        )
        == []
    )


def test_the_decision_opens_the_report_and_other_settings_are_marked_post_hoc(tmp_path):
    from mxlab.experiment.report_settings import ReportSettings

    report = {"candidate": ["mx-same"], "controls": {"mx-regress": "positive"}, "calibration_tasks": ["ctr"]}
    directory = make_fake_study(
        tmp_path / "s",
        arms={"bf16": "same", "mx-same": "same", "mx-regress": "regress"},
        seeds=(0, 1, 2, 3),
        report=report,
    )
    spec = json.loads((directory / "study.json").read_text())
    registered = ReportSettings.from_dict(report)
    spec["preregistered"] = {"report": registered.to_dict(), "sha256": registered.digest()}
    spec["design"] = {"kind": "fork"}
    (directory / "study.json").write_text(json.dumps(spec))
    write_report(directory)
    text = (directory / "report.md").read_text()
    assert text.index("## Decision") < text.index("## Ship table") and "post hoc" not in text
    assert re.search(r"\*\*(✔ ships|not decided|▼ does not ship)\*\* \*\*mx-same\*\*", text)
    assert "**mx-regress** (positive control, outside every family): its known cost is detected" in text
    assert "No A/A section: in the fork design" in text  # the fork's disjoint pairs are no A/A
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["preregistration"]["status"] == "pre-registered" and summary["aa"] == []
    assert summary["decisions"][0]["arm"] == "mx-same"
    write_report(directory, settings=ReportSettings.from_dict({**report, "ne_regression_pct": 0.5}))
    text = (directory / "report.md").read_text()
    assert "**The verdicts are post hoc**" in text and "changed: ne_regression_pct" in text
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["preregistration"]["status"] == "post hoc"
    assert summary["preregistration"]["registered"]["ne_regression_pct"] == 0.02
    assert summary["settings"]["ne_regression_pct"] == 0.5


@pytest.mark.parametrize("name", ["gem-mxfp8", "movielens-mxfp8", "gem-synthetic-partial", "te-comparison"])
def test_committed_study_folders_still_render(name, tmp_path):
    from pathlib import Path

    source = Path(__file__).parents[2] / "reports" / name
    copy = tmp_path / name
    copy.mkdir()
    for file in ("study.json", "summary.json"):
        (copy / file).write_text((source / file).read_text())
    write_report(copy)
    text = (copy / "report.md").read_text()
    assert "## Ship table" in text and "calibration" in text
