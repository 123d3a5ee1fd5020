"""Power and false-positive rate of the decision rules, by simulating studies from a noise model.

A noise model per metric gives the three variances behind a per-seed paired delta
(mxlab.analysis.stats): retraining ``seed_sd``, per-seed eval sampling ``eval_sd`` and the share of
the eval variance common to all seeds (``eval_shared``; the eval set is the same for every seed).
Simulated studies go through the same functions as `mxlab report`: ``simulate`` through the
exploratory family's ``decide``, ``simulate_decision`` and ``seeds_to_ship`` through the
pre-registered candidate's ``decide_candidates`` (intersection-union over its co-primary endpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mxlab.analysis.decision import decide_candidates
from mxlab.analysis.sensitivity import pass_probability
from mxlab.analysis.stats import SeedDeltas, estimate
from mxlab.analysis.verdicts import Hypothesis, decide
from mxlab.experiment.report_settings import MIN_PAIRED_SEEDS, worse_when


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


# ----------------------------------------------------------------------------- the candidate's decision


@dataclass(frozen=True)
class DecisionRates:
    """Rates of the first candidate's decision over simulated studies (binomial se: :meth:`se`)."""

    n_studies: int
    ships: float  # "ships"
    regression: float  # called a regression on some endpoint
    found: float  # called a regression on a planted endpoint (nan without an effect)

    def se(self, rate: float) -> float:
        """The binomial standard error of one of these rates."""
        return math.sqrt(rate * (1 - rate) / self.n_studies) if math.isfinite(rate) else math.nan


def simulate_decision(
    models: Mapping[str, NoiseModel],
    *,
    n_seeds: int,
    margins: Mapping[str, float],
    effect: Mapping[str, float] | None = None,
    effect_sd: float = 0.0,
    n_candidates: int = 1,
    eval_scale: float = 1.0,
    n_studies: int = 1000,
    confidence: float = 0.95,
    correction: str = "holm",
    seed: int = 0,
) -> DecisionRates:
    """Simulate ``n_studies`` studies of ``n_candidates`` pre-registered candidates on the co-primary
    endpoints of ``models`` (endpoint -> noise) and decide each through
    mxlab.analysis.decision.decide_candidates, the code `mxlab report` runs. The first candidate carries
    ``effect`` (endpoint -> true delta, signed: positive is worse for NE, negative for AUC), per seed drawn
    from N(effect, effect_sd^2) when ``effect_sd`` > 0 (a cost that depends on the run); endpoints
    are drawn independently; per seed the candidates share the baseline run. Returns the first
    candidate's rates. Refuses fewer than one candidate, seed or study, a negative effect_sd, an effect on
    an unknown endpoint and an endpoint without a margin."""
    if n_candidates < 1 or n_seeds < 1 or n_studies < 1:
        raise ValueError(
            f"n_candidates, n_seeds and n_studies must be >= 1, got {n_candidates}, {n_seeds}, {n_studies}"
        )
    if not effect_sd >= 0:
        raise ValueError(f"effect_sd must be >= 0, got {effect_sd}")
    lacking = [m for m in models if m not in margins]
    if lacking:
        raise ValueError(f"no margin for endpoint(s) {lacking}; margins given for {sorted(margins)}")
    effect = {m: v for m, v in (effect or {}).items() if v != 0}
    unknown = [m for m in effect if m not in models]
    if unknown:
        raise ValueError(f"effect on {unknown}, not an endpoint; accepted: {', '.join(models)}")
    rng = np.random.default_rng(seed)
    k, c = n_seeds, n_candidates
    draws = {}
    for m, model in models.items():
        eval_var = model.eval_sd**2 / eval_scale
        shared, own = model.eval_shared * eval_var, (1 - model.eval_shared) * eval_var
        half = model.seed_sd / math.sqrt(2)
        base = rng.normal(0, half, (n_studies, 1, k))
        deltas = (
            rng.normal(0, half, (n_studies, c, k))
            - base
            + rng.normal(0, math.sqrt(shared), (n_studies, c, 1))
            + rng.normal(0, math.sqrt(own), (n_studies, c, k))
        )
        if m in effect:
            deltas[:, 0, :] += effect[m] + (rng.normal(0, effect_sd, (n_studies, k)) if effect_sd > 0 else 0.0)
        draws[m] = (deltas, eval_var, shared + own / k)
    ships = regression = found = 0
    for i in range(n_studies):
        endpoints = {
            f"c{j}": [
                Hypothesis(
                    f"c{j}",
                    m,
                    estimate(SeedDeltas(dict(enumerate(d[i, j].tolist())), ev, evm)),
                    margins[m],
                    worse_when(m),
                )
                for m, (d, ev, evm) in draws.items()
            ]
            for j in range(c)
        }
        first = decide_candidates(endpoints, confidence, correction)[0]
        ships += first.decision == "ships"
        regression += any(v.verdict == "regression" for v in first.endpoints)
        found += any(v.verdict == "regression" and v.metric in effect for v in first.endpoints)
    n = n_studies
    return DecisionRates(n, ships / n, regression / n, found / n if effect else math.nan)


