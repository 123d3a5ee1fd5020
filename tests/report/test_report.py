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
    directory = make_fake_study(tmp_path_factory.mktemp("report") / "study", arms=ARMS, n_examples=6000, n_users=800,
                                report={"bootstrap_resamples": 30})
    runs_before = {p: p.stat().st_mtime_ns for p in (directory / "runs").rglob("*")}
    written = write_report(directory)
    runs_after = {p: p.stat().st_mtime_ns for p in (directory / "runs").rglob("*")}
    return directory, written, runs_before, runs_after


def test_report_files_are_written_and_runs_untouched(rendered):
    directory, written, before, after = rendered
    assert set(written) == {"report.md", "report.html", "summary.json", "figures/forest.png", "figures/reliability.png",
                            "figures/training.png", "figures/numerics.png"}
    for name, path in written.items():
        assert path == directory / name and path.stat().st_size > 1000
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_MAGIC
    assert before == after  # reading only: no run file written or touched
    assert not list(directory.glob(".*"))  # no temporary left behind


def test_markdown_report_says_what_a_newcomer_needs(rendered):
    directory, *_ = rendered
    text = (directory / "report.md").read_text()
    for needle in ("## How to read this report", "## Conclusions", "## Headline", "## Noise floor (A/A)",
                   "## Reliability diagrams", "## Training", "## Per-layer numerics", "## Recipes",
                   "## Conventions", "## Environment and reproduction", "truth (ceiling)",
                   "mxlab run experiments/study.toml", "commit**: 0123abc", "towers.ctr.fc1    e4m3",
                   "6000 eval examples from 800 users", "t over 3 seeds", "bootstrap† (2 seeds, 30 resamples)",
                   "entropy of the eval set's base rate", "mx-diverged/seed1 (step 37)", "Per-seed deltas"):
        assert needle in text, needle
    conclusions = text.split("## Conclusions")[1].split("##")[0]
    assert re.search(r"\*\*mx-regress\*\*: REGRESSION in \d+ of 12 checks", conclusions)
    assert "**mx-same**: neutral" in conclusions
    assert "**mx-diverged**: DIVERGED (seed 1 at step 37)" in conclusions
    ctr_table = text.split("### CTR")[1].split("###")[0]
    regress_row = next(line for line in ctr_table.splitlines() if line.startswith("| mx-regress"))
    assert "**▼ REGRESSION**" in regress_row
    same_row = next(line for line in ctr_table.splitlines() if line.startswith("| mx-same"))
    assert "REGRESSION" not in same_row
    assert "| A/A noise: bf16 reseeded |" in ctr_table


def test_html_report_is_self_contained(rendered):
    directory, *_ = rendered
    page = (directory / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert 'src="figures/' not in page and "http://" not in page and "https://" not in page
    assert '<tr class="regression">' in page and '<tr class="diverged">' in page


def test_summary_json_holds_verdicts_and_intervals(rendered):
    directory, *_ = rendered
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["verdicts"]["mx-regress"]["verdict"] == "regression"
    assert summary["verdicts"]["mx-diverged"]["verdict"] == "diverged"
    comparison = next(c for c in summary["comparisons"]
                      if (c["arm"], c["task"], c["metric"]) == ("mx-regress", "ctr", "calibration_error"))
    assert comparison["interval"]["low"] > 0 and comparison["interval"]["n_examples"] == 6000
    assert "report.md" in summary["files"]


def test_single_seed_report_without_numerics(tmp_path):
    directory = make_fake_study(tmp_path / "one", arms={"bf16": "same", "mx-regress": "regress"}, seeds=(0,),
                                n_examples=3000, n_users=400, with_numerics=False, report={"bootstrap_resamples": 20})
    written = write_report(directory)
    assert "figures/numerics.png" not in written
    text = (directory / "report.md").read_text()
    assert "No run recorded numerics" in text
    assert "No noise floor" in text
    assert "bootstrap† (1 seed, 20 resamples)" in text
    assert "verdicts rest on the user bootstrap" in text


def test_compare_studies_shows_spec_and_delta_differences(tmp_path):
    a = make_fake_study(tmp_path / "a", arms={"bf16": "same", "mx": "regress"}, seeds=(0,), n_examples=3000,
                        n_users=400, report={"bootstrap_resamples": 20})
    b = make_fake_study(tmp_path / "b", arms={"bf16": "same", "mx": "same"}, seeds=(0,), n_examples=3000,
                        n_users=400, report={"bootstrap_resamples": 20, "ne_regression_pct": 0.5})
    text = compare_studies(a, b)
    assert "| report.ne_regression_pct | \"(absent)\" | 0.5 |" in text
    assert "| name | \"a\" | \"b\" |" in text
    assert re.search(r"\| mx \| regression \| neutral \(changed\) \|", text)
    assert re.search(r"\| mx \| CTR \| NE % \| \+[\d.]+% .*regression \|", text)
    same = compare_studies(a, a)
    assert "The two specs are identical." in same


def test_document_rendering_escapes():
    blocks = [Heading("T", 1), Paragraph("a **b** `c<d>`"), BulletList(["x | y"]),
              Table(["h|1", "h2"], [["<script>", "v"]], ["regression"])]
    markdown = render_markdown(blocks)
    assert "| h\\|1 | h2 |" in markdown
    page = render_html(blocks, "t", base_dir=None)
    assert "<strong>b</strong>" in page and "<code>c&lt;d&gt;</code>" in page
    assert "<script>" not in page and '<tr class="regression">' in page
