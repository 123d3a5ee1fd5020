"""How often does a spec's BF16 fork warm-up end stuck, under the training recipe's defaults and under the one before?

An exploration for the baseline issue (not imported by the library). It trains the spec's fork warm-ups
(recipe train.fork_from, train.fork_steps steps each, full eval set at the end) for --seeds seeds under each
variant, all runs of a variant at once on the local executor (MPS with --mps), and prints per warm-up the
eval CTR and CTCVR AUC and NE, the CTR calibration (sum p / sum y), and against the source's oracles
(mxlab.data.oracles): whether CTR AUC is at or below the no-history oracle's ("stuck": the history was
never learned) and the NE gap to the Bayes NE of the true probabilities, (NE - NE_truth) / NE_truth.

Variants: "new" (the spec with train.optimizer = adamw and every other training-recipe key at its default)
and "old" (the recipe before the defaults: adam, no weight decay, dense embeddings, no rate warm-up, no
clipping, the model's own output biases). GPU training is not bit-reproducible: read counts, not seeds.

    python3 benchmarks/baseline_check.py --spec experiments/gem-mxfp8.toml --seeds 16 --mps \\
        --runs-per-device 16 --out ~/baseline --json $OUT/baseline_check.json
    python3 benchmarks/baseline_check.py --device cpu --seeds 2 --runs-per-device 2 --set train.fork_steps=4 \\
        --set train.eval_every=0 --set data.train_examples=20000 --set data.eval_examples=4000 \\
        --out /tmp/baseline   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from mxlab import metrics
from mxlab.data.oracles import oracle_metrics
from mxlab.experiment.evaluate import judged_metrics
from mxlab.experiment.executors.local import LocalExecutor
from mxlab.experiment.executors.mps import mps_daemon
from mxlab.experiment.runner import resolve_devices, run_jobs
from mxlab.experiment.spec import load_spec
from mxlab.experiment.study_jobs import fork_jobs
from mxlab.experiment.worker import make_data_source

VARIANTS: dict[str, list[str]] = {
    "new": ["train.optimizer=adamw"],
    "old": [
        "train.optimizer=adam",
        "train.weight_decay=0",
        "train.embedding_optimizer=dense",
        "train.warmup_share=0",
        "train.clip_grad_norm=inf",
        "train.output_bias=model",
    ],
}


def summarize(runs: dict[int, dict[str, float]], oracles: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Counts and spreads of one variant's finished warm-ups."""
    done = {seed: r for seed, r in runs.items() if "ctr.auc" in r}
    stuck = sorted(seed for seed, r in done.items() if r["ctr.auc"] <= oracles["no_history"]["ctr.auc"])
    gaps = {m: [r[f"{m}.gap"] for r in done.values()] for m in ("ctr.ne", "ctcvr.ne")}
    cal = [r["ctr.calibration"] for r in done.values()]
    return {
        "finished": len(done),
        "stuck_seeds": stuck,
        "median_gap": {m: statistics.median(v) for m, v in gaps.items() if v},
        "gap_range": {m: [min(v), max(v)] for m, v in gaps.items() if v},
        "ctr_calibration_range": [min(cal), max(cal)] if cal else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="experiments/gem-mxfp8.toml")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs-per-device", type=int, default=16)
    parser.add_argument("--mps", action="store_true")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    devices = resolve_devices(args.device)  # as `mxlab run` does: cuda names every visible GPU, by index
    seeds = list(range(args.seeds))
    base = load_spec(args.spec, [f"seeds={seeds}", *args.overrides])
    oracles = oracle_metrics(make_data_source(base))
    print("oracles: " + json.dumps(oracles), flush=True)
    result: dict[str, Any] = {"spec": args.spec, "seeds": seeds, "overrides": args.overrides, "oracles": oracles}
    result["variants"] = {}
    with mps_daemon(args.mps):
        for name in args.variant or list(VARIANTS):
            spec = load_spec(args.spec, [f"seeds={seeds}", *args.overrides, *VARIANTS[name]])
            started = time.perf_counter()
            jobs = fork_jobs(spec, args.out / name / "runs")
            executor = LocalExecutor(devices, runs_per_device=args.runs_per_device)
            statuses = run_jobs(jobs, executor, show_progress=False)
            runs: dict[int, dict[str, float]] = {}
            for job in jobs:
                record = statuses.get(job.label)
                if record is None or record.status != "finished":
                    runs[job.seed] = {"status": getattr(record, "status", "missing")}
                    continue
                arrays = metrics.load_eval(job.run_dir / "eval.npz")
                r = judged_metrics(arrays)
                r["ctr.calibration"] = float(metrics.calibration(arrays["click"], arrays["p_ctr"]))
                for m in ("ctr.ne", "ctcvr.ne"):
                    truth = oracles["truth"][m]
                    r[f"{m}.gap"] = (r[m] - truth) / truth
                runs[job.seed] = r
                print(
                    f"  {name:<4} seed {job.seed:3d}  "
                    + "  ".join(f"{m} {r[m]:.4f}" for m in ("ctr.auc", "ctr.ne", "ctcvr.auc", "ctcvr.ne"))
                    + f"  ctr cal {r['ctr.calibration']:.3f}  NE gap ctr {r['ctr.ne.gap']:+.1%}"
                    + f" ctcvr {r['ctcvr.ne.gap']:+.1%}"
                    + ("  STUCK" if r["ctr.auc"] <= oracles["no_history"]["ctr.auc"] else ""),
                    flush=True,
                )
            result["variants"][name] = {
                "overrides": VARIANTS[name],
                "wall_s": round(time.perf_counter() - started, 1),
                "runs": runs,
                "summary": summarize(runs, oracles),
            }
            print(f"== {name}: " + json.dumps(result["variants"][name]["summary"]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