def _ship_probability(models, margins, k, alpha, eval_scale):
    """The analytic ship probability at a true delta of 0 (endpoints independent; sensitivity's model)."""
    p = 1.0
    for m, model in models.items():
        ev = model.eval_sd**2 / eval_scale
        se = math.sqrt(model.seed_sd**2 / k + ev * (model.eval_shared + (1 - model.eval_shared) / k))
        if se == 0:
            continue
        p *= pass_probability(0.0, margins[m], se, k - 1, alpha, worse_when(m) == "either")
    return p


@dataclass(frozen=True)
class SeedsNeeded:
    """The fewest seeds whose simulated ship rate at a true delta of 0 reaches the power (None: more than
    the most tried), with the simulated rates there and at one seed fewer."""

    seeds: int | None
    at: DecisionRates | None
    fewer: DecisionRates | None


def seeds_to_ship(
    models: Mapping[str, NoiseModel],
    margins: Mapping[str, float],
    *,
    power: float = 0.8,
    max_seeds: int = 64,
    n_candidates: int = 1,
    eval_scale: float = 1.0,
    n_studies: int = 1000,
    confidence: float = 0.95,
    correction: str = "holm",
    seed: int = 0,
) -> SeedsNeeded:
    """The fewest seeds (MIN_PAIRED_SEEDS..max_seeds) at which the candidate ships with probability
    ``power`` when nothing differs, by :func:`simulate_decision`: the analytic ship probability (endpoints
    independent) gives the starting point, the simulated rate decides (each seed count simulated once,
    with its own fixed seed). Refuses what simulate_decision refuses."""
    alpha = (1 - confidence) / n_candidates
    start = next(
        (k for k in range(MIN_PAIRED_SEEDS, max_seeds + 1) if _ship_probability(models, margins, k, alpha, eval_scale)
         >= power),
        max_seeds,
    )  # fmt: skip
    cache: dict[int, DecisionRates] = {}

    def rate(k: int) -> DecisionRates:
        if k not in cache:
            cache[k] = simulate_decision(
                models, n_seeds=k, margins=margins, n_candidates=n_candidates, eval_scale=eval_scale,
                n_studies=n_studies, confidence=confidence, correction=correction, seed=seed + 7919 * k,
            )  # fmt: skip
        return cache[k]

    k = start
    if rate(k).ships >= power:
        while k > MIN_PAIRED_SEEDS and rate(k - 1).ships >= power:
            k -= 1
    else:
        while k < max_seeds and rate(k).ships < power:
            k += 1
        if rate(k).ships < power:
            return SeedsNeeded(None, rate(k), None)
    return SeedsNeeded(k, rate(k), rate(k - 1) if k > MIN_PAIRED_SEEDS else None)
