"""Assemble a study's report (report.md, report.html, summary.json, figures/*.png) from its folder.

The report opens with the decision line, then its warnings in order of what they change
(mxlab.report.alerts), the study's design, the decision per candidate and the ship table
(mxlab.report.decision), then the truth ceiling and the figures;
secondary metrics, controls, per-seed detail and diagnostics are folded below. Reads only files.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxlab import io, metrics
from mxlab.analysis import StudyAnalysis, analyze_study, load_study
from mxlab.experiment.integrity import mixed_arm_warnings
from mxlab.experiment.records import runs_for_report
from mxlab.experiment.report_settings import ReportSettings, metric_names
from mxlab.report import figures
from mxlab.report.alerts import QUESTIONS, Alert
from mxlab.report.convergence import WARMUP_ARM, convergence_warning, design_text, heldout_series, plateau_alert
from mxlab.report.decision import constant_rate_note, controls_section, decision_section, opening, ship_table, warnings
from mxlab.report.diagnostics import diagnostics
from mxlab.report.document import (
    Block,
    BulletList,
    CodeBlock,
    Details,
    Figure,
    Heading,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)
from mxlab.report.format import VERDICT_MARKS, format_interval, format_value
from mxlab.report.format import mean_sd as _mean_sd
from mxlab.report.gate import gate_text
from mxlab.report.reliability import reliability_curves
from mxlab.report.runs import read_numerics, read_plan, read_training_log

RUN_FIGURES = ("reliability.png", "training.png", "heldout.png", "numerics.png")  # drawn from the run folders
FIGURE_NAMES = ("forest.png", *RUN_FIGURES)


def draw_png(draw: Callable[[Path], None], temporary: Path) -> None:
    """Draw a figure into ``temporary`` as PNG (via a sibling .png name, renamed onto it)."""
    png = temporary.with_name(temporary.name + ".png")
    try:
        draw(png)
        os.replace(png, temporary)
    finally:
        png.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- sections


def _truth_ceiling(analysis: StudyAnalysis) -> list[Block]:
    truth = analysis.inputs.truth
    if not truth:
        return []
    base = analysis.study.baseline
    rm = analysis.inputs.run_metrics
    rows = []
    for task in [t for t in metrics.TASKS if t in truth]:
        bayes = truth[task]["ne"]
        for arm in analysis.study.arms:
            seeds = rm.get(arm, {})
            if not seeds:
                continue
            excess = [m[task]["ne"] - bayes for m in seeds.values()]
            share = analysis.comparison(arm, f"{task}.excess_ne") if arm != base else None
            rows.append(
                [
                    task.upper(),
                    f"{bayes:.4f}",
                    arm + (" (baseline)" if arm == base else ""),
                    _mean_sd(excess),
                    "-"
                    if share is None
                    else format_interval(share) + (f" ({VERDICT_MARKS[share.verdict]})" if share.verdict else ""),
                ]
            )
    return [
        Heading("Truth ceiling", 2),
        Table(
            [
                "task",
                "Bayes NE (true probabilities)",
                "arm",
                "excess NE over Bayes",
                "share of the baseline-to-truth gap the arm adds",
            ],
            rows,
        ),
        Paragraph(
            "The data's true probabilities scored as predictions give the Bayes-optimal NE of this eval set; an "
            "arm's excess NE removes the label noise every model shares. Its delta, as a share of the baseline's "
            "excess, is the metric `TASK.excess_ne` (primary when the spec says so)."
        ),
    ]


def _secondary(analysis: StudyAnalysis) -> Block:
    rows = [[c.arm, c.metric, format_interval(c), str(len(c.per_seed))] for c in analysis.comparisons if not c.primary]
    return Details(
        f"Secondary metrics: unadjusted {analysis.settings.confidence:.0%} intervals, no verdict ({len(rows)})",
        [Table(["arm", "metric", "delta [interval]", "paired seeds"], rows)],
    )


def _per_seed(analysis: StudyAnalysis) -> Block:
    rows = [
        [
            c.arm,
            c.metric,
            "; ".join(f"seed {s}: {format_value(c.metric, v)}" for s, v in c.per_seed.items()),
            f"{c.se:.3g}",
            f"{c.level:.4f}",
            c.reason,
        ]
        for c in analysis.comparisons
    ]
    return Details(
        "Per-seed deltas, standard errors and interval levels",
        [Table(["arm", "metric", "per seed", "se", "interval level", "decision"], rows)],
    )


def _absolute_metrics(analysis: StudyAnalysis) -> Block:
    names = ["auc", "gauc", "log_loss", "ne", "calibration", "ece", "mae_truth"]
    blocks: list[Block] = []
    rm = analysis.inputs.run_metrics
    for task in [t for t in analysis.study.tasks if any(t in m for seeds in rm.values() for m in seeds.values())]:
        present = [n for n in names if any(n in m[task] for seeds in rm.values() for m in seeds.values())]
        rows = [
            [arm + (" (baseline)" if arm == analysis.study.baseline else ""), str(len(rm.get(arm, {})))]
            + [_mean_sd([m[task].get(n, math.nan) for m in rm.get(arm, {}).values()]) for n in present]
            for arm in analysis.study.arms
        ]
        if analysis.inputs.truth:
            rows.append(
                ["truth (ceiling)", "-"] + [_mean_sd([analysis.inputs.truth[task].get(n, math.nan)]) for n in present]
            )
        blocks += [Heading(task.upper(), 3), Table(["arm", "seeds"] + present, rows)]
    return Details("Metrics per arm (mean ± sd over finished seeds)", blocks)


def _delong(analysis: StudyAnalysis) -> Block | None:
    if not analysis.inputs.delong:
        return None
    rows = [
        [
            arm,
            str(seed),
            task.upper(),
            f"{r.auc_a:.5f}",
            f"{r.auc_b:.5f}",
            f"{r.delta:+.5f}",
            f"{r.z:+.2f}",
            f"{r.p_value:.3g}",
        ]
        for (arm, task, seed), r in sorted(analysis.inputs.delong.items())
    ]
    return Details(
        "Diagnostics: DeLong tests per seed (tests of two fitted models, not of the recipe)",
        [
            Paragraph(
                "Each row tests whether two fitted models, the arm's "
                "and the baseline's of one seed, rank this eval set "
                "equally well (DeLong 1988; examples independent). It ignores retraining noise, so a tiny p here says "
                "nothing about the recipe: the verdicts above never use it."
            ),
            Table(["arm", "seed", "task", "AUC arm", "AUC baseline", "delta", "z", "p"], rows),
        ],
    )


def _eval_size(n: dict[str, int]) -> str:
    """The eval set's size: impressions (and clicked ones) of the ESMM tasks, else of the first declared task."""
    if not n or set(n) <= set(metrics.TASKS):
        return f"{n.get('ctr', 0)} eval impressions ({n.get('cvr', 0)} clicked)"
    return f"{next(iter(n.values()))} eval impressions"


