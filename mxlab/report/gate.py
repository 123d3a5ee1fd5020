"""The report's sentence on the fork warm-up gate (mxlab.experiment.gate), from study.json's gate decision."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def gate_text(spec: Mapping[str, Any]) -> str:
    """A sentence (with a leading space) counting and naming the seeds the warm-up gate replaced or left
    unfilled, and why; "" for a study without a gate decision."""
    decision = (spec.get("gate") or {}).get("decision")
    if not decision:
        return ""
    replaced = {int(seed): int(spare) for seed, spare in decision.get("replaced", {}).items()}
    unfilled = [int(seed) for seed in decision.get("unfilled", [])]
    declared = decision.get("declared_seeds", [])
    judged = decision.get("judged", {})
    if not replaced and not unfilled:
        return f" Warm-up gate (declared in the spec, arm-blind): all {len(declared)} declared warm-ups passed."
    why = "; ".join(
        f"seed {seed}: {', '.join(judged.get(str(seed), {}).get('failed', [])) or 'failed'}"
        for seed in sorted(set(replaced) | set(unfilled))
    )
    parts = [f"{len(replaced)} of {len(declared)} declared seeds replaced"]
    if replaced:
        parts.append("(" + ", ".join(f"seed {seed} by seed {spare}" for seed, spare in sorted(replaced.items())) + ")")
    if unfilled:
        parts.append(f"and {len(unfilled)} left unfilled for want of spare seeds ({', '.join(map(str, unfilled))})")
    return f" Warm-up gate (declared in the spec, arm-blind, decided before any arm ran): {' '.join(parts)}; {why}."
