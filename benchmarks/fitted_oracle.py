"""The fitted oracle: the true model's feature form, fitted by logistic regression on the train set.

An exploration for the baseline issue (not imported by the library). On the synthetic "learnable" preset a BF16
model of gem-mxfp8's size ends 11% (CTR) and 23% (CTCVR) above the Bayes NE (reports/benchmarks/plateau_steps
.h100.txt). Is the Bayes NE (the truth oracle, mxlab.data.oracles) reachable from the preset's train examples at
all? This fits a correctly specified logistic regression, with exactly the features the true logits are built
from (mxlab/data/synthetic.py), on the train set and scores it on the eval set:

- CTR logit: one-hot ad item, one-hot ad topic, one-hot user segment, the 4 dense features, position (linear),
  log(1 + m) with m = sum_j w(a_j) [topic_j == topic_ad]; fitted on every train example, label click;
- CVR logit (conversion given click): one-hot segment, one-hot topic, the 4 dense features, log(1 + m),
  log(1 + n) with n the purchases of the ad's topic in the history; fitted on the clicked train examples;
- CTCVR = p_ctr * p_cvr.

With --history-form share the history columns are replaced by what attention that normalizes its weights over
the history (softmax) sees of them: the ad topic's weighted share m / sum_j w(a_j) and the purchase share n / L, each
in a basis (s, sqrt(s), s^2 for m's share; s, sqrt(s) for n's), and an empty-history flag, but not the length: the
NE a length-blind history summary can reach. With --history-form mean they are what SiLU attention sees
(mxlab.nn.attention: silu(S) / n_keys, the mean over the history, not the sum): m / L and n / L in the same basis and
the empty-history flag, again without the length. With either, a row "length-blind Bayes" is added: not a fit but
the Bayes predictor that knows every true term except the history's length (`blind_bayes`), the floor of any model
whose history summary is a share or a mean. (The source draws each history already capped at max_history and
the true logits count over that capped history, so the cap hides nothing from a model that reads all of it.)

Two penalties (scikit-learn LogisticRegression, solver newton-cholesky, intercept unpenalized): "weak-l2"
(C = 1e4 on every coefficient: close to maximum likelihood) and "prior-l2" (the MAP fit under the world's own
priors: the one-hot columns scaled by the effect standard deviations of the generative process, item bias 0.3,
topic 0.5, segment 0.4, with C = 1, so each group's coefficients get the Gaussian prior the world drew them from;
the continuous coefficients get a N(0, 1) prior, negligible against the data). Neither looks at the eval set.

Prints the eval CTR and CTCVR NE and AUC of the fitted oracles next to the truth and no_history oracles
(mxlab.data.oracles.oracle_metrics, same eval set, same NE and AUC functions), each NE's gap to the Bayes NE
((fitted - truth) / truth, as benchmarks/plateau_steps.py), the same on the first 100k eval examples (the
held-out slice of experiments/learnable-plateau.toml), the recovered coefficients against the true ones, and
the time to generate and to fit. With --json writes the same.

    python3 benchmarks/fitted_oracle.py [--train-examples N ...] [--json fitted_oracle.json]

Several --train-examples give one fit each and a closing table of the gaps by train size. On 2 CPU cores
1M, 4M and 16M train examples take 587 s in all (16M: 71 s to generate, about 3 min per CTR fit, 7.5 GB peak).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

from mxlab.data import make_source
from mxlab.data.oracles import oracle_metrics
from mxlab.data.synthetic import (
    ACTION_WEIGHTS,
    DENSE_CTR_WEIGHTS,
    DENSE_CVR_WEIGHTS,
    ITEM_BIAS_STD,
    POSITION_SLOPE,
    SEGMENT_EFFECT_STD,
    TOPIC_EFFECT_STD,
    expit,
    history_matches,
    rank_auc,
)
from mxlab.metrics import normalized_entropy

MAX_HISTORY = 128  # experiments/learnable-plateau.toml
PLATEAU_EVAL_SLICE = 100_000  # its [train] eval_slice
SOLVER = "newton-cholesky"  # exact Newton steps on the 2100-column design: converges in tens of iterations
MAX_ITERATIONS = 200  # per fit; a fit that reaches it has not converged
# The history columns of each fit: "count", the true form (log(1 + m), log(1 + n)); "share", what attention that
# normalizes its weights over the history (softmax) sees of it: the weighted share of the ad's topic m / sum_j w(a_j)
# and the purchase share n / L in a flexible basis, plus an empty-history flag, but not the history's length.
HISTORY_FORMS = {
    "count": (("lm",), ("lm", "ln")),
    "share": (("ms", "ms_sqrt", "ms_sq", "empty"), ("ms", "ms_sqrt", "ms_sq", "ns", "ns_sqrt", "empty")),
    # what SiLU attention sees (silu(S) / n_keys): the mean over the history, m / L and n / L, not the length
    "mean": (("mm", "mm_sqrt", "mm_sq", "empty"), ("mm", "mm_sqrt", "mm_sq", "ns", "ns_sqrt", "empty")),
}
# The length-blind Bayes predictor (history forms share and mean): quantile bins of the ad topic's share (or mean)
# over the non-empty histories, times bins of the purchase share (zero, then quantiles of the positive ones), one more
# bin for the empty history; in each bin the true history terms of up to BLIND_SAMPLE train examples stand for their
# conditional distribution given what a length-blind summary sees.
BLIND_BINS = (48, 8)
BLIND_SAMPLE = 1024
PENALTIES = {
    # name: (C, scale of the item / topic / segment one-hot columns)
    "weak-l2": (1e4, (1.0, 1.0, 1.0)),
    "prior-l2": (1.0, (ITEM_BIAS_STD, TOPIC_EFFECT_STD, SEGMENT_EFFECT_STD)),
}


def features(batches: Any, n_topics: int) -> dict[str, np.ndarray]:
    """Per example: ad item, topic, segment, position, dense, log(1 + m), log(1 + n), the labels and the truth."""
    columns: dict[str, list[np.ndarray]] = {
        k: []
        for k in ("item", "topic", "segment", "position", "dense", "lm", "ln", "ms", "mm", "ns", "empty")
        + ("click", "conv", "ctr", "cvr")
    }
    weights = np.asarray(ACTION_WEIGHTS)
    for batch in batches:
        sparse = batch.sparse.numpy()
        lengths = batch.history_lengths().numpy()
        items, actions = batch.history_items.numpy(), batch.history_actions.numpy()
        m, n = history_matches(lengths, items % n_topics, actions, sparse[:, 1])
        total = np.bincount(
            np.repeat(np.arange(lengths.size), lengths), weights=weights[actions], minlength=lengths.size
        )
        columns["ms"].append((m / np.maximum(total, 1e-12)).astype(np.float32))
        columns["mm"].append((m / np.maximum(lengths, 1)).astype(np.float32))
        columns["ns"].append((n / np.maximum(lengths, 1)).astype(np.float32))
        columns["empty"].append((lengths == 0).astype(np.float32))
        columns["item"].append(sparse[:, 0].astype(np.int32))
        columns["topic"].append(sparse[:, 1].astype(np.int32))
        columns["segment"].append(sparse[:, 2].astype(np.int32))
        columns["position"].append(sparse[:, 3].astype(np.float32))
        columns["dense"].append(batch.dense.numpy())
        columns["lm"].append(np.log1p(m).astype(np.float32))
        columns["ln"].append(np.log1p(n).astype(np.float32))
        columns["click"].append(batch.click.numpy() > 0.5)
        columns["conv"].append(batch.conversion.numpy() > 0.5)
        columns["ctr"].append(batch.true_ctr.numpy())
        columns["cvr"].append(batch.true_cvr.numpy())
    result = {key: np.concatenate(value) for key, value in columns.items()}
    for share in ("ms", "mm", "ns"):
        result[f"{share}_sqrt"], result[f"{share}_sq"] = np.sqrt(result[share]), result[share] ** 2
    return result


def design(
    f: dict[str, np.ndarray], rows: np.ndarray | None, onehots: list[tuple[str, int, float]], dense: list[np.ndarray]
) -> sp.csr_matrix:
    """CSR matrix of the given one-hot fields (name, cardinality, column value) then continuous columns."""
    take = (lambda a: a) if rows is None else (lambda a: a[rows])
    n = take(f["item"]).shape[0]
    index_columns, value_columns, offset = [], [], 0
    for name, cardinality, value in onehots:
        index_columns.append(take(f[name]).astype(np.int32) + offset)
        value_columns.append(np.full(n, value, dtype=np.float64))
        offset += cardinality
    for column in dense:
        index_columns.append(np.full(n, offset, dtype=np.int32))
        value_columns.append(take(column).astype(np.float64))
        offset += 1
    width = len(index_columns)
    indices = np.stack(index_columns, axis=1).ravel()
    data = np.stack(value_columns, axis=1).ravel()
    indptr = np.arange(0, n * width + 1, width, dtype=np.int64)
    return sp.csr_matrix((data, indices, indptr), shape=(n, offset))


def ctr_design(
    f: dict[str, np.ndarray], sizes: tuple[int, int, int], scales: tuple[float, float, float], form: str = "count"
) -> sp.csr_matrix:
    n_items, n_topics, n_segments = sizes
    onehots = [("item", n_items, scales[0]), ("topic", n_topics, scales[1]), ("segment", n_segments, scales[2])]
    dense = [f["dense"][:, j] for j in range(4)] + [f["position"]] + [f[name] for name in HISTORY_FORMS[form][0]]
    return design(f, None, onehots, dense)


def cvr_design(
    f: dict[str, np.ndarray],
    rows: np.ndarray | None,
    sizes: tuple[int, int, int],
    scales: tuple[float, float, float],
    form: str = "count",
) -> sp.csr_matrix:
    _, n_topics, n_segments = sizes
    onehots = [("topic", n_topics, scales[1]), ("segment", n_segments, scales[2])]
    dense = [f["dense"][:, j] for j in range(4)] + [f[name] for name in HISTORY_FORMS[form][1]]
    return design(f, rows, onehots, dense)


def blind_bins(f: dict[str, np.ndarray], column: str, edges: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Bin per example: 0 for an empty history, else 1 + the share bin x BLIND_BINS[1] + the purchase share bin."""
    share_bin = np.clip(np.searchsorted(edges[0], f[column], side="right") - 1, 0, BLIND_BINS[0] - 1)
    purchase_bin = np.where(
        f["ns"] > 0, 1 + np.clip(np.searchsorted(edges[1], f["ns"], side="right") - 1, 0, BLIND_BINS[1] - 2), 0
    )
    return np.where(f["empty"] > 0, 0, 1 + share_bin * BLIND_BINS[1] + purchase_bin)