def _secondary_names(analysis: StudyAnalysis) -> list[str]:
    """The metrics of the eval sets' tasks that are not endpoints, sorted."""
    tasks = tuple(analysis.inputs.n_examples or metrics.TASKS)
    return sorted(m for m in metric_names(tasks) if m not in analysis.settings.endpoints)


def _method(analysis: StudyAnalysis) -> Block:
    s = analysis.settings
    return Details(
        "Method and conventions",
        [
            BulletList(
                [
                    "Pairing: arm and baseline on the same seed (initial "
                    "weights, data order) and the same eval examples.",
                    "Interval: mean of the per-seed deltas; variance = "
                    "(sample variance over seeds) / k + the eval-sampling "
                    "variance shared by all seeds (the eval set is the "
                    "same), from per-user influence values; Student t on "
                    "k - 1 degrees of freedom (docs/statistics.md).",
                    f"Endpoints {list(s.endpoints)} (the primary metrics and each task's calibration shift). "
                    f"Candidate(s) {list(s.candidate) or 'none'}: ship when every endpoint passes one-sided at "
                    f"{1 - s.confidence:.0%} (intersection-union; two one-sided tests for calibration; Holm among "
                    "candidates); regressions by Holm over the candidates' "
                    "endpoints. Exploratory arms: Holm's step-down "
                    "test of delta = 0 over their arm x endpoint family "
                    f"(correction = {s.correction!r}), intervals at the "
                    f"level of each Holm step. Controls {s.controls or 'none'}: "
                    "each its own family. Fewer than 3 paired "
                    "seeds: inconclusive.",
                    "Margins, fixed before the runs: "
                    f"{', '.join(f'{m} {format_value(m, s.margin(m), False)}' for m in s.endpoints)}; "
                    f"secondary metrics {_secondary_names(analysis)[:3]}...: "
                    "unadjusted intervals, no verdict.",
                    "What the study can decide: the smallest margin "
                    f"shown with {s.power:.0%} power when the true delta "
                    "is 0, and the smallest regression called one with that power (test of zero and point beyond the "
                    "margin), for the rule used, from the study's seed and shared eval variance "
                    "(mxlab/analysis/sensitivity.py).",
                ]
            ),
            BulletList(
                [f"**{name}**: {text}" for name, text in metrics.conventions(tuple(analysis.inputs.n_examples)).items()]
            ),
        ],
    )


