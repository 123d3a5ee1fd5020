"""The warm-up gate of a fork study ([gate]; docs/statistics.md, "Study designs"): arm-blind, declared
in the spec, decided before any arm runs.

After the fork warm-ups of the declared seeds finish, each is judged on its own eval predictions
(eval.npz, the full eval set) by the gate's rules:

- `beat_oracle`: each named metric must beat the synthetic world's oracle `oracle` (mxlab.data.oracles:
  "truth", "no_history", "no_item_bias") by `oracle_margin` (AUC above it, NE below it);
- `median_band`: each named metric must lie within `band` (relative) of its median over the declared
  seeds' warm-ups (the median is fixed by that first round; replacements are judged against it).

A warm-up that fails a rule (or diverged) is replaced by the next seed of `spare_seeds` whose warm-up
passes; when the spares run out the seed stays unfilled. The decision is written to gate.json before any
arm starts and read back verbatim on --resume, and the arms run only the accepted seeds: no seed can be
dropped after its arms are seen. study.json's `seeds` then lists the accepted seeds and its `gate` entry
the decision; the report names the replaced seeds.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxlab import io
from mxlab.tables import table_to_dataclass
from mxlab.tasks import ESMM_TASKS

GATE = "gate.json"
GATE_METRICS = ("ctr.auc", "ctr.ne", "ctcvr.auc", "ctcvr.ne")
ORACLES = ("truth", "no_history", "no_item_bias")


@dataclass(frozen=True)
class GateConfig:
    """The [gate] table (module docstring); no rule = no gate."""

    spare_seeds: tuple[int, ...] = ()
    beat_oracle: tuple[str, ...] = ()
    oracle: str = "no_history"
    oracle_margin: float = 0.0
    median_band: tuple[str, ...] = ()
    band: float = 0.05

    @property
    def enabled(self) -> bool:
        return bool(self.beat_oracle or self.median_band)

    def to_dict(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in vars(self).items()}


def _names(names: tuple[str, ...], key: str, accepted: tuple[str, ...]) -> None:
    """Refuses a metric name of gate.KEY not in `accepted`, listing them."""
    for name in names:
        if name not in accepted:
            raise ValueError(f"gate.{key} names unknown metric {name!r}; accepted: {', '.join(accepted)}")


def gate_from_table(
    table: Any, *, seeds: Sequence[int], fork: bool, has_truth: bool, tasks: Sequence[str] = ("ctr", "cvr", "ctcvr")
) -> GateConfig:
    """The [gate] table as a GateConfig. Refuses (ValueError naming the value and what is accepted) what
    mxlab.tables.table_to_dataclass refuses (a non-table, an unknown key, a value of the wrong type); an
    unknown metric or oracle; spare seeds that are not distinct non-negative integers or repeat a
    declared seed; a negative margin; a band outside (0, 1); rules without the fork design; beat_oracle on
    a source without truth; a metric of a task the source does not label (`tasks`)."""
    config = table_to_dataclass(GateConfig, table, "gate")
    spares = list(config.spare_seeds)
    if any(seed < 0 for seed in spares):
        raise ValueError(f"gate.spare_seeds must be a list of integers >= 0, got {spares!r}")
    if len(set(spares)) != len(spares) or set(spares) & set(seeds):
        raise ValueError(f"gate.spare_seeds must be distinct and not among seeds {list(seeds)}, got {spares}")
    if config.oracle not in ORACLES:
        raise ValueError(f"gate.oracle {config.oracle!r} is not one of: {', '.join(ORACLES)}")
    if config.oracle_margin < 0:
        raise ValueError(f"gate.oracle_margin must be >= 0, got {config.oracle_margin}")
    if not 0 < config.band < 1:
        raise ValueError(f"gate.band must be in (0, 1) (a share of the median), got {config.band}")
    # independent tasks (mxlab.tasks) are judged on their own NE and AUC
    accepted = GATE_METRICS + tuple(f"{t}.{kind}" for t in tasks if t not in ESMM_TASKS for kind in ("auc", "ne"))
    for key in ("beat_oracle", "median_band"):
        _names(getattr(config, key), key, accepted)
        unlabelled = [name for name in getattr(config, key) if name.split(".", 1)[0] not in tasks]
        if unlabelled:
            labelled = [name for name in accepted if name.split(".", 1)[0] in tasks]
            raise ValueError(
                f"gate.{key} names {unlabelled}, but the data source labels only the tasks {list(tasks)}; "
                f"accepted: {', '.join(labelled)}"
            )
    if config.enabled and not fork:
        raise ValueError("[gate] judges fork warm-ups: set train.fork_from and train.fork_steps, or remove [gate]")
    if config.beat_oracle and not has_truth:
        raise ValueError("gate.beat_oracle needs a source with known truth (synthetic)")
    return config


def warmup_metrics(run_dir: Path) -> dict[str, float | None]:
    """NE and AUC of CTR and CTCVR (CTR alone where the eval set labels no conversions) of a warm-up's eval.npz
    (mxlab.experiment.evaluate.judged_metrics; None where a task's labels hold one class)."""
    from mxlab import metrics
    from mxlab.experiment.evaluate import judged_metrics

    return judged_metrics(metrics.load_eval(Path(run_dir) / "eval.npz"))


def judge(
    values: dict[str, float | None] | None, gate: GateConfig, oracle: dict[str, float], median: dict[str, float]
) -> list[str]:
    """The rules a warm-up fails, as sentences ([] = it passes); `values` None = it did not finish, a metric
    None = undefined on its eval set (a failure)."""
    if values is None:
        return ["the warm-up did not finish (diverged)"]
    undefined = [name for name in (*gate.beat_oracle, *gate.median_band) if values[name] is None]
    failed = [f"{name} undefined: the eval set labels one class only" for name in dict.fromkeys(undefined)]
    for name in [name for name in gate.beat_oracle if name not in undefined]:
        bound = oracle[name] + (gate.oracle_margin if name.endswith("auc") else -gate.oracle_margin)
        worse = values[name] <= bound if name.endswith("auc") else values[name] >= bound
        if worse:
            side = "above" if name.endswith("auc") else "below"
            failed.append(
                f"{name} {values[name]:.4f} not {side} the {gate.oracle} oracle's {oracle[name]:.4f} "
                f"by {gate.oracle_margin:g}"
            )
    for name in [name for name in gate.median_band if name not in undefined]:
        if abs(values[name] - median[name]) > gate.band * abs(median[name]):
            failed.append(f"{name} {values[name]:.4f} outside {gate.band:.0%} of the seeds' median {median[name]:.4f}")
    return failed


def read_gate(out_dir: Path) -> dict[str, Any] | None:
    """The decision in out_dir/gate.json, None when there is none yet."""
    path = Path(out_dir) / GATE
    return json.loads(path.read_text()) if path.is_file() else None


def decide(
    spec: Any,
    out_dir: Path,
    results: dict[str, Any],
    run_warmups: Callable[[Sequence[int]], dict[str, Any]],
    source: Any,
) -> dict[str, Any]:
    """Judge the declared seeds' warm-ups (their `results` by label "_fork/seedK"), run and judge spare
    warm-ups (`run_warmups(seeds)` -> {label: RunResult}) in order for each that fails; write and return
    gate.json's decision: {"accepted_seeds", "replaced" {seed: spare}, "unfilled", "judged" {seed: {values,
    failed}}, "median", "oracle", "rules", "declared_seeds"}. A decision already in out_dir is returned as
    it is; refuses (ValueError) one decided under other rules."""
    gate = spec.gate
    earlier = read_gate(out_dir)
    if earlier is not None:
        if earlier["rules"] != gate.to_dict():
            raise ValueError(
                f"cannot resume {out_dir}: [gate] differs from the one its gate.json decided with "
                f"({earlier['rules']} recorded, {gate.to_dict()} now); use that [gate] or a fresh --out"
            )
        return earlier
    oracle: dict[str, float] = {}
    if gate.beat_oracle:
        from mxlab.data.oracles import oracle_metrics

        oracle = oracle_metrics(source)[gate.oracle]
    runs = Path(out_dir) / "runs" / "_fork"

    def values(seed: int, result: Any) -> dict[str, float] | None:
        return warmup_metrics(runs / f"seed{seed}") if result is not None and result.status == "finished" else None

    first = {seed: values(seed, results.get(f"_fork/seed{seed}")) for seed in spec.seeds}
    finished = [v for v in first.values() if v is not None]
    median = {
        name: statistics.median([v[name] for v in finished if v[name] is not None] or [float("nan")])
        for name in gate.median_band
    }
    judged = {seed: {"values": v, "failed": judge(v, gate, oracle, median)} for seed, v in first.items()}
    spares, replaced, unfilled, accepted = list(gate.spare_seeds), {}, [], []
    for seed in spec.seeds:
        if results.get(f"_fork/seed{seed}") is not None and results[f"_fork/seed{seed}"].status == "failed":
            accepted.append(seed)  # a crash is no verdict on the warm-up: its arms are blocked as without a gate
            continue
        if not judged[seed]["failed"]:
            accepted.append(seed)
            continue
        while spares:
            spare = spares.pop(0)
            ran = run_warmups([spare])
            v = values(spare, ran.get(f"_fork/seed{spare}"))
            judged[spare] = {"values": v, "failed": judge(v, gate, oracle, median)}
            if not judged[spare]["failed"]:
                replaced[seed] = spare
                accepted.append(spare)
                break
        else:
            unfilled.append(seed)
    decision = {
        "rules": gate.to_dict(),
        "declared_seeds": list(spec.seeds),
        "accepted_seeds": accepted,
        "replaced": {str(seed): spare for seed, spare in replaced.items()},
        "unfilled": unfilled,
        "judged": {str(seed): entry for seed, entry in judged.items()},
        "median": median,
        "oracle": oracle,
    }
    io.write_json(Path(out_dir) / GATE, decision)
    return decision


def record_decision(out_dir: Path, decision: dict[str, Any]) -> None:
    """Write the decision into out_dir/study.json: `seeds` the accepted seeds, `gate.decision` the rest
    (what the report reads)."""
    path = Path(out_dir) / "study.json"
    study = json.loads(path.read_text())
    gate = {**(study.get("gate") or {}), "decision": decision}
    io.write_json(path, {**study, "seeds": decision["accepted_seeds"], "gate": gate})


def gated_spec(spec: Any, decision: dict[str, Any]) -> Any:
    """`spec` with the gate's accepted seeds."""
    return dataclasses.replace(spec, seeds=tuple(int(seed) for seed in decision["accepted_seeds"]))


def run_gate(
    spec: Any,
    out_dir: Path,
    results: dict[str, Any],
    run_warmups: Callable[[Sequence[int]], dict[str, Any]],
    source: Callable[[], Any],
) -> Any:
    """`decide` (the data source made by `source()` only when a new decision needs the oracles), record the
    decision in study.json, and return the spec the arms run: `gated_spec`."""
    decision = read_gate(out_dir)
    if decision is None or decision["rules"] != spec.gate.to_dict():
        decision = decide(spec, out_dir, results, run_warmups, source() if spec.gate.beat_oracle else None)
    record_decision(out_dir, decision)
    return gated_spec(spec, decision)
