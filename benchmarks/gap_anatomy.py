"""Where a trained model's NE gap to the Bayes NE comes from, from its stored eval predictions on synthetic data.

An exploration for the baseline issue (not imported by the library). A study's records hold each run's eval
predictions (records/ARM/seedN.npz: p_ctr, p_cvr for every eval example, in eval order); the synthetic source
regenerates the same eval set with the true probabilities and every feature the truth is built from
(mxlab/data/synthetic.py). Because the truth is known, the gap needs no labels: the expected excess log loss of a
prediction p over the truth t is KL(t || p), so the expected gap to the Bayes NE is mean KL / mean H(t) (binary
entropy), free of the label noise of the 4,000 eval clicks. This prints, per run:

- the label NE gap (as benchmarks/plateau_steps.py, on the whole eval set) and the expected (KL) gap, CTR and CTCVR;
- the KL gap by history length L and by the true history term m (share of the excess in each bin, and the mean
  logit error logit p - logit t there): what the model gets wrong where;
- cross-fitted corrections: the CTR and CTCVR logits of the model plus a per-group offset (the KL-optimal offset of
  each group, fitted on the odd eval examples, scored on the even ones), for groups of what the model sees (the
  ad topic's weighted share of the history, the purchase share), the same crossed with L (the length both
  attentions lose, mxlab.nn.attention), the true history terms (m, n), the ad item, and the non-history terms.
  The share of the gap a correction removes is the share that group's information explains.

    python3 benchmarks/gap_anatomy.py reports/learnable-silu [reports/learnable-plateau ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from mxlab.data import make_source
from mxlab.data.synthetic import ACTION_WEIGHTS, expit, history_matches
from mxlab.experiment.worker import max_history_of
from mxlab.metrics import normalized_entropy

EPS = 1e-7
LENGTH_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 129)  # L bins: 0, [1, 2), [2, 4), ..., [64, 128), exactly 128
M_EDGES = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 1e9)  # bins of m (weighted matching count)
SHARE_BINS = 32  # quantile bins of the ad topic's weighted share among non-empty histories
NEWTON_STEPS = 40  # damped: each step at most one logit, so a group far from its optimum does not overshoot


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def kl(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """KL(Bernoulli(t) || Bernoulli(p)) per example: the expected excess log loss of p over t."""
    t, p = np.clip(t, EPS, 1 - EPS), np.clip(p, EPS, 1 - EPS)
    return t * np.log(t / p) + (1 - t) * np.log((1 - t) / (1 - p))


def entropy(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, EPS, 1 - EPS)
    return -(t * np.log(t) + (1 - t) * np.log1p(-t))


def eval_features(source: Any) -> dict[str, np.ndarray]:
    """Per eval example, in eval order: L, m, n, the weighted share, the purchase share, ad item, truths, labels."""
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("L", "m", "n", "total", "item", "ctr", "cvr", "click")}
    columns["conv"] = []
    weights = np.asarray(ACTION_WEIGHTS)
    for batch in source.eval_batches(4096):
        lengths = batch.history_lengths().numpy()
        items, actions = batch.history_items.numpy(), batch.history_actions.numpy()
        m, n = history_matches(lengths, items % source.config.n_topics, actions, batch.sparse[:, 1].numpy())
        columns["total"].append(
            np.bincount(np.repeat(np.arange(lengths.size), lengths), weights=weights[actions], minlength=lengths.size)
        )
        columns["L"].append(lengths)
        columns["m"].append(m)
        columns["n"].append(n)
        columns["item"].append(batch.sparse[:, 0].numpy())
        columns["ctr"].append(batch.true_ctr.numpy().astype(np.float64))
        columns["cvr"].append(batch.true_cvr.numpy().astype(np.float64))
        columns["click"].append(batch.click.numpy().astype(np.float64))
        columns["conv"].append(batch.conversion.numpy().astype(np.float64))
    f = {key: np.concatenate(value) for key, value in columns.items()}
    f["share"] = f["m"] / np.maximum(f["total"], 1e-12)
    f["purchase_share"] = f["n"] / np.maximum(f["L"], 1)
    return f


def groups(f: dict[str, np.ndarray], truth_ctr_rest: np.ndarray) -> dict[str, np.ndarray]:
    """Group ids per example for each correction (0 = the empty history where the group depends on the history)."""
    empty = f["L"] == 0
    filled = ~empty
    share_edges = np.quantile(f["share"][filled], np.linspace(0, 1, SHARE_BINS + 1))
    share_bin = np.where(
        empty, 0, 1 + np.clip(np.searchsorted(share_edges, f["share"], "right") - 1, 0, SHARE_BINS - 1)
    )
    positive = f["purchase_share"][f["purchase_share"] > 0]
    purchase_edges = np.quantile(positive, np.linspace(0, 1, 8))
    purchase_bin = np.where(
        f["purchase_share"] > 0, 1 + np.clip(np.searchsorted(purchase_edges, f["purchase_share"], "right") - 1, 0, 6), 0
    )
    length_bin = np.searchsorted(LENGTH_EDGES, f["L"], "right")
    m_bin = np.searchsorted(M_EDGES, f["m"], "right")
    n_bin = np.minimum(f["n"], 8).astype(np.int64)
    rest_edges = np.quantile(truth_ctr_rest, np.linspace(0, 1, 33))
    rest_bin = np.clip(np.searchsorted(rest_edges, truth_ctr_rest, "right") - 1, 0, 31)
    seen = share_bin * 8 + purchase_bin
    return {
        "seen: share x purchase share": seen,
        "seen x length": seen * 16 + length_bin,
        "length": length_bin,
        "true history terms (m, n)": m_bin * 16 + n_bin,
        "true history terms x length": (m_bin * 16 + n_bin) * 16 + length_bin,
        "ad item": f["item"],
        "non-history logit (32 bins)": rest_bin,
    }


def offsets(group: np.ndarray, t: np.ndarray, base_logit: np.ndarray, fit_rows: np.ndarray) -> np.ndarray:
    """Per-group offsets minimizing the KL of sigmoid(base_logit + offset) to t over `fit_rows` (Newton steps)."""
    size = int(group.max()) + 1
    g, tt, z = group[fit_rows], t[fit_rows], base_logit[fit_rows]
    offset = np.zeros(size)
    for _ in range(NEWTON_STEPS):
        p = expit(z + offset[g])
        gradient = np.bincount(g, weights=p - tt, minlength=size)
        hessian = np.bincount(g, weights=p * (1 - p), minlength=size) + 1e-9
        offset -= np.clip(gradient / hessian, -1.0, 1.0)
    return offset


def anatomy(run: Path, f: dict[str, np.ndarray], max_rows: int) -> dict[str, Any]:
    data = np.load(run)
    p_ctr = data["p_ctr"].astype(np.float64)[:max_rows]
    p_cvr = data["p_cvr"].astype(np.float64)[:max_rows]
    t_ctr, t_cvr = f["ctr"][:max_rows], f["cvr"][:max_rows]
    tasks = {"ctr": (t_ctr, p_ctr), "ctcvr": (t_ctr * t_cvr, p_ctr * p_cvr)}
    click, conv = f["click"][:max_rows], f["conv"][:max_rows]
    labels = {"ctr": click, "ctcvr": click * conv}
    result: dict[str, Any] = {"run": str(run)}
    for task, (t, p) in tasks.items():
        truth_ne = normalized_entropy(labels[task], t)
        result[f"{task}.label_gap"] = normalized_entropy(labels[task], p) / truth_ne - 1
        result[f"{task}.expected_gap"] = float(kl(t, p).mean() / entropy(t).mean())
    rest = logit(t_ctr) - np.log1p(f["m"][:max_rows])
    # the model's CTR logit against the true logit's two parts: slope 1 on both is the truth's form
    design = np.stack([np.ones(max_rows), np.log1p(f["m"][:max_rows]), rest], axis=1)
    coefficients = np.linalg.lstsq(design, logit(p_ctr), rcond=None)[0]
    result["ctr_logit_slopes"] = {"history_term": float(coefficients[1]), "non_history": float(coefficients[2])}
    group_ids = {name: ids[:max_rows] for name, ids in groups(f, rest).items()}
    fit_rows, score_rows = np.arange(0, max_rows, 2), np.arange(1, max_rows, 2)
    result["by_length"], result["by_m"], result["corrections"] = {}, {}, {}
    for task, (t, p) in tasks.items():
        excess, total = kl(t, p), kl(t, p).sum()
        error = logit(p) - logit(t)
        for key, bins, edges in (
            ("by_length", np.searchsorted(LENGTH_EDGES, f["L"][:max_rows], "right"), LENGTH_EDGES),
            ("by_m", np.searchsorted(M_EDGES, f["m"][:max_rows], "right"), M_EDGES),
        ):
            rows = []
            for b in np.unique(bins):
                members = bins == b
                rows.append(
                    {
                        "bin": b,
                        "low": edges[b - 1] if b >= 1 else 0,
                        "examples": int(members.sum()),
                        "share_of_excess": float(excess[members].sum() / total),
                        "mean_logit_error": float(error[members].mean()),
                    }
                )
            result[key][task] = rows
        base_gap = excess[score_rows].mean() / entropy(t[score_rows]).mean()
        result["corrections"][task] = {"none": float(base_gap)}
        for name, ids in group_ids.items():
            corrected = expit(logit(p) + offsets(ids, t, logit(p), fit_rows)[ids])
            gap = kl(t[score_rows], corrected[score_rows]).mean() / entropy(t[score_rows]).mean()
            result["corrections"][task][name] = float(gap)
    return result


def report(result: dict[str, Any]) -> None:
    print(f"{result['run']}")
    print(
        f"  gap to the Bayes NE: labels CTR {result['ctr.label_gap']:+.1%}, CTCVR {result['ctcvr.label_gap']:+.1%}; "
        f"expected (KL) CTR {result['ctr.expected_gap']:+.1%}, CTCVR {result['ctcvr.expected_gap']:+.1%}"
    )
    slopes = result["ctr_logit_slopes"]
    print(
        f"  model CTR logit ~ a + b log(1 + m) + c (true non-history logit): b {slopes['history_term']:.3f}, "
        f"c {slopes['non_history']:.3f} (the truth: 1, 1)"
    )
    for key, title in (("by_length", "history length L from"), ("by_m", "m (weighted matches) from")):
        print(f"  by {title}: examples, share of the KL excess CTR / CTCVR, mean logit error CTR / CTCVR")
        for ctr_row, ctcvr_row in zip(result[key]["ctr"], result[key]["ctcvr"]):
            print(
                f"    {ctr_row['low']:>6g} {ctr_row['examples']:>8,} {ctr_row['share_of_excess']:7.1%} "
                f"{ctcvr_row['share_of_excess']:7.1%} {ctr_row['mean_logit_error']:+7.3f} "
                f"{ctcvr_row['mean_logit_error']:+7.3f}"
            )
    print(
        "  cross-fitted per-group logit offsets (fit on odd examples, expected gap on even): gap after, share removed"
    )
    base = result["corrections"]["ctr"]["none"], result["corrections"]["ctcvr"]["none"]
    for name in result["corrections"]["ctr"]:
        ctr, ctcvr = result["corrections"]["ctr"][name], result["corrections"]["ctcvr"][name]
        print(
            f"    {name:<32} CTR {ctr:+6.1%} ({1 - ctr / base[0]:5.0%} removed)   "
            f"CTCVR {ctcvr:+6.1%} ({1 - ctcvr / base[1]:5.0%} removed)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", type=Path, nargs="+", help="study folders with records/ARM/seedN.npz")
    parser.add_argument("--arm", default="bf16")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results, cached = [], {}
    for study in args.studies:
        spec = json.loads((study / "study.json").read_text())
        key = json.dumps([spec["data"], max_history_of(spec["model"])], sort_keys=True)
        if key not in cached:
            source = make_source(dict(spec["data"]), max_history_of(spec["model"]))
            cached[key] = eval_features(source)
        f = cached[key]
        stored = np.load(study / "records" / "eval-set.npz")
        rows = stored["true_ctr"].shape[0]
        if not np.array_equal(stored["true_ctr"], f["ctr"][:rows].astype(np.float32)):
            raise SystemExit(f"{study}: the regenerated eval set differs from the stored one")
        print(
            f"{study}: model {spec['model'].get('activation', 'softmax')} attention; eval set of {rows:,} regenerated"
        )
        for run in sorted((study / "records" / args.arm).glob("seed*.npz")):
            results.append(anatomy(run, f, rows))
            report(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=int))


if __name__ == "__main__":
    main()
