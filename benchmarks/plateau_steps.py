"""Steps to plateau of a study's baseline, from the held-out series of its runs (metrics.jsonl, `[train] eval_every`).

An exploration for the baseline issue (not imported by the library). The rule, fixed before reading the series:
a run has plateaued at the first evaluation from which its held-out NE (CTR and CTCVR, each) never again
improves on that evaluation's value by more than --tolerance (relative, default 0.05% of NE: the from-scratch
study's goal margin) within the run. Prints per seed the plateau step, the best NE and its gap to the
learnable world's Bayes NE (the truth oracle, mxlab.data.oracles, on the same held-out examples as the series:
the first `[train] eval_slice` of the eval set), AUC against the no-history oracle, and the
wall time per step from done.json; with --json writes the same.

    python3 benchmarks/plateau_steps.py reports/learnable-plateau --json reports/learnable-plateau/plateau.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mxlab.analysis.study import load_study
from mxlab.data import make_source
from mxlab.data.oracles import oracle_metrics
from mxlab.experiment.records import runs_for_report
from mxlab.experiment.worker import max_history_of
from mxlab.report.convergence import heldout_series

NE_METRICS = ("ctr.ne", "ctcvr.ne")


def plateau_step(points: list[tuple[int, dict[str, Any]]], metric: str, tolerance: float) -> int | None:
    """The first step whose NE no later evaluation beats by more than `tolerance` of it; None without values."""
    values = [(step, float(h[metric])) for step, h in points if h.get(metric) is not None]
    for i, (step, value) in enumerate(values):
        if all(later >= value * (1 - tolerance) for _, later in values[i + 1 :]):
            return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.0005)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    with runs_for_report(args.study) as runs_root:  # records-only runs unpacked where needed
        study = load_study(args.study, runs_root)
        series = heldout_series(study).get(study.baseline, {})
    held_out = int(study.spec.get("train", {}).get("eval_slice", 0) or 0)  # the series' examples: its oracles too
    source = make_source(dict(study.spec["data"]), max_history_of(study.spec["model"]))
    oracles = oracle_metrics(source, limit=held_out or None)
    result: dict[str, Any] = {
        "study": str(args.study),
        "tolerance": args.tolerance,
        "oracles_on_first_eval_examples": held_out or "all",
        "oracles": oracles,
        "seeds": {},
    }
    for seed, points in sorted(series.items()):
        status = study.runs[(study.baseline, seed)]
        row: dict[str, Any] = {"evaluations": len(points), "last_step": points[-1][0], "step_ms": status.step_ms}
        for metric in NE_METRICS:
            best = min(float(h[metric]) for _, h in points if h.get(metric) is not None)
            truth = oracles["truth"][metric]
            row[metric] = {
                "plateau_step": plateau_step(points, metric, args.tolerance),
                "best": best,
                "last": float(points[-1][1][metric]),
                "gap_to_bayes": (best - truth) / truth,
            }
        row["ctr.auc.last"] = float(points[-1][1].get("ctr.auc", float("nan")))
        row["ctr.auc.no_history_oracle"] = oracles["no_history"]["ctr.auc"]
        result["seeds"][seed] = row
        print(
            f"seed {seed}: "
            + "  ".join(
                f"{m} plateau at step {row[m]['plateau_step']}, best {row[m]['best']:.4f} "
                f"({row[m]['gap_to_bayes']:+.1%} of Bayes NE)"
                for m in NE_METRICS
            )
            + f"  CTR AUC {row['ctr.auc.last']:.4f} (no-history oracle {row['ctr.auc.no_history_oracle']:.4f})"
            + (f"  {status.step_ms:.1f} ms/step" if status.step_ms else "")
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
