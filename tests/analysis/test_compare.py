"""analyze_study on fake study folders: planted effects, diverged seeds, bad input, earlier summaries."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mxlab import analysis
from mxlab.experiment.report_settings import ReportSettings
from tests.report.fake_study import make_fake_study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    directory = make_fake_study(
        tmp_path_factory.mktemp("a") / "s",
        seeds=(0, 1, 2, 3),
        arms={"bf16": "same", "mx-same": "same", "mx-regress": "regress", "mx-div": "diverged"},
        report={"calibration_tasks": []},  # the NE endpoints alone: a family of 6 at 4 seeds
    )
    return analysis.analyze_study(directory)


def test_planted_regression_is_called_and_the_same_arm_is_not(study):
    for metric in ("ctr.ne", "ctcvr.ne"):
        assert study.comparison("mx-regress", metric).verdict == "regression"
        assert study.comparison("mx-same", metric).verdict in ("inconclusive", "non-inferior")
    assert study.family_size == 6
    secondary = study.comparison("mx-regress", "ctr.auc")
    assert secondary.verdict is None and not secondary.primary and secondary.level == 0.95 and secondary.high < 0


def test_a_diverged_seed_is_left_out_and_the_others_decide(study):
    arm = study.arms["mx-div"]
    assert arm.diverged == {1: 37} and arm.paired_seeds == [0, 2, 3]
    c = study.comparison("mx-div", "ctr.ne")
    assert sorted(c.per_seed) == [0, 2, 3] and c.verdict in ("inconclusive", "non-inferior")


def test_deltas_are_paired_by_seed(study):
    rm = study.inputs.run_metrics
    c = study.comparison("mx-regress", "ctr.ne")
    for seed, value in c.per_seed.items():
        assert value == pytest.approx(100 * (rm["mx-regress"][seed]["ctr"]["ne"] / rm["bf16"][seed]["ctr"]["ne"] - 1))


def test_aa_uses_disjoint_seed_pairs(study):
    assert study.inputs.aa_pairs == [(0, 1), (2, 3)]
    assert {c.metric for c in study.aa} == {"ctr.ne", "ctcvr.ne"}


def test_summary_re_renders_to_the_same_verdicts(study, tmp_path):
    summary = json.loads(json.dumps(study.to_dict()))
    inputs = analysis.inputs_from_summary(summary, "bf16")
    again = analysis.conclude(study.study, inputs, study.settings)
    assert [(c.arm, c.metric, c.verdict, round(c.high, 9)) for c in again.comparisons] == [
        (c.arm, c.metric, c.verdict, round(c.high, 9)) for c in study.comparisons
    ]


def test_two_seeds_give_inconclusive_and_say_how_many_are_needed(tmp_path):
    directory = make_fake_study(tmp_path / "two", seeds=(0, 1), n_examples=4000, n_users=400)
    result = analysis.analyze_study(directory)
    assert {c.verdict for c in result.comparisons if c.primary} == {"inconclusive"}
    assert all(d.n_seeds == 2 for d in result.detectable)


def test_one_seed_is_counted_as_one_paired_seed_not_zero(tmp_path):
    directory = make_fake_study(tmp_path / "one", seeds=(0,), n_examples=4000, n_users=400)
    result = analysis.analyze_study(directory)
    assert result.detectable and all(d.n_seeds == 1 for d in result.detectable)


def test_bad_settings_name_the_value_and_the_accepted_set():
    with pytest.raises(ValueError, match=r"unknown metric 'ctr.nee'; accepted: ctr.ne, ctr.excess_ne"):
        ReportSettings.from_dict({"primary": ["ctr.nee"]})
    with pytest.raises(ValueError, match=r"ne_regression_pct=-0.5 must be >= 0 \(accepted: a number >= 0\)"):
        ReportSettings.from_dict({"ne_regression_pct": -0.5})
    with pytest.raises(ValueError, match=r"margins.ctr.auc=-1 must be >= 0"):
        ReportSettings.from_dict({"margins": {"ctr.auc": -1}})
    with pytest.raises(ValueError, match=r"correction='sidak'; accepted: holm, bonferroni, none"):
        ReportSettings.from_dict({"correction": "sidak"})
    assert ReportSettings.from_dict({"bootstrap_resamples": 200}, legacy=True) == ReportSettings()


def test_excess_ne_as_primary_needs_truth(tmp_path):
    directory = make_fake_study(tmp_path / "nt", seeds=(0, 1, 2, 3), report={"primary": ["ctr.excess_ne"]})
    result = analysis.analyze_study(directory)
    assert result.comparison("mx-regress", "ctr.excess_ne").verdict == "regression"
    for seed in (0, 1, 2, 3):
        for arm in ("bf16", "mx-same", "mx-regress"):
            path = directory / "runs" / arm / f"seed{seed}" / "eval.npz"
            arrays = {k: v for k, v in np.load(path).items() if not k.startswith("true_")}
            np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"\['ctr.excess_ne'\] need a source with truth"):
        analysis.analyze_study(directory)


def test_broken_pairing_and_bad_status_are_refused(tmp_path):
    directory = make_fake_study(
        tmp_path / "broken", arms={"bf16": "same", "mx": "same"}, seeds=(0,), n_examples=2000, n_users=200
    )
    path = directory / "runs" / "mx" / "seed0" / "eval.npz"
    arrays = dict(np.load(path))
    arrays["click"] = 1 - arrays["click"]
    arrays["conversion"] = np.zeros_like(arrays["conversion"])
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="different 'click'"):
        analysis.analyze_study(directory)
    (directory / "runs" / "mx" / "seed0" / "done.json").write_text(json.dumps({"status": "exploded"}))
    with pytest.raises(ValueError, match="'exploded'.*'finished', 'diverged'"):
        analysis.load_study(directory)


def test_an_earlier_versions_study_folder_without_runs_is_read_from_its_summary(tmp_path):
    source = Path(__file__).parent / "data" / "legacy-movielens"  # reports/movielens as committed before this version
    folder = tmp_path / "movielens"
    folder.mkdir()
    shutil.copy(source / "study.json", folder)
    shutil.copy(source / "summary.json", folder)
    legacy = json.loads((folder / "summary.json").read_text())
    result = analysis.analyze_study(folder)
    assert result.study.has_runs is False and result.inputs.source == "summary"
    c = result.comparison("mxfp4-all", "ctr.ne")
    old = next(x for x in legacy["comparisons"] if (x["arm"], x["task"], x["metric"]) == ("mxfp4-all", "ctr", "ne_pct"))
    assert c.per_seed == {int(k): v for k, v in old["per_seed"].items()}
    assert c.verdict == "inconclusive"  # 2 paired seeds


def test_approximated_calibration_shifts_keep_their_note_through_a_re_render(tmp_path):
    """The shifts a summary without them gets are approximated (study.CALIBRATION_NOTE); the summary written from
    that reading carries the shifts, and reading it again must still say they are approximated."""
    from mxlab.analysis.study import CALIBRATION_NOTE

    source = Path(__file__).parent / "data" / "legacy-movielens"
    folder = tmp_path / "movielens"
    folder.mkdir()
    shutil.copy(source / "study.json", folder)
    shutil.copy(source / "summary.json", folder)
    first = analysis.analyze_study(folder)
    assert first.inputs.notes.count(CALIBRATION_NOTE) == 1
    (folder / "summary.json").write_text(json.dumps(first.to_dict()))
    second = analysis.analyze_study(folder)
    assert second.inputs.notes.count(CALIBRATION_NOTE) == 1
    assert second.comparison("mxfp4-all", "ctr.calibration").per_seed == (
        first.comparison("mxfp4-all", "ctr.calibration").per_seed
    )


def test_a_spec_with_a_truth_metric_on_a_source_without_truth_is_refused(tmp_path):
    from mxlab.experiment.spec import spec_from_dict

    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "bf16.toml").write_text('name = "bf16"\ndefault = "hp"\n[policies.hp]\nall = "bf16"\n')
    raw = {
        "name": "x",
        "seeds": [0],
        "baseline": "bf16",
        "arms": ["bf16"],
        "data": {"source": "movielens-100k"},
        "model": {},
        "report": {"primary": ["ctr.excess_ne"]},
    }
    with pytest.raises(ValueError, match=r"primary \['ctr.excess_ne'\] needs a source with truth \(synthetic\)"):
        spec_from_dict(raw, recipe_dir=tmp_path / "recipes", check_recipes=False)
    raw["report"] = {"primary": ["ctr.ndcg"]}
    with pytest.raises(
        ValueError, match=r"\[report\]: report setting primary names unknown metric 'ctr.ndcg'; accepted: ctr.ne"
    ):
        spec_from_dict(raw, recipe_dir=tmp_path / "recipes", check_recipes=False)
    raw["report"] = {"auc_regression": -0.1}
    with pytest.raises(ValueError, match=r"auc_regression=-0.1 must be >= 0 \(accepted: a number >= 0\)"):
        spec_from_dict(raw, recipe_dir=tmp_path / "recipes", check_recipes=False)