def _runs_table(analysis: StudyAnalysis, logs: dict[str, dict[int, list[dict[str, Any]]]]) -> Table:
    rows, classes = [], []
    for (arm, seed), run in analysis.study.runs.items():
        records = logs.get(arm, {}).get(seed, [])
        last = records[-1] if records else {}
        skipped = sum(bool(r.get("skipped")) for r in records)
        rows.append(
            [
                arm,
                str(seed),
                run.status
                + (f" at step {run.diverged_at_step}" if run.status == "diverged" else "")
                + (f" ({run.reason})" if run.status == "skipped" and run.reason else ""),
                "-" if run.steps is None else str(run.steps),
                "-" if run.wall_s is None else f"{run.wall_s:.1f}",
                "-" if last.get("loss") is None else f"{last['loss']:.4f}",
                "-" if last.get("loss_scale") is None else f"{last['loss_scale']:g}",
                str(skipped),
            ]
        )
        classes.append("diverged" if run.status == "diverged" else "")
    return Table(
        ["arm", "seed", "status", "steps", "wall s", "last logged loss", "last loss scale", "skipped steps"],
        rows,
        classes,
    )


def _trained_with(analysis: StudyAnalysis) -> list[str]:
    """One item per (code, device) the runs' done.json record, naming its runs; [] when none records it."""
    groups: dict[str, list[str]] = {}
    for (arm, seed), run in analysis.study.runs.items():
        if run.status != "missing":
            code = (run.trained_with or {}).get("code") or {}
            key = (
                (
                    f"commit {code.get('commit')}"
                    + (" with uncommitted changes" if code.get("dirty") else "")
                    + f" on {run.trained_with.get('device')}"
                )
                if run.trained_with
                else "not recorded"
            )
            groups.setdefault(key, []).append(f"{arm}/{seed}")
    if set(groups) <= {"not recorded"}:
        return []
    return [f"**runs trained with** {key}: {', '.join(runs)}" for key, runs in groups.items()]


def _environment(analysis: StudyAnalysis) -> list[Block]:
    spec = analysis.study.spec
    blocks: list[Block] = [Heading("Environment and reproduction", 2)]
    environment = spec.get("environment")
    if isinstance(environment, dict) and environment:
        git = (
            environment.get("git")
            if isinstance(environment.get("git"), dict)
            else {"commit": environment.get("commit")}
        )
        commit = git.get("commit")
        items = [
            f"**code**: commit {commit}"
            + (f" (from {git['source']})" if git.get("source") else "")
            + (" with uncommitted changes" if git.get("dirty") else "")
            if commit
            else "**code**: commit not recorded (the study predates provenance records)"
        ]
        for key, value in environment.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k} {v}" for k, v in value.items())
            items.append(f"**{key}**: {value}")
        blocks.append(BulletList(items + _trained_with(analysis)))
    else:
        blocks.append(Paragraph("study.json records no environment."))
    command = spec.get("command")
    blocks.append(Paragraph("Reproduce the study (trains every run) and re-render this report from its run folders:"))
    blocks.append(
        CodeBlock(
            (
                command
                if isinstance(command, str)
                else " ".join(command)
                if command
                else "(study.json records no command)"
            )
            + f"\nmxlab report {analysis.study.directory}"
        )
    )
    resolved = {k: v for k, v in spec.items() if k not in ("environment", "command", "truth")}
    blocks.append(Details("resolved study spec (study.json)", [CodeBlock(json.dumps(resolved, indent=2))]))
    return blocks


