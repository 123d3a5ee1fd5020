"""A run's health records: gradient norms, clipped steps, loss spikes and the held-out trajectory.

Per metrics.jsonl record (each log interval): `grad_norm` (mean over the interval's steps of the global
gradient norm before clipping), `grad_norm_max`, `clipped` (steps whose norm exceeded
train.clip_grad_norm) and `loss_spikes` (steps whose loss exceeded train.spike_factor x the previous
record's mean loss). Per run (done.json `health`): `summarize` of those records and of the held-out
metrics every train.eval_every steps. Everything is derived from the steps' values read back with the
losses and from metrics.jsonl, so a resumed run records the same health as an uninterrupted one.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def interval_health(
    steps: list[int], losses: list[float], norms: list[float], previous: dict[str, Any] | None, train: Any
) -> dict[str, Any]:
    """The health fields of one metrics record: the interval's `steps`, their total `losses` and gradient
    `norms` (NaN: a skipped step), `previous` the run's last record (None: no spike reference yet)."""
    finite = [norm for norm in norms if math.isfinite(norm)]
    reference = previous.get("loss") if previous else None
    spikes = []
    if reference is not None and math.isfinite(reference) and reference > 0:
        spikes = [step for step, loss in zip(steps, losses) if loss > train.spike_factor * reference]
    return {
        "grad_norm": sum(finite) / len(finite) if finite else None,
        "grad_norm_max": max(finite) if finite else None,
        "clipped": sum(1 for norm in finite if norm > train.clip_grad_norm),
        "loss_spikes": spikes,
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """done.json's `health` of a run's metrics records: median and largest gradient norm over the
    intervals, clipped steps, the loss-spike steps, the last held-out metrics and, per held-out NE (one per
    task the run is evaluated on: `ctr.ne`, `ctcvr.ne` or each declared head's), its largest rise between two
    evaluations (None where the records hold none)."""
    norms = [r["grad_norm"] for r in records if r.get("grad_norm") is not None]
    largest = [r["grad_norm_max"] for r in records if r.get("grad_norm_max") is not None]
    heldout = [r["heldout"] for r in records if r.get("heldout")]
    ne_metrics = sorted({name for h in heldout for name in h if name.endswith(".ne")})
    rises = {}
    for name in ne_metrics:
        ne = [h[name] for h in heldout if h.get(name) is not None]
        rises[name] = max((b - a for a, b in zip(ne, ne[1:])), default=None)
    return {
        "grad_norm_median": statistics.median(norms) if norms else None,
        "grad_norm_max": max(largest) if largest else None,
        "clipped_steps": sum(r.get("clipped", 0) for r in records),
        "loss_spike_steps": [step for r in records for step in r.get("loss_spikes", [])],
        "heldout_last": heldout[-1] if heldout else None,
        "heldout_ne_largest_rise": rises or None,
    }
