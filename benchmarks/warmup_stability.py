"""Do the model's Triton kernels (rotary, QK-norm, LayerNorm) change how often a BF16 warm-up trains badly?

An exploration for the training-step issue (not imported by the library). gem-mxfp8's rerun of 2026-12-03 at
the tree of ed3fa3a had 2 of 8 BF16 fork warm-ups end badly trained (eval CTR AUC 0.729 against 0.78-0.79);
the run at 008c171, before the kernels, had none. Eight seeds cannot tell chance from cause (Fisher's exact
p = 0.47). This trains the spec's fork warm-ups (BF16, train.fork_steps steps each) for --seeds seeds in
this process, twice: with the kernels (the library as it is) and with them switched off here (mxlab.nn.norms
and rotary_embedding take their PyTorch formulas, as on a CPU), and prints each warm-up's last held-out CTR
and CTCVR NE and AUC, and the seeds `mxlab.analysis.outlying_values` flags in each set. GPU training is not
bit-reproducible, so read the counts of bad runs, not seed-by-seed differences.

    python3 benchmarks/warmup_stability.py --spec experiments/gem-mxfp8.toml --seeds 16 \
        --out ~/stability --json $OUT/stability.json
    python3 benchmarks/warmup_stability.py --device cpu --seeds 5 --set train.fork_steps=4 \
        --set train.eval_every=2 --set train.log_every=2 \
        --set data.train_examples=20000 --set data.eval_examples=4000 --out /tmp/stability   # a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from mxlab.analysis import outlying_values
from mxlab.experiment.executors.local import InlineExecutor
from mxlab.experiment.runner import run_jobs
from mxlab.experiment.spec import load_spec
from mxlab.experiment.study_jobs import fork_jobs
from mxlab.report.runs import read_training_log

METRICS = ("ctr.ne", "ctcvr.ne", "ctr.auc", "ctcvr.auc")


@contextlib.contextmanager
def model_kernels(enabled: bool) -> Iterator[None]:
    """The library as it is (enabled), or with the norm and rotary kernels switched off in this process."""
    if enabled:
        yield
        return
    import mxlab.nn.attention as attention
    import mxlab.nn.norms as norms

    original = attention.kernel_module
    with (
        mock.patch.object(norms, "_kernels", lambda *args, **kwargs: None),
        mock.patch.object(attention, "kernel_module", lambda name: None if name == "rotary" else original(name)),
    ):
        yield


def last_heldout(run_dir: Path) -> dict[str, float]:
    records = [r["heldout"] for r in read_training_log(run_dir) if isinstance(r.get("heldout"), dict)]
    return {m: float(records[-1][m]) for m in METRICS if records and m in records[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="experiments/gem-mxfp8.toml")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument(
        "--chunk", type=int, default=2, help="seeds trained per variant before the other variant's turn"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    result: dict[str, Any] = {
        "spec": args.spec,
        "seeds": args.seeds,
        "overrides": args.overrides,
        "variants": {"kernels": {"runs": {}}, "pytorch": {"runs": {}}},
    }
    # seeds in chunks, both variants per chunk, so a command that runs out of time still brings back pairs;
    # finished warm-ups (done.json) are not trained again when the command is repeated with the same --out
    for first in range(0, args.seeds, args.chunk):
        chunk = list(range(first, min(first + args.chunk, args.seeds)))
        spec = load_spec(args.spec, [f"seeds={chunk}", *args.overrides])
        for name, enabled in (("kernels", True), ("pytorch", False)):
            started = time.perf_counter()
            with model_kernels(enabled):
                jobs = fork_jobs(spec, args.out / name / "runs")
                run_jobs(jobs, InlineExecutor(args.device), show_progress=False)
            for job in jobs:
                r = result["variants"][name]["runs"][job.seed] = last_heldout(job.run_dir)
                print(
                    f"   {name:<8} seed {job.seed:3d}  "
                    + "  ".join(f"{m} {r.get(m, float('nan')):.4f}" for m in METRICS)
                    + f"   ({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
        for variant in result["variants"].values():
            runs = variant["runs"]
            variant["outliers"] = {
                m: sorted(outlying_values({s: r[m] for s, r in runs.items() if m in r})) for m in METRICS
            }
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    for name, variant in result["variants"].items():
        print(f"== {name}: {len(variant['runs'])} warm-ups; outlying seeds {variant['outliers']}")


if __name__ == "__main__":
    main()