# ----------------------------------------------------------------------------- entry points


def write_report(
    study_dir: str | os.PathLike, *, analysis: StudyAnalysis | None = None, settings: ReportSettings | None = None
) -> dict[str, Path]:
    """Write report.md, report.html (self-contained), summary.json and figures/*.png into the study folder.

    Returns {relative file name: path} for every file written; ``analysis`` reuses an already computed
    :func:`mxlab.analysis.analyze_study`; ``settings`` replaces the study's report settings (post hoc
    where they differ from the pre-registered ones). Reads files only; a run kept only as a record is read from
    it (mxlab.experiment.records). Refuses what analyze_study refuses.
    """
    with runs_for_report(Path(study_dir)) as runs_root:
        if analysis is None:
            analysis = analyze_study(load_study(study_dir, runs_root=runs_root), settings)
        return _write_report(Path(study_dir), analysis)


def _write_report(directory: Path, analysis: StudyAnalysis) -> dict[str, Path]:
    study = analysis.study
    written: dict[str, Path] = {}
    figures_dir = directory / "figures"

    def add_figure(name: str, draw: Callable[[Path], None]) -> Path:
        path = figures_dir / name
        io.write_file(path, lambda temporary: draw_png(draw, temporary))
        written[f"figures/{name}"] = path
        return Path("figures") / name

    non_baseline = [a for a in study.arms if a != study.baseline]
    n = analysis.inputs.n_examples
    heldout = heldout_series(study) if study.has_runs else {}
    unsettled = convergence_warning(heldout, study.baseline)
    rules = analysis.settings
    plateau = plateau_alert(heldout, study.spec, study.baseline, int(rules.plateau_window), rules.plateau_tolerance)
    note = constant_rate_note(analysis, not_converged=unsettled is not None)
    mixed = [Alert(QUESTIONS, text) for text in mixed_arm_warnings(study.runs_root, study.arms, study.seeds)]
    alerts = (
        mixed + [Alert(QUESTIONS, w) for w in [unsettled] if w] + warnings(analysis) + [w for w in [note, plateau] if w]
    )
    blocks: list[Block] = [Heading(f"Precision study: {study.name}", 1), *opening(analysis, alerts)]
    blocks.append(
        Paragraph(
            f"Baseline **{study.baseline}**; arms "
            f"{', '.join(f'**{a}**' for a in non_baseline) or '(none)'}; seeds {study.seeds}; "
            f"{_eval_size(n)} from {analysis.inputs.n_users} users. " + design_text(study.spec) + gate_text(study.spec)
        )
    )
    blocks += decision_section(analysis) + ship_table(analysis) + diagnostics(analysis) + _truth_ceiling(analysis)
    if analysis.comparisons:
        labels = {a: f"{a} ({len(r.diverged)} diverged)" for a, r in analysis.arms.items() if r.diverged}
        forest = add_figure(
            "forest.png",
            lambda p: figures.forest_plot(
                p,
                [c for c in analysis.comparisons if c.primary],
                analysis.aa,
                non_baseline,
                list(analysis.settings.primary),
                labels,
            ),
        )
        blocks.append(Figure(forest, "Primary metrics: delta and the interval its verdict rests on, per arm"))
    if study.has_runs:
        curves = reliability_curves(analysis)
        if any(curves.values()):
            reliability = add_figure("reliability.png", lambda p: figures.reliability_diagram(p, curves, study.arms))
            blocks.append(
                Figure(
                    reliability,
                    "Reliability: observed rate against mean prediction in equal-count bins, "
                    "pooled over finished seeds; log axes; dotted = perfect calibration",
                )
            )
    logs = {arm: {seed: read_training_log(study.run_dir(arm, seed)) for seed in study.seeds} for arm in study.arms}
    if any(records for seeds in logs.values() for records in seeds.values()):
        diverged = {(r.arm, r.seed): r.diverged_at_step for r in study.runs.values() if r.status == "diverged"}
        warmups = {seed: read_training_log(study.run_dir(WARMUP_ARM, seed)) for seed in study.seeds}
        shown = {**logs, WARMUP_ARM: warmups}
        training = add_figure("training.png", lambda p: figures.training_curves(p, shown, study.arms, diverged))
        caption = "Training loss and loss scale per run (one colour per arm, one line per seed"
        warm = "; dashed grey: the fork warm-ups the arms continue from" if any(warmups.values()) else ""
        blocks.append(Figure(training, caption + warm + ")"))
    if heldout:
        curves_path = add_figure("heldout.png", lambda p: figures.heldout_curves(p, heldout, study.arms))
        blocks.append(
            Figure(
                curves_path,
                "Convergence: held-out NE every train.eval_every steps, per run "
                "(dashed grey: the fork warm-ups the arms continue from)",
            )
        )
    # figures drawn from the runs by an earlier render stay valid without the run folders: the same runs
    kept = [] if study.has_runs else [name for name in RUN_FIGURES if (figures_dir / name).is_file()]
    for name in kept:
        blocks.append(
            Figure(
                Path("figures") / name,
                f"{name[:-4]} (drawn from the run folders by an earlier render; the runs are not here to redraw it)",
            )
        )
    blocks += [
        Heading("Details", 2),
        _secondary(analysis),
        controls_section(analysis),
        _per_seed(analysis),
        _absolute_metrics(analysis),
        Details("Runs", [_runs_table(analysis, logs)]),
    ]
    delong = _delong(analysis)
    if delong is not None:
        blocks.append(delong)
    numerics_by_arm = {
        arm: [r for seed in study.seeds for r in read_numerics(study.run_dir(arm, seed))] for arm in study.arms
    }
    if any(numerics_by_arm.values()):
        heatmap = add_figure("numerics.png", lambda p: figures.numerics_heatmap(p, numerics_by_arm))
        blocks.append(
            Details(
                "Per-layer numerics",
                [
                    Paragraph(
                        "From numerics.jsonl: SQNR of each quantized GEMM operand "
                        "against its high-precision shadow, and the fractions "
                        "of elements that saturated, flushed to zero or "
                        "became subnormal; mean over sampled steps and seeds."
                    ),
                    Figure(heatmap, "Per-layer numerics: rows are module / GEMM, columns are arms"),
                ],
            )
        )
    plans = [
        Details(
            f"{arm}" + (" (baseline)" if arm == study.baseline else ""),
            [
                CodeBlock(
                    next(
                        (t for s in study.seeds if (t := read_plan(study.run_dir(arm, s))) is not None), "(no plan.txt)"
                    )
                )
            ],
        )
        for arm in study.arms
    ]
    blocks += [Details("Recipes: the plan of each arm", plans), _method(analysis)] + _environment(analysis)

    for name in FIGURE_NAMES:  # a figure of an earlier render that this one has no data for would be stale
        if f"figures/{name}" not in written and name not in kept:
            (figures_dir / name).unlink(missing_ok=True)
    io.write_text(directory / "report.md", render_markdown(blocks))
    written["report.md"] = directory / "report.md"
    io.write_text(directory / "report.html", render_html(blocks, f"mxlab study {study.name}", directory))
    written["report.html"] = directory / "report.html"
    summary = analysis.to_dict()
    summary["files"] = sorted(set(written) | {f"figures/{name}" for name in kept}) + ["summary.json"]
    io.write_text(directory / "summary.json", json.dumps(summary, indent=2, allow_nan=False))
    written["summary.json"] = directory / "summary.json"
    return written
