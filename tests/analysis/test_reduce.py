"""The runs of a study reduced in a pool of processes (one seed each) give the bits of the reduction in one process."""

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
    out = {
        "metrics": inputs.run_metrics,
        "delong": {k: dataclasses.astuple(v) for k, v in inputs.delong.items()},
        "truth": inputs.truth,
        "n_users": inputs.n_users,
    }
    for (arm, metric), deltas in inputs.deltas.items():
        out[f"{arm}:{metric}"] = (deltas.per_seed, deltas.eval_var, deltas.eval_var_of_mean)
    return out


def test_a_pool_of_processes_gives_the_bits_of_one_process(tmp_path):
    directory = make_fake_study(
        tmp_path / "study", arms={"bf16": "same", "mx": "regress"}, seeds=(0, 1, 2), n_examples=3000, n_users=150
    )
    study = load_study(directory)
    serial = inputs_from_runs(study, METRIC_NAMES, workers=1)
    pooled = inputs_from_runs(study, METRIC_NAMES, workers=2)
    assert serial.delong and serial.deltas
    assert repr(_flat(serial)) == repr(_flat(pooled))  # repr: NaN == NaN, floats to the last bit


def test_reduce_runs_names_the_run_that_fails_and_refuses_bad_input(tmp_path):
    directory = make_fake_study(tmp_path / "study", arms={"bf16": "same"}, seeds=(0,), n_examples=500, n_users=50)
    path = directory / "runs/bf16/seed0/eval.npz"
    assert (
        reduce_runs([([("bf16/seed0", path)], "bf16/seed0")], 500, workers=1)[0][0].delong == {}
    )  # not against itself
    with pytest.raises(ValueError, match=r"baseline run 'mx/seed0' is not among the seed's runs \['bf16/seed0'\]"):
        reduce_runs([([("bf16/seed0", path)], "mx/seed0")], 500, workers=1)
    arrays = dict(np.load(path))
    arrays["p_ctr"] = arrays["p_ctr"] * 3.0  # beyond [0, 1]
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"^bf16/seed0: "):
        reduce_runs([([("bf16/seed0", path)], None)], 500, workers=1)
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        reduce_runs([([("bf16/seed0", path)], None)], 500, workers=0)


def test_the_shared_sort_gives_what_each_function_gives_on_its_own(tmp_path):
    from mxlab import metrics
    from mxlab.analysis.reduce import user_indices
    from mxlab.analysis.stats import RunSums

    directory = make_fake_study(
        tmp_path / "study", arms={"bf16": "same", "mx": "regress"}, seeds=(0,), n_examples=3000, n_users=150
    )
    path = directory / "runs/mx/seed0/eval.npz"
    reduced = reduce_runs([([("mx/seed0", path)], None)], 3000, workers=1)[0][0]
    assert repr(reduced.metrics) == repr(metrics.evaluate_run(path))
    arrays = metrics.load_eval(path)
    index, n_users = user_indices(arrays["user_id"])
    for task, view in metrics.task_views(arrays).items():
        alone = RunSums.build(view.labels, view.probs, index if view.mask is None else index[view.mask], n_users)
        assert repr(dataclasses.astuple(reduced.sums[task])) == repr(dataclasses.astuple(alone)), task
