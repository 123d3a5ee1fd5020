"""What a model can reach on a synthetic world: the oracle NE and AUC of its feature groups.

Per eval set, three oracles, each scored by NE and AUC of CTR and CTCVR on the source's eval examples:

- ``truth``: the true probabilities (the Bayes predictor; nothing can do better in expectation);
- ``no_history``: the true logits without their history terms (CTR: ``history_weight log(1 + m)``;
  CVR: ``history_weight (0.5 log(1 + m) + log(1 + n))``): what a model that never learned the user
  history can reach;
- ``no_item_bias``: the true CTR logit without the ad's item bias: what a model that never learned the
  item embeddings' per-item effect can reach.

An oracle without a term is recalibrated by a two-parameter logistic fit on the eval labels
(``sigmoid(a + b logit)``, CTR on every example, CVR on the clicked ones), so its NE is that of a
calibrated predictor without that feature group, not of a shifted one; AUC does not depend on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mxlab.data.synthetic import expit, history_matches, rank_auc
from mxlab.metrics import normalized_entropy

ORACLES = ("truth", "no_history", "no_item_bias")
ORACLE_METRICS = ("ctr.auc", "ctr.ne", "ctcvr.auc", "ctcvr.ne")


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def platt(labels: np.ndarray, logits: np.ndarray, iterations: int = 50) -> tuple[float, float]:
    """(a, b) of the logistic-regression fit sigmoid(a + b logits) to `labels` (Newton's method, each step
    halved until the log-likelihood does not fall)."""
    y = np.asarray(labels, dtype=np.float64)
    x = np.stack([np.ones_like(logits), np.asarray(logits, dtype=np.float64)], axis=1)

    def likelihood(w: np.ndarray) -> float:
        z = x @ w
        return float(np.sum(y * z - np.logaddexp(0.0, z)))

    w = np.array([0.0, 1.0])
    current = likelihood(w)
    for _ in range(iterations):
        p = expit(x @ w)
        hessian = (x * (p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, x.T @ (y - p))
        for _ in range(40):
            candidate = likelihood(w + step)
            if candidate >= current:
                break
            step = step / 2
        else:
            break
        w, current = w + step, candidate
        if np.abs(step).max() < 1e-10:
            break
    return float(w[0]), float(w[1])


def _terms(source: Any) -> dict[str, np.ndarray]:
    """Per eval example: labels, true logits, the CTR and CVR history terms and the ad's item bias."""
    world, weight = source.world, source.config.history_weight
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("click", "conv", "ctr", "cvr", "h_ctr", "h_cvr", "bias")}
    for chunk, ctr_history in source._eval_chunks(with_history_term=True):
        ad_items, ad_topics = chunk.sparse[:, 0].numpy(), chunk.sparse[:, 1].numpy()
        items, actions = chunk.history_items.numpy(), chunk.history_actions.numpy()
        m, n = history_matches(chunk.history_lengths().numpy(), world.topic_of(items), actions, ad_topics)
        columns["click"].append(chunk.click.numpy())
        columns["conv"].append(chunk.conversion.numpy())
        columns["ctr"].append(_logit(chunk.true_ctr.numpy()))
        columns["cvr"].append(_logit(chunk.true_cvr.numpy()))
        columns["h_ctr"].append(np.asarray(ctr_history, dtype=np.float64))
        columns["h_cvr"].append(weight * (0.5 * np.log1p(m) + np.log1p(n)))
        columns["bias"].append(world.item_bias[ad_items])
    return {key: np.concatenate(value).astype(np.float64) for key, value in columns.items()}


def oracle_metrics(source: Any, limit: int | None = None) -> dict[str, dict[str, float]]:
    """{oracle: {"ctr.auc", "ctr.ne", "ctcvr.auc", "ctcvr.ne"}} on `source`'s eval set (module docstring), or on
    its first `limit` examples (the held-out slice of `[train] eval_slice`; None or 0: all of them).

    Refuses (ValueError) a source without known truth (only the synthetic source has it) and a negative limit."""
    if not getattr(source.info, "has_truth", False) or not hasattr(source, "world"):
        raise ValueError(f"oracle metrics need a source with known truth (synthetic), not {source.info.name!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"oracle metrics: limit must be >= 0 (0 or None: the whole eval set); got {limit}")
    t = _terms(source)
    if limit:
        t = {key: value[:limit] for key, value in t.items()}
    click, clicked = t["click"], t["click"] > 0.5
    ctcvr_label = click * t["conv"]
    removed = {"truth": (0.0, 0.0), "no_history": (t["h_ctr"], t["h_cvr"]), "no_item_bias": (t["bias"], 0.0)}
    result = {}
    for name, (ctr_term, cvr_term) in removed.items():
        ctr_logit, cvr_logit = t["ctr"] - ctr_term, t["cvr"] - cvr_term
        if name != "truth":
            a, b = platt(click, ctr_logit)
            ctr_logit = a + b * ctr_logit
            if clicked.any() and not np.isscalar(cvr_term):
                a, b = platt(t["conv"][clicked], cvr_logit[clicked])
                cvr_logit = a + b * cvr_logit
        p_ctr, p_cvr = expit(ctr_logit), expit(cvr_logit)
        p_ctcvr = p_ctr * p_cvr
        result[name] = {
            "ctr.auc": rank_auc(click, p_ctr),
            "ctr.ne": normalized_entropy(click, p_ctr),
            "ctcvr.auc": rank_auc(ctcvr_label, p_ctcvr),
            "ctcvr.ne": normalized_entropy(ctcvr_label, p_ctcvr),
        }
    return result
