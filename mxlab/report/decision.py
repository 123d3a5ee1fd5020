"""The top of a report: the decision line, the warnings, the decision per candidate, the ship table, the controls."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mxlab.analysis import OUTLIER_FALSE_ALARM, Comparison, StudyAnalysis, outlier_threshold, outlying_values
from mxlab.experiment.report_settings import MIN_PAIRED_SEEDS
from mxlab.report.alerts import NOTE, QUESTIONS, WEAKENS, Alert, ordered, questioning
from mxlab.report.costs import ArmCost, arm_costs, cost_cell, cost_header, on_cpu
from mxlab.report.document import Block, BulletList, Details, Heading, Paragraph, Table
from mxlab.report.format import VERDICT_MARKS, format_interval, format_value

DECISION_MARKS = {"ships": "**✔ ships**", "does not ship": "**▼ does not ship**", "not decided": "**not decided**"}
HEADLINE_MARKS = {"ships": "✔ ", "does not ship": "▼ ", "not decided": ""}


def decision_line(analysis: StudyAnalysis, alerts: list[Alert]) -> str:
    """The report's first line: each candidate's decision with its reason ('not decided' without a candidate),
    and how many of ``alerts`` question it."""
    p = analysis.preregistration
    which = "pre-registered candidate" if p is not None and p.status == "pre-registered" else "candidate (post hoc)"
    if analysis.decisions:
        parts = [f"**{HEADLINE_MARKS[d.decision]}{d.arm} {d.decision}** ({d.reason})" for d in analysis.decisions]
        line = f"**Decision on the {which}**: " + "; ".join(parts) + "."
    elif analysis.settings.candidate:
        named = ", ".join(analysis.settings.candidate)
        line = (
            f"**Decision: not decided**: the {which} {named} has no finished run beside the baseline yet; "
            "the runs still to train are listed below."
        )
    else:
        line = (
            "**Decision: not decided**: the study names no pre-registered candidate (`[report] candidate`), so no "
            "arm ships or fails by the rule; the ship table gives each arm's verdicts."
        )
    n = questioning(alerts)
    return line + (f" {n} warning{'s' if n > 1 else ''} below question{'s' if n == 1 else ''} it." if n else "")


def opening(analysis: StudyAnalysis, alerts: list[Alert]) -> list[Block]:
    """The blocks under the title: the decision line, then the alerts in severity order."""
    return [Paragraph(decision_line(analysis, alerts))] + (
        [BulletList([a.text for a in ordered(alerts)])] if alerts else []
    )


def ne_units(analysis: StudyAnalysis, metric: str, value: float) -> str:
    """A margin in its own units and, for excess NE, its NE equivalent (x the baseline's mean gap share)."""
    own = format_value(metric, value, False)
    task, kind = metric.split(".", 1)
    if kind == "ne":
        return f"{own} of NE"
    if kind == "excess_ne" and analysis.inputs.truth and math.isfinite(value):
        base = analysis.inputs.run_metrics.get(analysis.study.baseline, {}).values()
        bayes = analysis.inputs.truth[task]["ne"]
        share = [(m[task]["ne"] - bayes) / m[task]["ne"] for m in base if task in m]
        if share:
            return f"{own} of the gap = {value * float(np.mean(share)):.3g}% of NE"
    if kind == "calibration":
        return f"±{own} shift"
    return own


def constant_rate_note(analysis: StudyAnalysis, not_converged: bool) -> Alert | None:
    """A pointer to the decay phase when the runs ended at a constant learning rate and the study is too
    noisy for its margin or its baseline had not settled; None otherwise."""
    if analysis.study.spec.get("train", {}).get("lr_decay_steps", 0):
        return None
    if not (any(_too_small(d) for d in analysis.detectable) or not_converged):
        return None
    return Alert(
        NOTE,
        "**The runs ended at a constant learning rate**: the eval scores each model as it was at its last step, "
        "still moving by a full step's worth, which widens every interval (and can make held-out curves oscillate "
        "rather than fall). Ending each run in a decay of the rate, `[train] lr_decay_steps` (docs/statistics.md, "
        '"Study designs"), narrows them.',
    )


def _too_small(d: Any) -> bool:
    """True when an endpoint has seeds enough but cannot show non-inferiority at its margin with the power."""
    return d.n_seeds >= MIN_PAIRED_SEEDS and math.isfinite(d.smallest_margin) and d.smallest_margin > d.margin


def _preregistration_warning(analysis: StudyAnalysis) -> list[Alert]:
    p = analysis.preregistration
    if p is None or p.status == "pre-registered":
        return []
    if p.status == "not recorded":
        return [
            Alert(
                QUESTIONS,
                "**Not pre-registered**: this study folder predates the record of its report settings at the start "
                "(study.json `preregistered`); the verdicts below use the settings given now.",
            )
        ]
    text = (
        f"**The verdicts are post hoc**: the report settings differ from those recorded when the study started "
        f"(changed: {', '.join(p.changed)}; recorded sha256 {str(p.registered_sha256)[:12]}, used "
        f"{p.used_sha256[:12]}). Only the pre-registered settings give the stated error rates; summary.json keeps both."
    )
    return [Alert(QUESTIONS, text)]


def warnings(analysis: StudyAnalysis) -> list[Alert]:
    """The warnings at the top: pre-registration, notes, outlying baseline seeds, seeds, margins, runs."""
    out = _preregistration_warning(analysis) + [Alert(WEAKENS, note) for note in analysis.inputs.notes]
    out += [Alert(WEAKENS, text) for text in rerun_warnings(analysis.study.spec)]
    out += [Alert(WEAKENS, text) for text in _baseline_outlier_warnings(analysis)]
    for d in analysis.detectable:
        if d.n_seeds < MIN_PAIRED_SEEDS:
            text = (
                f"**Too few seeds for a verdict on {d.metric}**: {d.n_seeds} paired seed(s), every verdict needs "
                f"{MIN_PAIRED_SEEDS}"
                + (f"; its margin needs {d.seeds_needed} seeds at this study's variance." if d.seeds_needed else ".")
            )
            out.append(Alert(QUESTIONS, text))
        elif _too_small(d):
            need = f"{d.seeds_needed} seeds would" if d.seeds_needed else "more than 64 seeds, or a larger eval set,"
            text = (
                f"**This study is too small for its margin on {d.metric}**: it shows non-inferiority with "
                f"{analysis.settings.power:.0%} power only at margins from "
                f"{ne_units(analysis, d.metric, d.smallest_margin)} "
                f"(the margin is {ne_units(analysis, d.metric, d.margin)}); {need} reach the margin."
            )
            out.append(Alert(WEAKENS, text))
    candidates = {d.arm for d in analysis.decisions}
    for arm, r in analysis.arms.items():
        if r.diverged:  # a candidate's decision counts only its surviving seeds: the divergence questions it
            steps = ", ".join(f"seed {s} at step {step}" for s, step in r.diverged.items())
            text = (
                f"**{arm} diverged** ({steps}): those seeds are left out; its verdicts rest on seeds {r.paired_seeds}."
            )
            out.append(Alert(QUESTIONS if arm in candidates else WEAKENS, text))
        if r.skipped:
            reasons = "; ".join(sorted({x or "no reason recorded" for x in r.skipped.values()}))
            out.append(Alert(WEAKENS, f"**{arm} was skipped** on seeds {sorted(r.skipped)} ({reasons})."))
        if r.missing:
            out.append(Alert(WEAKENS, f"{arm}: seeds {r.missing} not run or not finished."))
    return out


def rerun_warnings(study: dict[str, Any]) -> list[str]:
    """One warning per rerun of diverged runs recorded in study.json ("reruns"): the runs and the changed settings."""
    out = []
    for entry in study.get("reruns") or []:
        changed = "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in (entry.get("changed") or {}).items())
        out.append(
            f"**Runs {', '.join(entry.get('runs', []))} were rerun** after they {entry.get('reason', 'diverged')}, "
            f"with changed settings ({changed}); the other runs trained with the recorded ones, so these seeds' "
            f"deltas mix settings (the first attempts are kept in {entry.get('moved_to', 'the study folder')})."
        )
    return out


def _baseline_outlier_warnings(analysis: StudyAnalysis) -> list[str]:
    """One warning per task and measure (NE, AUC) of the primary metrics whose baseline runs hold an outlying
    seed (`outlying_values` of the baseline's final eval value; NE stands in for excess NE, which differs from
    it by a constant), named before any arm is read."""
    baseline, run_metrics = analysis.study.baseline, analysis.inputs.run_metrics.get(analysis.study.baseline, {})
    out, seen = [], set()
    for metric in analysis.settings.primary:
        task = metric.partition(".")[0]
        for measure in ("ne", "auc"):
            if (task, measure) in seen:
                continue
            seen.add((task, measure))
            values = {seed: m[task][measure] for seed, m in run_metrics.items() if measure in m.get(task, {})}
            flagged = outlying_values(values)
            if not flagged:
                continue
            seeds = sorted(flagged)
            shown = "; ".join(f"seed {s} at {values[s]:.4g}, z {flagged[s]:+.1f}" for s in seeds)
            out.append(
                f"**The baseline's {task}.{measure} is an outlier on seed(s) {', '.join(map(str, seeds))}** ({shown}; "
                f"median {float(np.median(list(values.values()))):.4g} over {len(values)} seeds; the modified "
                "z-score's "
                f"cut for {len(values)} seeds, {outlier_threshold(len(values)):.1f}, flags normal seeds in "
                f"{OUTLIER_FALSE_ALARM:.0%} of studies): {baseline} trained badly there. A paired delta on such a seed "
                f"measures that run as much as the recipe, and one such seed widens every interval it enters; the "
                f"medians and per-seed deltas show which arms share it. Verdicts use every seed."
            )
    return out


def decision_section(analysis: StudyAnalysis) -> list[Block]:
    """The pre-registered decision, one line per candidate; [] without a candidate."""
    if not analysis.decisions:
        return []
    by_metric = {d.metric: d for d in analysis.detectable}
    items = []
    for decision in analysis.decisions:
        line = f"{DECISION_MARKS[decision.decision]} **{decision.arm}**: {decision.reason}"
        details = []
        for v in decision.endpoints:
            if v.verdict == "regression" or (decision.decision == "not decided" and v.verdict == "inconclusive"):
                d = by_metric.get(v.metric)
                reach = (
                    f"; this study shows it at margins from {ne_units(analysis, v.metric, d.smallest_margin)}"
                    + (
                        f", the margin needs {d.seeds_needed} seeds"
                        if d.seeds_needed
                        else ", the margin needs more than 64 seeds"
                    )
                    if d is not None and v.verdict != "regression" and math.isfinite(d.smallest_margin)
                    else ""
                )
                details.append(
                    f"{v.metric} {format_interval(v.__dict__)} ({v.level:.0%} interval), margin "
                    f"{ne_units(analysis, v.metric, v.margin)}{reach}"
                )
        items.append(line + (": " + "; ".join(details) if details else "") + ".")
    level = analysis.decisions[0].level
    return [
        Heading("Decision", 2),
        BulletList(items),
        Paragraph(
            "Pre-registered candidate(s) "
            + ", ".join(f"**{d.arm}**" for d in analysis.decisions)
            + f": a candidate ships when every co-primary endpoint passes at one-sided level {level:.3g} "
            "(non-inferiority for NE and AUC; two one-sided tests within ±margin for the calibration shift; "
            "intersection-union, several candidates Holm-adjusted among themselves). It does not ship when an "
            "endpoint is a regression (Holm over the candidates' endpoints, point beyond the margin); otherwise "
            "the study has not decided (docs/statistics.md)."
        ),
    ]


def _cell(c: Comparison | None) -> str:
    if c is None:
        return "-"
    opposite = f", {c.sign_disagreements} of {len(c.per_seed)} seeds opposite" if c.sign_disagreements else ""
    median = format_value(c.metric, c.median)
    return f"{VERDICT_MARKS[c.verdict]}: {format_interval(c)} (median {median}{opposite})"


def ship_table(analysis: StudyAnalysis) -> list[Block]:
    """The table of every compared arm's endpoints, candidates first, controls last, and what the study can decide."""
    s = analysis.settings
    endpoints = [d.metric for d in analysis.detectable]
    header = ["arm", "role", "paired seeds"] + [f"{m} (margin {ne_units(analysis, m, s.margin(m))})" for m in endpoints]
    costs = arm_costs(analysis.study)
    base_cost = costs.get(analysis.study.baseline)
    if base_cost is not None:
        header.append(cost_header(analysis.study.spec, analysis.study.baseline))
    rank = {"candidate": 0, "exploratory": 1, "control": 2}
    roles = {c.arm: c.role for c in analysis.comparisons}
    rows, classes = [], []
    for arm in sorted(analysis.arms, key=lambda a: rank.get(roles.get(a, "exploratory"), 1)):
        r = analysis.arms[arm]
        role = roles.get(arm, "exploratory")
        role = f"{analysis.controls[arm]} control" if arm in analysis.controls else role
        cells = [_cell(analysis.comparison(arm, m)) for m in endpoints]
        if base_cost is not None:
            cells.append(cost_cell(costs[arm], base_cost))
        seeds = f"{len(r.paired_seeds)}" + (f" ({len(r.diverged)} diverged)" if r.diverged else "")
        rows.append([arm, role, seeds] + cells)
        words = {c.verdict for m in endpoints if (c := analysis.comparison(arm, m))}
        classes.append("regression" if "regression" in words else "improvement" if words == {"improvement"} else "")
    tail = ["-"] if base_cost is not None else []
    rows.append(
        [f"smallest margin shown ({s.power:.0%} power, true delta 0)", "-", "-"]
        + [
            format_value(d.metric, d.smallest_margin, False)
            + (f"; margin needs {d.seeds_needed} seeds" if d.seeds_needed else "; margin needs > 64 seeds")
            for d in analysis.detectable
        ]
        + tail
    )
    rows.append(
        [f"smallest regression called ({s.power:.0%} power)", "-", "-"]
        + [format_value(d.metric, d.effect, False) + f" at {d.n_seeds} seeds" for d in analysis.detectable]
        + tail
    )
    classes += ["", ""]
    rule = analysis.detectable[0].rule if analysis.detectable else ""
    return [
        Heading("Ship table", 2),
        Table(header, rows, classes),
        Paragraph(
            f"Delta = arm minus baseline **{analysis.study.baseline}** on the same seed and eval examples, mean over "
            "paired "
            "seeds (NE in % of the baseline's NE; excess NE in % of the baseline-to-truth gap; calibration: "
            "100 ln(sum of the arm's predictions / the baseline's), negative = under-predicts), with the median of the "
            "per-seed deltas and the seeds whose sign differs from the mean's. Intervals carry retraining and "
            "eval-sampling noise: candidates at the level of their decision, exploratory arms at their Holm step "
            f"(Holm over {analysis.family_size} exploratory hypotheses), controls in their own family. The last rows: "
            f"what this study can decide at the spread of its {'candidates' if analysis.decisions else 'arms'} "
            f"({rule}; "
            "docs/statistics.md)." + _cost_note(analysis, base_cost)
        ),
    ]


def _cost_note(analysis: StudyAnalysis, base_cost: ArmCost | None) -> str:
    if base_cost is None:
        return ""
    shared = int(analysis.study.spec.get("execution", {}).get("runs_per_device", 1) or 1)
    return (
        f" Step time: the median over seeds of each run's median time per training step; peak memory: the run's "
        f"torch.cuda.max_memory_allocated (GPU only); the baseline's: {cost_cell(base_cost)}."
        + (
            " The runs trained on the CPU, where an MX step quantizes every GEMM operand in software: the ratio is "
            "the cost of that emulation, not a forecast of MX hardware."
            if on_cpu(analysis.study.spec)
            else ""
        )
        + (
            f" {shared} runs shared each device, so a step's time includes its neighbours' load: these rank the arms "
            "of this study; `mxlab bench step` times a step alone."
            if shared > 1
            else ""
        )
    )


def controls_section(analysis: StudyAnalysis) -> Block:
    """Assay checks of the declared controls and, from scratch, the A/A noise floor."""
    blocks: list[Block] = []
    if analysis.assays:
        blocks.append(
            BulletList(
                [
                    f"**{arm}** ({role} control, outside every family): {analysis.assays[arm]}."
                    for arm, role in analysis.controls.items()
                ]
            )
        )
    fork = analysis.study.is_fork
    if analysis.aa:
        rows = [
            [
                c.metric,
                ", ".join(f"{format_value(c.metric, v)}" for v in c.per_seed.values()),
                format_interval(c),
                c.verdict or "-",
                c.reason,
            ]
            for c in analysis.aa
        ]
        blocks += [
            Paragraph(
                f"A/A: the baseline against itself on disjoint seed pairs {analysis.inputs.aa_pairs} (distinct "
                "seeds, so "
                "each pair differs by init and data order), with the arms' interval method, unadjusted."
            ),
            Table(["metric", "per pair", "delta [interval]", "verdict", "why"], rows),
        ]
    elif fork:
        blocks.append(
            Paragraph(
                "No A/A section: in the fork design the baseline's runs of two seeds continue from different warm-ups, "
                "so they are no A/A pair; a placebo arm is the null control."
            )
        )
    if not blocks:
        blocks.append(Paragraph("No control declared, and fewer than two finished baseline seeds for an A/A pair."))
    return Details("Controls: assay checks" + ("" if fork else " and A/A noise floor"), blocks)
