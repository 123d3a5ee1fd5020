"""The convergence gate, the plateau rule and the design line of a report."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxlab.experiment.report_settings import ReportSettings
from mxlab.report.alerts import NOTE, WEAKENS
from mxlab.report.convergence import convergence_warning, design_text, plateau_alert


def _series(values_by_seed):
    return {
        "bf16": {
            seed: [(10 * (i + 1), {"ctr.ne": v, "ctcvr.ne": v}) for i, v in enumerate(values)]
            for seed, values in values_by_seed.items()
        }
    }


def test_a_baseline_still_falling_by_more_than_half_the_seed_spread_has_not_converged():
    # last values 0.90, 0.92, 0.94: SD 0.02, bound 0.01; mean fall 0.03 -> not converged
    warning = convergence_warning(_series({0: [0.93, 0.90], 1: [0.95, 0.92], 2: [0.97, 0.94]}), "bf16")
    assert (
        warning is not None
        and "bf16 has not converged" in warning
        and "0.03" in warning
        and "0.5 x the between-seed SD 0.02" in warning
    )


def test_a_plateaued_baseline_passes_and_other_arms_do_not_count():
    series = _series({0: [0.905, 0.90], 1: [0.925, 0.92], 2: [0.945, 0.94]})  # fall 0.005 < 0.01
    series["mxfp4-all"] = {0: [(10, {"ctr.ne": 2.0}), (20, {"ctr.ne": 1.0})]}
    assert convergence_warning(series, "bf16") is None
    assert convergence_warning({}, "bf16") is None  # no held-out records: no gate


def test_one_seed_falls_back_to_a_relative_bound():
    assert convergence_warning(_series({0: [0.9012, 0.9]}), "bf16") is not None  # 0.0012 > 0.1% of 0.9
    assert convergence_warning(_series({0: [0.9005, 0.9]}), "bf16") is None


def test_design_text_names_the_design():
    assert "from scratch" in design_text({"arms": ["bf16"]})
    fork = design_text(
        {"arms": ["bf16", "post:mxfp8-rceil"], "design": {"kind": "fork", "from": "bf16", "warmup_steps": 64}}
    )
    assert "**fork**" in fork and "trained 64 steps" in fork and "post:mxfp8-rceil" in fork


# From scratch, 160 steps with the last 60 in a decay: the rule reads steps 1-100 (`_series` evaluates every 10).
FROM_SCRATCH = {"train": {"max_steps": 160, "lr_decay_steps": 60}}


def _curve(fall_in_window: float) -> list[float]:
    """Held-out NE at steps 10..160: falling to 0.80 by step 60, then by `fall_in_window` (relative) over
    steps 70-100, then (in the decay) to 0.70, which the rule must not read."""
    early = [1.0, 0.95, 0.90, 0.86, 0.83, 0.80]
    window = [0.80 * (1 - fall_in_window * k / 4) for k in (1, 2, 3, 4)]
    return early + window + [0.75, 0.72, 0.71, 0.70, 0.70, 0.70]


def test_the_plateau_rule_names_each_seed_still_improving_before_the_decay():
    series = _series({0: _curve(0.0002), 1: _curve(0.004), 2: _curve(0.0)})
    alert = plateau_alert(series, FROM_SCRATCH, "bf16", window=40, tolerance=0.0005)
    assert alert.severity == WEAKENS
    assert "seed 1 ctr.ne improved 0.400% over steps 60-100" in alert.text
    assert "seed 1 ctcvr.ne" in alert.text and "seed 0" not in alert.text and "seed 2" not in alert.text
    assert "steps 1-100" in alert.text  # the decay's steps 110-160 (falling 12%) are not read


def test_the_plateau_rule_notes_that_every_seed_passed():
    series = _series({0: _curve(0.0002), 1: _curve(0.0004)})
    alert = plateau_alert(series, FROM_SCRATCH, "bf16", window=40, tolerance=0.0005)
    assert alert.severity == NOTE and "Every seed passed the plateau rule" in alert.text
    # the same series judged over the whole run (no decay declared) fails: the decay's fall is then read
    assert plateau_alert(series, {"train": {"max_steps": 160}}, "bf16", 40, 0.0005).severity == WEAKENS


def test_the_plateau_rule_reads_the_fork_warmups_and_names_a_seed_it_cannot_judge():
    series = {"_fork": _series({0: [0.9, 0.9, 0.9, 0.9], 1: [0.9]})["bf16"]}
    alert = plateau_alert(series, {"design": {"kind": "fork"}}, "bf16", window=20, tolerance=0.0005)
    assert alert.severity == WEAKENS and "the fork warm-ups" in alert.text
    assert "when the arms started from them" in alert.text
    assert "seed 1 (ctr.ne: no evaluation 20 steps before its last)" in alert.text and "seed 0" not in alert.text


def test_no_plateau_rule_without_a_window_or_held_out_records():
    series = _series({0: _curve(0.01)})
    assert plateau_alert(series, FROM_SCRATCH, "bf16", window=0, tolerance=0.0005) is None
    assert plateau_alert({}, FROM_SCRATCH, "bf16", window=40, tolerance=0.0005) is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"plateau_window": -1}, "plateau_window=-1.0; accepted: a whole number of steps >= 0"),
        ({"plateau_window": 10.5}, "plateau_window=10.5; accepted: a whole number"),
        ({"plateau_tolerance": 1.0}, "plateau_tolerance=1.0; accepted: a number in [0, 1)"),
        ({"plateau_tolerance": -0.1}, "plateau_tolerance=-0.1; accepted: a number in [0, 1)"),
    ],
)
def test_a_bad_plateau_rule_is_refused(values, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ReportSettings.from_dict(values)


def test_the_plateau_rule_is_recorded_only_when_declared():
    assert "plateau_window" not in ReportSettings().to_dict()  # digests of studies registered before it hold
    declared = ReportSettings.from_dict({"plateau_window": 1024}).to_dict()
    assert declared["plateau_window"] == 1024 and declared["plateau_tolerance"] == 0.0005
    assert ReportSettings.from_dict(declared).to_dict() == declared


def test_a_plateau_rule_without_held_out_records_is_refused():
    from mxlab.experiment.spec import load_spec

    with pytest.raises(
        ValueError, match=r"plateau_window = 1024 needs held-out records to judge: set \[train\] eval_every"
    ):
        load_spec(Path(__file__).resolve().parents[2] / "experiments" / "learnable-pilot.toml", ["train.eval_every=0"])
