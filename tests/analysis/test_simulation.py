"""The decision rule's own error rates, measured by simulation through the code `mxlab report` runs.

Each simulated study has a baseline and two arms on k seeds; per metric (ctr.ne, ctcvr.ne) the
per-seed delta of an arm is its true effect + retraining noise (the arm's run minus the baseline's run
of that seed, so the arms share the baseline's noise) + the eval-sampling error, which is the sum of
per-user influence values over one shared eval set of users: a part of every user's influence is
the same on every seed (the eval set does not change), the rest is drawn per seed. The influence
values go through stats.eval_variances, stats.estimate and verdicts.decide, as in compare.conclude.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mxlab.analysis import (
    Hypothesis,
    NoiseModel,
    SeedDeltas,
    decide,
    detectable_effect,
    estimate,
    eval_variances,
    simulate,
)

METRICS = ("ctr.ne", "ctcvr.ne")
SEED_SD = {"ctr.ne": 0.5, "ctcvr.ne": 0.8}  # retraining noise of a per-seed delta, % of NE
EVAL_SD = {"ctr.ne": 0.1, "ctcvr.ne": 0.2}  # eval-sampling noise of a per-seed delta
SHARED = 0.5  # share of the eval variance common to every seed
MARGIN = 0.02
USERS = 300
N_STUDIES = 600


def simulate_user_level(n_seeds: int, effect: float, rng: np.random.Generator, n_studies: int = N_STUDIES):
    """(any false regression, planted arm's ctr.ne called a regression) per simulated study."""
    false_hits, planted_hits = np.zeros(n_studies, bool), np.zeros(n_studies, bool)
    for study in range(n_studies):
        hypotheses = []
        for metric in METRICS:
            per_user_sd = EVAL_SD[metric] / math.sqrt(USERS)
            base_run = rng.normal(0, SEED_SD[metric] / math.sqrt(2), n_seeds)
            for arm in range(2):
                systematic = rng.normal(0, per_user_sd * math.sqrt(SHARED), USERS)
                influence = systematic + rng.normal(0, per_user_sd * math.sqrt(1 - SHARED), (n_seeds, USERS))
                true = effect if (arm == 0 and metric == "ctr.ne") else 0.0
                deltas = (
                    true + rng.normal(0, SEED_SD[metric] / math.sqrt(2), n_seeds) - base_run + influence.sum(axis=1)
                )
                eval_var, eval_var_of_mean = eval_variances(influence)
                seeds = SeedDeltas(dict(enumerate(deltas.tolist())), eval_var, eval_var_of_mean)
                hypotheses.append(Hypothesis(f"arm{arm}", metric, estimate(seeds), MARGIN, "higher"))
        verdicts = decide(hypotheses, 0.95, "holm")
        planted = ("arm0", "ctr.ne") if effect else None
        false_hits[study] = any(v.verdict == "regression" and (v.arm, v.metric) != planted for v in verdicts)
        planted_hits[study] = any(v.verdict == "regression" and (v.arm, v.metric) == planted for v in verdicts)
    return false_hits, planted_hits


def binomial_margin(rate: float, n: int, z: float = 3.0) -> float:
    return z * math.sqrt(max(rate * (1 - rate), 0.05 * 0.95) / n)


@pytest.mark.parametrize("n_seeds", [2, 3, 5])
def test_aa_family_wise_false_regression_rate_is_at_most_five_percent(n_seeds):
    false_hits, _ = simulate_user_level(n_seeds, 0.0, np.random.default_rng(n_seeds))
    rate = false_hits.mean()
    print(f"A/A, {n_seeds} seeds: family-wise false-regression rate {rate:.4f} over {N_STUDIES} studies")
    if n_seeds < 3:
        assert rate == 0.0  # below three paired seeds nothing is decided
    else:
        assert rate <= 0.05 + binomial_margin(0.05, N_STUDIES)


def test_power_on_planted_regressions_matches_the_power_command():
    models = {m: NoiseModel(SEED_SD[m], EVAL_SD[m], SHARED) for m in METRICS}
    n_seeds = 5
    se = math.sqrt(
        SEED_SD["ctr.ne"] ** 2 / n_seeds
        + SHARED * EVAL_SD["ctr.ne"] ** 2
        + (1 - SHARED) * EVAL_SD["ctr.ne"] ** 2 / n_seeds
    )
    effect = detectable_effect(se, n_seeds - 1, 0.05 / 4, 0.8)  # the report's smallest detectable effect
    _, planted = simulate_user_level(n_seeds, effect, np.random.default_rng(11))
    predicted = simulate(
        models,
        n_seeds=n_seeds,
        n_arms=2,
        margins={m: MARGIN for m in METRICS},
        worse_when={m: "higher" for m in METRICS},
        effect={"ctr.ne": effect},
        n_studies=2000,
        seed=5,
    )
    measured = planted.mean()
    print(
        f"planted ctr.ne +{effect:.3f}% at {n_seeds} seeds: power {measured:.3f}, predicted {predicted.power:.3f} "
        f"± {predicted.power_se:.3f}; predicted A/A-arm false-regression rate {predicted.false_regression_rate:.3f}"
    )
    margin = 3 * math.sqrt(predicted.power_se**2 + measured * (1 - measured) / N_STUDIES)
    assert abs(measured - predicted.power) <= margin
    assert measured >= 0.7  # the stated smallest detectable effect is detected most of the time (80% at Bonferroni)
    assert predicted.false_regression_rate <= 0.05 + binomial_margin(0.05, 2000)


def test_power_command_prints_rates_and_refuses_bad_options():
    from mxlab.cli.power import power_main

    lines: list[str] = []
    status = power_main(None, "3,5", "0.5", None, 1.5, None, 0.5, 0.1, 0.5, 1.0, 200, echo=lines.append)
    assert status == 0
    rows = [line.split() for line in lines if "A/A regression " in line and line.strip()[0].isdigit()]
    assert [row[0] for row in rows] == ["3", "5"]
    assert all(float(row[3]) <= 0.05 + binomial_margin(0.05, 200) for row in rows)
    assert float(rows[1][-3]) > float(rows[0][-3])  # more seeds, more power
    bad: list[str] = []
    assert power_main(None, "three", None, None, 0.0, None, 0.5, 0.1, 0.5, 1.0, 100, echo=bad.append) == 2
    assert "--seeds 'three'" in bad[0]
    assert power_main(None, "3", None, None, 0.0, "ctr.nee", 0.5, 0.1, 0.5, 1.0, 100, echo=bad.append) == 2
    assert "unknown metric 'ctr.nee'; accepted: ctr.ne" in bad[-1]


def test_a_cost_that_varies_from_seed_to_seed_is_detected_less_often():
    models = {m: NoiseModel(SEED_SD[m], EVAL_SD[m], SHARED) for m in METRICS}
    common = dict(
        n_seeds=8,
        n_arms=2,
        margins={m: MARGIN for m in METRICS},
        worse_when={m: "higher" for m in METRICS},
        effect={"ctr.ne": 1.2},
        n_studies=400,
        seed=3,
    )
    constant = simulate(models, **common)
    assert simulate(models, effect_sd=0.0, **common) == constant  # sd 0 is the constant effect, same draws
    varying = simulate(models, effect_sd=2.0, **common)
    print(f"power at +1.2% NE, 8 seeds: constant {constant.power:.3f}, varying with sd 2.0 {varying.power:.3f}")
    assert constant.power >= 0.8
    assert varying.power < constant.power - 3 * math.hypot(constant.power_se, varying.power_se)
    with pytest.raises(ValueError, match="effect_sd must be >= 0, got -1"):
        simulate(models, effect_sd=-1.0, **common)


def test_power_command_refuses_an_effect_sd_without_an_effect():
    from mxlab.cli.power import power_main

    lines: list[str] = []
    common = dict(seed_sd=0.5, eval_sd=0.1, studies=50, margins="0.5", echo=lines.append)
    assert power_main(None, "3", effect_sd=1.0, **common) == 2
    assert lines == ["error: --effect-sd needs a planted --effect to vary around"]
    lines.clear()
    assert power_main(None, "5", effect=1.5, effect_sd=1.0, **common) == 0
    assert any("varying from seed to seed with sd 1" in line for line in lines)
