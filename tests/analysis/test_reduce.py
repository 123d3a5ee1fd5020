"""The runs of a study reduced in a pool of processes give the bits of the reduction in one process."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mxlab.analysis.compare import inputs_from_runs
from mxlab.analysis.reduce import reduce_runs
from mxlab.analysis.study import load_study
from mxlab.experiment.report_settings import METRIC_NAMES
from tests.report.fake_study import make_fake_study


def _flat(inputs) -> dict:
    """Every number of StudyInputs that the runs' reduction feeds, as plain values."""
    out = {"metrics": inputs.run_metrics, "delong": {k: dataclasses.astuple(v) for k, v in inputs.delong.items()},
           "truth": inputs.truth, "n_users": inputs.n_users}
    for (arm, metric), deltas in inputs.deltas.items():
        out[f"{arm}:{metric}"] = (deltas.per_seed, deltas.eval_var, deltas.eval_var_of_mean)
    return out


def test_a_pool_of_processes_gives_the_bits_of_one_process(tmp_path):
    directory = make_fake_study(tmp_path / "study", arms={"bf16": "same", "mx": "regress"}, seeds=(0, 1, 2),
                                n_examples=3000, n_users=150)
    study = load_study(directory)
    serial = inputs_from_runs(study, METRIC_NAMES, workers=1)
    pooled = inputs_from_runs(study, METRIC_NAMES, workers=2)
    assert serial.delong and serial.deltas
    assert repr(_flat(serial)) == repr(_flat(pooled))  # repr: NaN == NaN, floats to the last bit


def test_reduce_runs_names_the_run_that_fails_and_refuses_zero_workers(tmp_path):
    directory = make_fake_study(tmp_path / "study", arms={"bf16": "same"}, seeds=(0,), n_examples=500, n_users=50)
    path = directory / "runs/bf16/seed0/eval.npz"
    arrays = dict(np.load(path))
    arrays["p_ctr"] = arrays["p_ctr"] * 3.0  # beyond [0, 1]
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"^bf16/seed0: "):
        reduce_runs([("bf16/seed0", path, None)], 500, workers=1)
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        reduce_runs([("bf16/seed0", path, None)], 500, workers=0)
