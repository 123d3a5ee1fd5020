"""The convergence gate and the design line of a report."""

from __future__ import annotations

from mxlab.report.convergence import convergence_warning, design_text


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
