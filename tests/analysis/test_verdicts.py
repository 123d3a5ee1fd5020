"""The decision rule: Holm's levels, the four words, the seed minimum."""

import math

import pytest

from mxlab.analysis import Estimate, Hypothesis, decide, holm_levels


def _h(delta, se, k=5, margin=0.1, arm="a", metric="ctr.ne", worse="higher"):
    return Hypothesis(arm, metric, Estimate(delta, se, k - 1, k, se**2 * k, 0.0), margin, worse)


def test_holm_steps_down_and_intervals_follow_the_step():
    rejected, levels = holm_levels([0.001, 0.04, 0.013, 0.2], 0.05)
    # sorted: 0.001 <= 0.05/4, 0.013 <= 0.05/3, 0.04 > 0.05/2 -> stop
    assert rejected == [True, False, True, False]
    assert levels == pytest.approx([0.0125, 0.025, 0.05 / 3, 0.025])
    assert holm_levels([0.001, 0.04], 0.05, "bonferroni") == ([True, False], [0.025, 0.025])
    with pytest.raises(ValueError, match="'sidak'; accepted: holm, bonferroni, none"):
        holm_levels([0.1], 0.05, "sidak")


def test_four_words():
    verdicts = decide(
        [
            _h(2.0, 0.2, arm="bad"),
            _h(-2.0, 0.2, arm="good"),
            _h(0.0, 0.01, arm="tight"),
            _h(0.0, 1.0, arm="wide"),
            _h(-2.0, 0.2, arm="auc-bad", metric="ctr.auc", worse="lower"),
        ]
    )
    assert [v.verdict for v in verdicts] == ["regression", "improvement", "non-inferior", "inconclusive", "regression"]
    assert verdicts[0].low > 0 and verdicts[2].high < 0.1


def test_regression_needs_the_point_beyond_the_margin():
    (v,) = decide([_h(0.05, 0.005, margin=0.1)])
    assert v.low > 0 and v.verdict == "non-inferior"  # worse than zero, but shown within the margin
    (v,) = decide([_h(0.15, 0.03, margin=0.1)])
    assert v.verdict == "inconclusive" and "within the margin" not in v.reason or v.verdict == "regression"


def test_fewer_than_three_seeds_is_always_inconclusive():
    (v,) = decide([_h(50.0, 0.1, k=2)])
    assert v.verdict == "inconclusive" and "a verdict needs 3" in v.reason


def test_no_neutral_word():
    words = {v.verdict for v in decide([_h(d, s) for d in (-1, 0, 1) for s in (0.01, 1)])}
    assert "neutral" not in words and words <= {"regression", "improvement", "non-inferior", "inconclusive"}
    assert math.isfinite(decide([_h(0.0, 1.0)])[0].low)