def blind_bayes(
    train: dict[str, np.ndarray], evaluation: dict[str, np.ndarray], form: str, weight: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(p_ctr, p_cvr) of the Bayes predictor that knows every true term except the history's length: the true
    non-history logits of each eval example, and the expectation of the true probabilities over the history
    terms (log(1 + m), log(1 + n)) of the train examples in the same length-blind bin (`blind_bins`: the ad
    topic's share m / sum_j w(a_j) for form share, the mean m / L for form mean, and the purchase share n / L).
    p_cvr is E[ctr cvr] / E[ctr], so that p_ctr * p_cvr is the expected CTCVR. An oracle, not a fit: it bounds
    what any model whose history summary is length-blind reaches."""
    column = {"share": "ms", "mean": "mm"}[form]
    rng = np.random.default_rng(seed)
    filled = train["empty"] == 0
    positive = train["ns"][filled & (train["ns"] > 0)]
    edges = (
        np.quantile(train[column][filled], np.linspace(0.0, 1.0, BLIND_BINS[0] + 1)),
        np.quantile(positive, np.linspace(0.0, 1.0, BLIND_BINS[1])),
    )
    train_bin, eval_bin = blind_bins(train, column, edges), blind_bins(evaluation, column, edges)
    ctr, cvr = evaluation["ctr"].astype(np.float64), evaluation["cvr"].astype(np.float64)
    lm, ln = evaluation["lm"].astype(np.float64), evaluation["ln"].astype(np.float64)
    ctr_rest = np.log(ctr) - np.log1p(-ctr) - weight * lm
    cvr_rest = np.log(cvr) - np.log1p(-cvr) - weight * (0.5 * lm + ln)
    p_ctr, p_ctcvr = np.empty_like(ctr), np.empty_like(ctr)
    order = np.argsort(train_bin, kind="stable")
    starts = np.searchsorted(train_bin[order], np.arange(train_bin.max() + 2))
    for b in np.unique(eval_bin):
        members = order[starts[b] : starts[b + 1]] if b <= train_bin.max() else order[:0]
        if members.size == 0:  # a bin no train example fell in: the nearest filled one's terms
            members = order[starts[max(0, b - 1)] : starts[b]]
        if members.size > BLIND_SAMPLE:
            members = rng.choice(members, BLIND_SAMPLE, replace=False)
        h_ctr = weight * train["lm"][members].astype(np.float64)
        h_cvr = weight * (0.5 * train["lm"][members] + train["ln"][members]).astype(np.float64)
        rows = np.flatnonzero(eval_bin == b)
        for chunk in np.array_split(rows, max(1, rows.size // 4096)):
            click = expit(ctr_rest[chunk, None] + h_ctr[None, :])
            p_ctr[chunk] = click.mean(axis=1)
            p_ctcvr[chunk] = (click * expit(cvr_rest[chunk, None] + h_cvr[None, :])).mean(axis=1)
    return p_ctr, p_ctcvr / p_ctr


def fit(x: sp.csr_matrix, y: np.ndarray, c: float) -> tuple[LogisticRegression, float]:
    start = time.perf_counter()
    model = LogisticRegression(C=c, solver=SOLVER, max_iter=MAX_ITERATIONS, tol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # reported as the iteration count reaching the cap
        model.fit(x, y)
    return model, time.perf_counter() - start


def scores(click: np.ndarray, conv: np.ndarray, p_ctr: np.ndarray, p_cvr: np.ndarray) -> dict[str, float]:
    """CTR and CTCVR AUC and NE, as mxlab.data.oracles.oracle_metrics scores them."""
    click = click.astype(np.float64)
    ctcvr = click * conv.astype(np.float64)
    p_ctcvr = p_ctr * p_cvr
    return {
        "ctr.auc": rank_auc(click, p_ctr),
        "ctr.ne": normalized_entropy(click, p_ctr),
        "ctcvr.auc": rank_auc(ctcvr, p_ctcvr),
        "ctcvr.ne": normalized_entropy(ctcvr, p_ctcvr),
    }


def run(preset: str, train_examples: int | None, penalties: list[str], form: str = "count") -> dict[str, Any]:
    """Generate, fit and score at one train size; prints its tables and returns them."""
    table: dict[str, Any] = {"source": "synthetic", "preset": preset}
    if train_examples is not None:
        table["train_examples"] = train_examples
    source = make_source(table, MAX_HISTORY)
    config, world = source.config, source.world
    sizes = (config.n_items, config.n_topics, config.n_segments)
    result: dict[str, Any] = {
        "preset": preset,
        "train_examples": source.n_train,
        "eval_examples": source.n_eval,
        "max_history": MAX_HISTORY,
        "history_form": form,
        "timings_s": {},
    }

    start = time.perf_counter()
    train = features(source.train_batches(4096, 0, 0), config.n_topics)
    result["timings_s"]["generate_train"] = time.perf_counter() - start
    start = time.perf_counter()
    evaluation = features(source.eval_batches(4096), config.n_topics)
    oracles = oracle_metrics(source)
    result["timings_s"]["generate_eval_and_oracles"] = time.perf_counter() - start
    clicked = np.flatnonzero(train["click"])
    result["train_clicks"] = int(clicked.size)
    result["train_conversions"] = int(train["conv"].sum())
    print(
        f"preset {preset}: {source.n_train:,} train examples ({clicked.size:,} clicks, "
        f"{result['train_conversions']:,} conversions), {source.n_eval:,} eval; max_history {MAX_HISTORY}; "
        f"generated in {result['timings_s']['generate_train']:.0f} s (train), "
        f"{result['timings_s']['generate_eval_and_oracles']:.0f} s (eval + oracles)"
    )

    rows: dict[str, dict[str, float]] = {name: oracles[name] for name in ("truth", "no_history")}
    eval_clicked = evaluation["click"]
    true_item_effect = world.item_bias + world.topic_ctr[np.arange(config.n_items) % config.n_topics]
    result["fits"] = {}
    slice_ = slice(0, PLATEAU_EVAL_SLICE)
    for name in penalties:
        c, scales = PENALTIES[name]
        ctr_model, ctr_seconds = fit(ctr_design(train, sizes, scales, form), train["click"], c)
        cvr_model, cvr_seconds = fit(cvr_design(train, clicked, sizes, scales, form), train["conv"][clicked], c)
        p_ctr = ctr_model.predict_proba(ctr_design(evaluation, sizes, scales, form))[:, 1]
        p_cvr = cvr_model.predict_proba(cvr_design(evaluation, None, sizes, scales, form))[:, 1]
        rows[f"fitted {name}"] = scores(evaluation["click"], evaluation["conv"], p_ctr, p_cvr)
        w_ctr, w_cvr = ctr_model.coef_[0], cvr_model.coef_[0]
        k, n_items, n_segments = config.n_topics, config.n_items, config.n_segments
        item_effect = w_ctr[:n_items] * scales[0] + w_ctr[n_items + np.arange(n_items) % k] * scales[1]
        error = (item_effect - item_effect.mean()) - (true_item_effect - true_item_effect.mean())
        tail_ctr, tail_cvr = w_ctr[n_items + k + n_segments :], w_cvr[k + n_segments :]
        result["fits"][name] = {
            "C": c,
            "onehot_scales": scales,
            "ctr_fit_s": ctr_seconds,
            "cvr_fit_s": cvr_seconds,
            "ctr_iterations": int(ctr_model.n_iter_[0]),
            "cvr_iterations": int(cvr_model.n_iter_[0]),
            "eval": rows[f"fitted {name}"],
            "eval_first_100k": scores(
                evaluation["click"][slice_], evaluation["conv"][slice_], p_ctr[slice_], p_cvr[slice_]
            ),
            "ctr_coefficients": {
                "dense": tail_ctr[:4].tolist(),
                "position": float(tail_ctr[4]),
                **dict(zip(HISTORY_FORMS[form][0], tail_ctr[5:].tolist())),
                "item_effect_rmse": float(np.sqrt(np.mean(error**2))),
            },
            "cvr_coefficients": {
                "dense": tail_cvr[:4].tolist(),
                **dict(zip(HISTORY_FORMS[form][1], tail_cvr[4:].tolist())),
            },
            "eval_mean_p_ctr": float(p_ctr.mean()),
        }
    if form != "count":
        start = time.perf_counter()
        p_ctr, p_cvr = blind_bayes(train, evaluation, form, config.history_weight)
        rows["length-blind Bayes"] = scores(evaluation["click"], evaluation["conv"], p_ctr, p_cvr)
        result["length_blind_bayes"] = {
            "eval": rows["length-blind Bayes"],
            "eval_first_100k": scores(
                evaluation["click"][slice_], evaluation["conv"][slice_], p_ctr[slice_], p_cvr[slice_]
            ),
            "seconds": time.perf_counter() - start,
        }
    truth_slice = scores(
        evaluation["click"][slice_],
        evaluation["conv"][slice_],
        evaluation["ctr"][slice_].astype(np.float64),
        evaluation["cvr"][slice_].astype(np.float64),
    )
    result["oracles"] = oracles
    result["truth_first_100k"] = truth_slice
    result["eval_clicks"] = int(eval_clicked.sum())

    truth = rows["truth"]
    print(f"eval set ({source.n_eval:,} examples, {result['eval_clicks']:,} clicks); gap = (NE - Bayes NE) / Bayes NE")
    print(f"{'predictor':<20} {'CTR NE':>8} {'gap':>7} {'CTR AUC':>8} {'CTCVR NE':>9} {'gap':>7} {'CTCVR AUC':>10}")
    for name, row in rows.items():
        gaps = [(row[m] - truth[m]) / truth[m] for m in ("ctr.ne", "ctcvr.ne")]
        print(
            f"{name:<20} {row['ctr.ne']:8.4f} {gaps[0]:+7.1%} {row['ctr.auc']:8.4f} "
            f"{row['ctcvr.ne']:9.4f} {gaps[1]:+7.1%} {row['ctcvr.auc']:10.4f}"
        )
    print(f"first {PLATEAU_EVAL_SLICE:,} eval examples (the plateau study's held-out slice):")
    slice_rows = [("truth", truth_slice)] + [(f"fitted {n}", r["eval_first_100k"]) for n, r in result["fits"].items()]
    if "length_blind_bayes" in result:
        slice_rows.append(("length-blind Bayes", result["length_blind_bayes"]["eval_first_100k"]))
    for name, row in slice_rows:
        gaps = [(row[m] - truth_slice[m]) / truth_slice[m] for m in ("ctr.ne", "ctcvr.ne")]
        print(
            f"{name:<20} {row['ctr.ne']:8.4f} {gaps[0]:+7.1%} {row['ctr.auc']:8.4f} "
            f"{row['ctcvr.ne']:9.4f} {gaps[1]:+7.1%} {row['ctcvr.auc']:10.4f}"
        )
    print(
        f"true coefficients: CTR dense {list(DENSE_CTR_WEIGHTS)}, position {POSITION_SLOPE}, log1p(m) "
        f"{config.history_weight}; CVR dense {list(DENSE_CVR_WEIGHTS)}, log1p(m) {0.5 * config.history_weight}, "
        f"log1p(n) {config.history_weight}; item effect (bias + topic) std "
        f"{np.std(true_item_effect - true_item_effect.mean()):.3f}"
    )
    for name, fitted in result["fits"].items():
        ctr, cvr = fitted["ctr_coefficients"], fitted["cvr_coefficients"]
        ctr_history = ", ".join(f"{column} {ctr[column]:.3f}" for column in HISTORY_FORMS[form][0])
        cvr_history = ", ".join(f"{column} {cvr[column]:.3f}" for column in HISTORY_FORMS[form][1])
        print(
            f"{name} (C {fitted['C']:g}): CTR dense {np.round(ctr['dense'], 3).tolist()}, "
            f"position {ctr['position']:.3f}, "
            f"{ctr_history}, item effect RMSE {ctr['item_effect_rmse']:.3f}; CVR dense "
            f"{np.round(cvr['dense'], 3).tolist()}, {cvr_history}; "
            f"fit {fitted['ctr_fit_s']:.0f} s CTR ({fitted['ctr_iterations']} {SOLVER} iterations of at most "
            f"{MAX_ITERATIONS}), {fitted['cvr_fit_s']:.1f} s CVR ({fitted['cvr_iterations']})"
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="learnable")
    parser.add_argument(
        "--train-examples",
        type=int,
        nargs="+",
        default=[None],
        help="override the preset's train_examples (several: one fit each)",
    )
    parser.add_argument("--penalties", default=",".join(PENALTIES), help=f"comma-separated, of {', '.join(PENALTIES)}")
    parser.add_argument(
        "--history-form",
        choices=sorted(HISTORY_FORMS),
        default="count",
        help="count: the true history terms log(1 + m), log(1 + n); share: only what softmax attention over the "
        "history sees of them (the ad topic's weighted share, the purchase share, an empty-history flag); mean: only "
        "what SiLU attention (silu / n_keys) sees (m / L, n / L, an empty-history flag)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    runs = []
    for train_examples in args.train_examples:
        runs.append(run(args.preset, train_examples, args.penalties.split(","), args.history_form))
        print()
    if len(runs) > 1:
        print("gap to the Bayes NE by train size (full eval set)")
        print(
            f"{'train examples':>15} {'clicks':>7} "
            + " ".join(f"{n + ' CTR':>16} {n + ' CTCVR':>18}" for n in runs[0]["fits"])
        )
        for r in runs:
            truth = r["oracles"]["truth"]
            cells = []
            for fitted in r["fits"].values():
                for metric, width in (("ctr.ne", 16), ("ctcvr.ne", 18)):
                    cells.append(f"{(fitted['eval'][metric] - truth[metric]) / truth[metric]:>+{width}.1%}")
            print(f"{r['train_examples']:>15,} {r['train_clicks']:>7,} " + " ".join(cells))
    if args.json:
        args.json.write_text(json.dumps(runs if len(runs) > 1 else runs[0], indent=1))


if __name__ == "__main__":
    main()
