"""`mxlab power --pilot` against the report's decision code.

A pilot folder (study.json and a summary.json, no run folders) carries per-seed deltas built to have
exactly a known spread: retraining sd SEED_SD and eval sd EVAL_SD per endpoint, a share SHARED of the
eval variance common to all seeds. `mxlab power` fits its noise model on them and states the seeds
the candidate needs to ship and the power to find a planted NE regression. An independent simulation
at that spread (per-user influence values over one shared eval set -> stats.eval_variances ->
stats.estimate -> decision.decide_candidates, as `mxlab report` runs them) checks both: the stated
seeds ship in >= 80% of studies (within 3 binomial standard errors), one seed fewer ships less, and
the measured power of the planted regression agrees with the stated one within 3 standard errors of
their difference (the Monte Carlo tolerance).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from mxlab.analysis import Hypothesis, SeedDeltas, decide_candidates, estimate, eval_variances
from mxlab.cli.power import power_main
from mxlab.experiment.report_settings import ReportSettings, worse_when

ENDPOINTS = ("ctr.ne", "ctr.calibration")
SEED_SD = {"ctr.ne": 0.1, "ctr.calibration": 0.5}
EVAL_SD = {"ctr.ne": 0.02, "ctr.calibration": 0.1}
SHARED = 0.2
PILOT_SEEDS = 8
REPORT = {"primary": ["ctr.ne"], "calibration_tasks": ["ctr"], "candidate": ["cand"], "ne_regression_pct": 0.1}
SETTINGS = ReportSettings.from_dict(REPORT)
USERS = 100
N_STUDIES = 400
STEP_MS, STEPS = 50.0, 720  # 36 s a run


def write_pilot(directory):
    """A pilot whose per-seed deltas have exactly the known spread (see the module docstring)."""
    rng = np.random.default_rng(0)
    seeds = list(range(PILOT_SEEDS))
    deltas = []
    for m in ENDPOINTS:
        ev = EVAL_SD[m] ** 2
        own = (1 - SHARED) * ev
        z = rng.normal(size=PILOT_SEEDS)
        z = (z - z.mean()) / z.std(ddof=1)
        values = z * math.sqrt(SEED_SD[m] ** 2 + own)
        deltas.append(
            dict(
                arm="cand",
                metric=m,
                per_seed={str(s): float(v) for s, v in zip(seeds, values)},
                eval_var=ev,
                eval_var_of_mean=SHARED * ev + own / PILOT_SEEDS,
            )
        )
    spec = dict(name="pilot", baseline="bf16", arms=["bf16", "cand"], seeds=seeds, report=REPORT, train={})
    runs = [
        dict(arm=a, seed=s, status="finished", steps=STEPS, step_ms=STEP_MS, wall_s=40.0)
        for a in spec["arms"]
        for s in seeds
    ]
    summary = dict(settings=SETTINGS.to_dict(), runs=runs, inputs=dict(deltas=deltas, aa=[], aa_pairs=[]))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "study.json").write_text(json.dumps(spec))
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def user_level(n_seeds, effects, rng, n_studies=N_STUDIES):
    """Per study, the candidate's decision on the first k seeds for each k in ``n_seeds`` (nested: the
    same studies, a seed fewer)."""
    top = max(n_seeds)
    draws = {}
    for m in ENDPOINTS:
        user_sd = EVAL_SD[m] / math.sqrt(USERS)
        systematic = rng.normal(0, user_sd * math.sqrt(SHARED), (n_studies, 1, USERS))
        influence = systematic + rng.normal(0, user_sd * math.sqrt(1 - SHARED), (n_studies, top, USERS))
        deltas = effects.get(m, 0.0) + rng.normal(0, SEED_SD[m], (n_studies, top)) + influence.sum(axis=2)
        draws[m] = (deltas, influence)
    out = {k: [] for k in n_seeds}
    for i in range(n_studies):
        for k in n_seeds:
            hs = []
            for m, (deltas, influence) in draws.items():
                seeds = SeedDeltas(dict(enumerate(deltas[i, :k].tolist())), *eval_variances(influence[i, :k]))
                hs.append(Hypothesis("cand", m, estimate(seeds), SETTINGS.margin(m), worse_when(m)))
            out[k].append(decide_candidates({"cand": hs})[0])
    return out


def se(rate, n=N_STUDIES):
    return math.sqrt(max(rate * (1 - rate), 0.01) / n)


def test_the_seeds_power_says_ship_in_eighty_percent_and_one_fewer_ships_less(tmp_path):
    lines: list[str] = []
    assert (
        power_main(write_pilot(tmp_path / "pilot"), seeds="8", margins="0.1", studies=N_STUDIES, echo=lines.append) == 0
    )
    print("\n".join(lines))
    assert any("ctr.ne: retraining sd 0.1," in line for line in lines)  # the known spread, fitted back
    row = next(line.split() for line in lines if line.strip().startswith("0.1 "))
    k = int(row[1])
    # device-hours: k seeds x 2 arms x 720 steps x 50 ms
    assert float(row[-1]) == pytest.approx(k * 2 * STEPS * STEP_MS / 3.6e6, rel=0.01)
    decisions = user_level([k - 1, k], {}, np.random.default_rng(1))
    ships = {n: np.mean([d.decision == "ships" for d in ds]) for n, ds in decisions.items()}
    print(f"stated {k} seeds; shipping rate through decide_candidates: {ships}")
    assert ships[k] >= 0.8 - 3 * se(0.8)
    assert ships[k - 1] < ships[k]
    assert ships[k - 1] < 0.8 + 3 * se(0.8)


def test_planted_ne_regressions_are_found_at_the_power_power_states(tmp_path):
    lines: list[str] = []
    pilot = write_pilot(tmp_path / "pilot")
    status = power_main(
        pilot, seeds="8", margins="0.1", effect=0.12, metric="ctr.ne", studies=N_STUDIES, echo=lines.append
    )
    assert status == 0
    stated = float(re.search(r"power ([0-9.]+)", lines[-1]).group(1))
    decisions = user_level([8], {"ctr.ne": 0.12}, np.random.default_rng(2))[8]
    found = np.mean([any(v.verdict == "regression" and v.metric == "ctr.ne" for v in d.endpoints) for d in decisions])
    tolerance = 3 * math.hypot(se(stated), se(found))
    print(f"planted +0.12% NE at 8 seeds: stated power {stated:.3f}, found {found:.3f}, tolerance {tolerance:.3f}")
    assert 0.3 < stated < 0.95  # a planted effect where the power is informative
    assert abs(found - stated) <= tolerance


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(margins="0.1,-0.2"), "--margins '0.1,-0.2': expected a comma-separated list of numbers >= 0"),
        (dict(kind="ece"), "--kind 'ece': no endpoint of that kind; accepted here: calibration, ne"),
        (dict(metric="ctr.nee", effect=0.1), "unknown metric 'ctr.nee'; accepted: ctr.ne"),
        (dict(metric="cvr.ne", effect=0.1), "--metric 'cvr.ne' is not a co-primary endpoint here; accepted: ctr.ne"),
        (dict(seeds="three"), "--seeds 'three': expected a comma-separated list of integers >= 1"),
    ],
)
def test_bad_options_fail_with_one_clear_error(tmp_path, kwargs, message):
    lines: list[str] = []
    assert power_main(write_pilot(tmp_path / "pilot"), studies=10, echo=lines.append, **kwargs) == 2
    assert len(lines) == 1 and message in lines[0], lines


def test_a_pilot_without_runs_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "study.json").write_text(json.dumps(dict(name="e", baseline="bf16", arms=["bf16", "c"], seeds=[0, 1])))
    (empty / "runs").mkdir()
    lines: list[str] = []
    assert power_main(empty, echo=lines.append) == 2
    assert "has no co-primary endpoint" in lines[0] and "accepted: a study whose arms and baseline finished" in lines[0]
    lines.clear()
    assert power_main(tmp_path / "nowhere", echo=lines.append) == 2
    assert "is neither a study folder nor a study's summary.json" in lines[0]
