"""The oracles of a synthetic world's feature groups, and the learnable preset."""

from __future__ import annotations

import pytest

from mxlab.data import make_source
from mxlab.data.oracles import ORACLE_METRICS, ORACLES, oracle_metrics
from mxlab.data.synthetic import resolve_synthetic_table

WORLD = {"source": "synthetic", "eval_examples": 8192, "n_users": 100, "n_items": 64, "n_topics": 8, "base_ctr": 0.2}


def test_each_oracle_lacking_a_feature_group_falls_short_of_the_truth():
    source = make_source(WORLD, 16)
    oracles = oracle_metrics(source)
    assert set(oracles) == set(ORACLES) and all(set(o) == set(ORACLE_METRICS) for o in oracles.values())
    truth = oracles["truth"]
    for name in ("no_history", "no_item_bias"):
        assert oracles[name]["ctr.auc"] < truth["ctr.auc"] and truth["ctr.ne"] < oracles[name]["ctr.ne"] < 1.0
        assert truth["ctcvr.ne"] < oracles[name]["ctcvr.ne"] < 1.0
    assert oracles["no_history"]["ctr.auc"] == pytest.approx(source.truth_reference()["ctr_auc_without_history_term"])
    assert oracles["truth"]["ctr.ne"] == pytest.approx(source.truth_reference()["ctr_ne"])


def test_the_learnable_preset_keeps_production_rates_with_fewer_items_per_topic():
    table = resolve_synthetic_table({"source": "synthetic", "preset": "learnable"})
    assert (table["base_ctr"], table["base_cvr"], table["history_length_sigma"]) == (0.01, 0.05, 1.5)
    assert table["n_items"] // table["n_topics"] == 128 and table["train_examples"] == 4_000_000
    assert table["n_users"] == 400_000 // 200


def test_oracles_need_known_truth():
    class NoTruth:
        info = type("Info", (), {"has_truth": False, "name": "criteo"})()

    with pytest.raises(ValueError, match="oracle metrics need a source with known truth"):
        oracle_metrics(NoTruth())


def test_the_recalibration_fit_converges_at_rare_labels():
    import numpy as np

    from mxlab.data.oracles import platt

    rng = np.random.default_rng(0)
    x = rng.uniform(-9, -3, 4000)
    labels = rng.random(4000) < 1 / (1 + np.exp(-(2.0 + 0.8 * x)))
    a, b = platt(labels, x)
    assert np.isfinite([a, b]).all() and abs(b - 0.8) < 0.4 and abs(a - 2.0) < 2.0


def test_the_oracles_of_a_limit_score_the_first_eval_examples_as_the_training_loop_reads_them():
    import numpy as np

    from mxlab.data.synthetic import rank_auc
    from mxlab.metrics import normalized_entropy

    source = make_source(WORLD, 16)
    batches = list(source.eval_batches(1000))
    click = np.concatenate([b.click.numpy() for b in batches])[:5000]
    true_ctr = np.concatenate([b.true_ctr.numpy() for b in batches]).astype(np.float64)[:5000]
    sliced = oracle_metrics(source, limit=5000)
    assert sliced["truth"]["ctr.ne"] == pytest.approx(normalized_entropy(click, true_ctr), rel=1e-6)
    assert sliced["truth"]["ctr.auc"] == pytest.approx(rank_auc(click, true_ctr), rel=1e-9)
    assert sliced["truth"]["ctr.ne"] != pytest.approx(oracle_metrics(source)["truth"]["ctr.ne"], rel=1e-4)
    assert oracle_metrics(source, limit=0) == oracle_metrics(source)
    with pytest.raises(ValueError, match="limit must be >= 0 .* got -1"):
        oracle_metrics(source, limit=-1)
