"""Power and false-positive rate of the decision rule, by simulating studies from a noise model.

A noise model per metric gives the three variances behind a per-seed paired delta
(mxlab.analysis.stats): retraining ``seed_sd``, per-seed eval sampling ``eval_sd`` and the share of
the eval variance common to all seeds (``eval_shared``; the eval set is the same for every seed).
Simulated studies go through the same estimate and decide functions as `mxlab report`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mxlab.analysis.stats import SeedDeltas, estimate
from mxlab.analysis.verdicts import Hypothesis, decide


@dataclass(frozen=True)
class NoiseModel:
    """Noise of one metric's per-seed delta: retraining sd, eval-sampling sd (per seed, at the fitted eval
    size) and the shared fraction of the eval variance (0..1)."""

    seed_sd: float
    eval_sd: float
    eval_shared: float

    def __post_init__(self) -> None:
        if self.seed_sd < 0 or self.eval_sd < 0 or not 0 <= self.eval_shared <= 1:
            raise ValueError(f"noise model {self}: sds must be >= 0 and eval_shared in [0, 1]")


def fit_noise_model(seed_deltas: Sequence[SeedDeltas]) -> NoiseModel:
    """A noise model fitted on a study's own comparisons (one SeedDeltas per arm, one metric): the mean over
    arms of the per-seed eval variance, of the shared eval variance and of the retraining variance
    (sample variance over seeds minus the seed-specific eval variance, floored at 0).
    Refuses an empty list or comparisons without two seeds."""
    usable = [d for d in seed_deltas if len(d.per_seed) >= 2]
    if not usable:
        raise ValueError("fitting a noise model needs at least one comparison with two or more paired seeds")
    seed_vars, eval_vars, shared_vars = [], [], []
    for d in usable:
        e = estimate(d)
        eval_vars.append(d.eval_var)
        shared_vars.append(min(e.shared_eval_var, d.eval_var))
        seed_vars.append(max(0.0, e.seed_var - (d.eval_var - shared_vars[-1])))
    eval_var = float(np.mean(eval_vars))
    return NoiseModel(
        math.sqrt(float(np.mean(seed_vars))),
        math.sqrt(eval_var),
        float(np.mean(shared_vars)) / eval_var if eval_var > 0 else 0.0,
    )


@dataclass(frozen=True)
class SimulationResult:
    """Rates over simulated studies, each with its binomial standard error."""

    n_studies: int
    false_regression_rate: float  # studies with any regression among the arms without an effect
    power: float  # planted arm called a regression on the planted metric (nan without an effect)
    false_regression_se: float
    power_se: float


def simulate(
    models: Mapping[str, NoiseModel],
    *,
    n_seeds: int,
    n_arms: int,
    margins: Mapping[str, float],
    worse_when: Mapping[str, str],
    effect: Mapping[str, float] | None = None,
    effect_sd: float = 0.0,
    eval_scale: float = 1.0,
    n_studies: int = 1000,
    confidence: float = 0.95,
    correction: str = "holm",
    seed: int = 0,
) -> SimulationResult:
    """Simulate ``n_studies`` studies of n_arms arms against one baseline on n_seeds seeds; the first arm
    carries ``effect`` (metric -> true delta), the others none. ``effect_sd`` > 0 makes the planted effect
    vary from seed to seed: per seed it is drawn from N(effect, effect_sd^2) (a recipe whose cost depends
    on the run, on top of the retraining noise every arm has). Per seed the arms share the baseline run
    (half of the retraining variance), each arm has its own shared eval error; ``eval_scale`` multiplies
    the eval size (eval variances / eval_scale). Returns the false-regression and power rates.
    Refuses fewer than one arm, seed or study, and a negative effect_sd."""
    if n_arms < 1 or n_seeds < 1 or n_studies < 1:
        raise ValueError(f"n_arms, n_seeds and n_studies must be >= 1, got {n_arms}, {n_seeds}, {n_studies}")
    if not effect_sd >= 0:
        raise ValueError(f"effect_sd must be >= 0, got {effect_sd}")
    effect = dict(effect or {})
    rng = np.random.default_rng(seed)
    names = list(models)
    false_hits, power_hits = 0, 0
    for _ in range(n_studies):
        hypotheses = []
        for metric in names:
            model = models[metric]
            eval_var = model.eval_sd**2 / eval_scale
            shared, own = model.eval_shared * eval_var, (1 - model.eval_shared) * eval_var
            half = model.seed_sd / math.sqrt(2)
            base = rng.normal(0, half, n_seeds)
            for arm in range(n_arms):
                true = effect.get(metric, 0.0) if arm == 0 else 0.0
                if true != 0 and effect_sd > 0:
                    true = true + rng.normal(0, effect_sd, n_seeds)
                deltas = (
                    true
                    + rng.normal(0, half, n_seeds)
                    - base
                    + rng.normal(0, math.sqrt(shared))
                    + rng.normal(0, math.sqrt(own), n_seeds)
                )
                seeds = SeedDeltas(dict(enumerate(deltas.tolist())), eval_var, shared + own / n_seeds)
                hypotheses.append(Hypothesis(f"arm{arm}", metric, estimate(seeds), margins[metric], worse_when[metric]))
        verdicts = decide(hypotheses, confidence, correction)
        planted = {("arm0", m) for m, v in effect.items() if v != 0}
        false_hits += any(v.verdict == "regression" and (v.arm, v.metric) not in planted for v in verdicts)
        power_hits += any(v.verdict == "regression" and (v.arm, v.metric) in planted for v in verdicts)
    n = n_studies
    rate = false_hits / n
    power = power_hits / n if any(v != 0 for v in effect.values()) else math.nan
    return SimulationResult(
        n,
        rate,
        power,
        math.sqrt(rate * (1 - rate) / n),
        math.sqrt(power * (1 - power) / n) if math.isfinite(power) else math.nan,
    )
