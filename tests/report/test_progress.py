import json

import pytest

from mxlab.experiment.executors.progress import StudyProgress, format_duration, run_state, study_eta
from mxlab.experiment.worker import FileProgress


def test_the_study_eta_scales_the_elapsed_time_by_the_share_not_done():
    assert study_eta(60.0, total_runs=4, done_runs=1, running=[]) == pytest.approx(180.0)
    # two runs half done count as one: 2 of 4 done after 100 s leaves 100 s
    assert study_eta(100.0, total_runs=4, done_runs=1, running=[0.5, 0.5]) == pytest.approx(100.0)
    assert study_eta(10.0, total_runs=3, done_runs=0, running=[2.0]) == pytest.approx(20.0)  # a fraction over 1 is 1
    assert study_eta(10.0, total_runs=3, done_runs=0, running=[0.0]) is None  # nothing done yet: no estimate
    assert study_eta(10.0, total_runs=2, done_runs=2, running=[]) == 0.0


def test_durations_and_run_states_read_as_words():
    assert [format_duration(s) for s in (None, 44.6, 185, 7620)] == ["-", "45 s", "3 min 05 s", "2 h 07 min"]
    assert run_state(3, 8) == "step 3/8" and run_state(8, 8, "evaluating") == "evaluating"
    with pytest.raises(ValueError, match="'paused' is not one of"):
        run_state(1, 2, "paused")


def test_one_eta_for_the_study_and_an_evaluating_state_for_a_run(tmp_path):
    progress = StudyProgress(4, enabled=False)

    def fields(description):
        return next(t.fields for t in progress.progress.tasks if t.description == description)

    progress.update("bf16/seed0", 5, 10, 0.5, 1000.0)
    assert fields("runs")["eta"].startswith("study ETA ") and fields("bf16/seed0")["eta"] == ""  # one ETA: the study's
    assert fields("bf16/seed0")["state"] == "step 5/10" and fields("bf16/seed0")["speed"] == "1,000 ex/s"
    files = FileProgress(tmp_path, min_interval_s=0.0)
    files.start("mx/seed0", 10, 0)
    files.advance(10, 0.4, 900.0)
    files.evaluating()
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "evaluating"
    progress.poll("mx/seed0", tmp_path)
    assert fields("mx/seed0")["state"] == "evaluating" and fields("mx/seed0")["speed"] == ""
    files.advance(10, 0.4, 900.0)
    progress.poll("mx/seed0", tmp_path)
    assert fields("mx/seed0")["state"] == "step 10/10"
    progress.run_done("bf16/seed0", "finished")
    assert progress.done_runs == 1 and [t.description for t in progress.progress.tasks] == ["runs", "mx/seed0"]
    line = progress.run_progress("mx/seed1")
    line.start("mx/seed1", 4, 0)
    line.advance(4, 0.3, 800.0)
    line.evaluating()
    assert fields("mx/seed1")["state"] == "evaluating"
