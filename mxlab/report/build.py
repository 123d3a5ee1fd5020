"""Assemble a study's report (report.md, report.html, summary.json, figures/*.png) from its folder.

Reads only files (study.json and the run folders); runs are never retrained or re-evaluated.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mxlab import metrics
from mxlab.analysis import (DELTA_METRIC_BY_NAME, DELTA_METRICS, MetricComparison, StudyAnalysis, analyze_study,
                            load_study)
from mxlab.report import figures
from mxlab.report.document import (Block, BulletList, CodeBlock, Details, Figure, Heading, Paragraph, Table,
                                   render_html, render_markdown)
from mxlab.report.runs import read_numerics, read_plan, read_training_log

VERDICT_MARKS = {"regression": "**▼ REGRESSION**", "improvement": "▲ improvement", "neutral": "neutral",
                 "diverged": "**✖ DIVERGED**", "skipped": "skipped (not run)", "not compared": "not compared", None: ""}
RELIABILITY_BINS = 20
POSITIVES_PER_BIN = 15
FIGURE_NAMES = ("forest.png", "reliability.png", "training.png", "numerics.png")


# ----------------------------------------------------------------------------- formatting


def _decimals(metric: str, threshold: float | None) -> int:
    if threshold:
        return max(2, 2 - math.floor(math.log10(threshold)))
    return 4


def format_value(metric: str, value: float, threshold: float | None = None, signed: bool = True) -> str:
    """A delta or interval end with a precision fitted to the metric's threshold ('n/a' when not finite)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    text = f"{value:{'+' if signed else ''}.{_decimals(metric, threshold)}f}"
    return text + ("%" if metric == "ne_pct" else "")


def format_comparison(c: MetricComparison, with_verdict: bool = True) -> str:
    """'delta [low, high]' of the interval the verdict rests on, followed by the verdict when not neutral."""
    i = c.interval
    text = (f"{format_value(c.metric, c.delta, c.threshold)} "
            f"[{format_value(c.metric, i.low, c.threshold)}, {format_value(c.metric, i.high, c.threshold)}]")
    if with_verdict and c.verdict not in (None, "neutral"):
        text += " " + VERDICT_MARKS[c.verdict]
    return text


def _mean_sd(values: list[float], digits: int = 4) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


# ----------------------------------------------------------------------------- file writing


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_text(path: Path, text: str) -> None:
    _write_atomic(path, lambda temporary: temporary.write_text(text))


def draw_png(draw: Callable[[Path], None], temporary: Path) -> None:
    """Draw a figure into ``temporary`` as PNG (via a sibling .png name, renamed onto it)."""
    png = temporary.with_name(temporary.name + ".png")
    try:
        draw(png)
        os.replace(png, temporary)
    finally:
        png.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- sections


def _how_to_read(analysis: StudyAnalysis) -> list[Block]:
    s = analysis.settings
    base = analysis.study.baseline
    return [
        Heading("How to read this report", 2),
        Paragraph(
            f"Each **arm** is one precision recipe, trained on the same seeds (same initial weights and data order) "
            f"as the baseline **{base}** and evaluated on the same eval examples. A **delta** is arm minus baseline on "
            f"the same seed, averaged over seeds (NE in % of the baseline's NE; for AUC higher is better, for NE, "
            f"|calibration - 1| and ECE lower is better). Every delta has an interval. An arm **regresses** on a metric "
            f"when the interval excludes zero on the bad side *and* the delta is worse than the threshold "
            f"(AUC {s.auc_regression}, NE {s.ne_regression_pct}%, |calibration - 1| {s.calibration_tolerance}, "
            f"ECE {s.ece_regression}); an **improvement** is the mirror image; anything else is **neutral**, which means "
            f"\"no confident change beyond the threshold\", not \"identical\": look at the interval's width. "
            f"The intervals are family-wise: all {s.checks_per_arm} checks of an arm hold together with "
            f"{s.confidence:.0%} confidence (each at {s.interval_confidence:.2%}"
            + (", Bonferroni)" if s.multiple_testing == "bonferroni" else ")")
            + ". The **noise floor** (A/A, the last row of each headline table) shows how large deltas are when "
            "only the seed changes. "
            "Read the conclusions first, then the headline tables and the forest plot; the rest is detail."),
    ]


def _conclusions(analysis: StudyAnalysis) -> list[Block]:
    items = [f"**{r.arm}**: {r.conclusion.split(': ', 1)[1] if r.conclusion.startswith(r.arm + ': ') else r.conclusion}"
             for r in analysis.arms.values()]
    runs = analysis.study.runs.values()
    finished = sum(r.status == "finished" for r in runs)
    diverged = [f"{r.arm}/seed{r.seed} (step {r.diverged_at_step})" for r in runs if r.status == "diverged"]
    missing = [f"{r.arm}/seed{r.seed}" for r in runs if r.status == "missing"]
    skipped_by_reason: dict[str, list[str]] = {}
    for r in runs:
        if r.status == "skipped":
            skipped_by_reason.setdefault(r.reason or "no reason recorded", []).append(f"{r.arm}/seed{r.seed}")
    status = f"{finished} of {len(analysis.study.runs)} runs finished"
    if diverged:
        status += "; diverged (left out of every delta): " + ", ".join(diverged)
    for reason, names in skipped_by_reason.items():
        status += f"; skipped before training, the backend cannot run here (left out): {', '.join(names)} ({reason})"
    if missing:
        status += "; not run or not finished (left out): " + ", ".join(missing)
    return [Heading("Conclusions", 2), BulletList(items or ["The study has no arm besides the baseline."]),
            Paragraph(status + ".")]


def _basis_text(c: MetricComparison, analysis: StudyAnalysis) -> str:
    i = c.interval
    if c.basis == "t over seeds":
        return f"t over {i.n_seeds} seeds"
    return f"bootstrap† ({i.n_seeds} seed{'s' if i.n_seeds != 1 else ''}, {i.n_resamples} resamples)"


def _headline(analysis: StudyAnalysis) -> list[Block]:
    blocks: list[Block] = [Heading("Headline: deltas against the baseline", 2)]
    if not analysis.comparisons:
        return blocks + [Paragraph("No arm has a finished run paired with a finished baseline run: no deltas.")]
    metric_names = [m.name for m in DELTA_METRICS]
    for task in metrics.TASKS:
        header = ["arm", "arm verdict", "interval rests on"] + [
            f"{DELTA_METRIC_BY_NAME[m].label} delta" + (f" (thr {DELTA_METRIC_BY_NAME[m].threshold(analysis.settings):g})"
                                                        if DELTA_METRIC_BY_NAME[m].worse_when else "")
            for m in metric_names]
        rows, classes = [], []
        for arm, result in analysis.arms.items():
            cells = [analysis.comparison(arm, task, m) for m in metric_names]
            if cells[0] is None:
                rows.append([arm, VERDICT_MARKS.get(result.verdict, result.verdict), "-"] + ["-"] * len(metric_names))
            else:
                rows.append([arm, VERDICT_MARKS.get(result.verdict, result.verdict), _basis_text(cells[0], analysis)]
                            + [format_comparison(c) for c in cells])
            task_verdicts = {c.verdict for c in cells if c is not None}
            classes.append("diverged" if result.verdict == "diverged" else "regression" if "regression" in task_verdicts
                           else "improvement" if "improvement" in task_verdicts else "")
        if analysis.noise_floor:
            noise = {c.metric: c for c in analysis.noise_floor if c.task == task}
            rows.append([f"A/A noise: {analysis.study.baseline} reseeded", "-", _basis_text(noise[metric_names[0]], analysis)]
                        + [format_comparison(noise[m]) for m in metric_names])
            classes.append("")
        examples = analysis.n_examples.get(task, 0)
        blocks += [Heading(f"{task.upper()}: {metrics.TASK_DESCRIPTIONS[task]}", 3),
                   Table(header, rows, classes),
                   Paragraph(f"Each interval rests on {examples} eval examples from {analysis.n_users} users and the seeds "
                             f"named in its row; delta [interval] then the verdict when it is not neutral.")]
    rows = []
    for c in analysis.comparisons:
        per_seed = "; ".join(
            f"seed {seed}: {format_value(c.metric, value, c.threshold)} "
            f"[{format_value(c.metric, c.bootstrap_per_seed[seed].low, c.threshold)}, "
            f"{format_value(c.metric, c.bootstrap_per_seed[seed].high, c.threshold)}]"
            for seed, value in c.per_seed.items())
        t_text = "-" if c.t_interval is None else (f"[{format_value(c.metric, c.t_interval.low, c.threshold)}, "
                                                   f"{format_value(c.metric, c.t_interval.high, c.threshold)}]")
        pooled = f"[{format_value(c.metric, c.bootstrap.low, c.threshold)}, {format_value(c.metric, c.bootstrap.high, c.threshold)}]"
        rows.append([c.arm, c.task.upper(), DELTA_METRIC_BY_NAME[c.metric].label, per_seed, t_text, pooled])
    blocks.append(Details("Per-seed deltas with their bootstrap intervals, the t-interval over seeds and the pooled bootstrap",
                          [Table(["arm", "task", "metric", "per seed: delta [bootstrap interval]", "t-interval over seeds",
                                  "pooled bootstrap"], rows)]))
    blocks.append(Paragraph(
        "† bootstrap: with fewer than "
        f"{analysis.settings.min_seeds_for_t} paired seeds the verdict rests on the paired user bootstrap over eval "
        "examples (the same user resample for the arm and the baseline, pooled over seeds). It covers eval sampling "
        "only, not the noise of retraining with another seed: compare such deltas with the noise floor below."))
    return blocks


def _noise_floor(analysis: StudyAnalysis) -> list[Block]:
    blocks: list[Block] = [Heading("Noise floor (A/A)", 2), Paragraph(analysis.noise_floor_note)]
    if not analysis.noise_floor:
        return blocks
    header = ["task", "metric", "A/A delta per seed", "largest |A/A delta|", "threshold", "mean [interval]", "verdict"]
    rows, classes = [], []
    below_noise = []
    for c in analysis.noise_floor:
        per_seed = ", ".join(f"seed {s}: {format_value(c.metric, v, c.threshold)}" for s, v in c.per_seed.items())
        largest = max(abs(v) for v in c.per_seed.values())
        if c.threshold is not None and largest > c.threshold:
            below_noise.append(f"{c.task.upper()} {DELTA_METRIC_BY_NAME[c.metric].label}")
        rows.append([c.task.upper(), DELTA_METRIC_BY_NAME[c.metric].label, per_seed,
                     format_value(c.metric, largest, c.threshold, signed=False),
                     "-" if c.threshold is None else format_value(c.metric, c.threshold, c.threshold, signed=False),
                     format_comparison(c, with_verdict=False), VERDICT_MARKS[c.verdict] or "-"])
        classes.append(c.verdict if c.verdict in ("regression", "improvement") else "")
    flagged = [c for c in analysis.noise_floor if c.verdict in ("regression", "improvement")]
    verdict_text = ("The A/A comparison is judged neutral on every check, as it should be." if not flagged else
                    f"The A/A comparison is flagged on {len(flagged)} check(s) although nothing but the seed changed: "
                    "intervals of this study understate the noise; treat verdicts of the same kind with caution.")
    if below_noise:
        verdict_text += (" Reseeding alone moves " + ", ".join(below_noise) + " by more than the threshold: a single "
                         "run cannot resolve effects of the threshold's size there; verdicts need several seeds.")
    return blocks + [Table(header, rows, classes), Paragraph(verdict_text)]


def _absolute_metrics(analysis: StudyAnalysis) -> list[Block]:
    blocks: list[Block] = [Heading("Metrics per arm (mean ± sd over finished seeds)", 2)]
    names = ["auc", "gauc", "gauc_users", "log_loss", "ne", "calibration", "ece", "mae_truth", "calibration_truth"]
    digits = {"gauc_users": 0}
    for task in metrics.TASKS:
        present = [n for n in names if any(n in m[task] for seeds in analysis.run_metrics.values() for m in seeds.values())]
        header = ["arm", "seeds"] + present
        rows = []
        for arm in analysis.study.arms:
            seeds = analysis.run_metrics.get(arm, {})
            rows.append([arm + (" (baseline)" if arm == analysis.study.baseline else ""), str(len(seeds))]
                        + [_mean_sd([m[task].get(n, math.nan) for m in seeds.values()], digits.get(n, 4)) for n in present])
        if analysis.truth and task in analysis.truth:
            rows.append(["truth (ceiling)", "-"] + [_mean_sd([analysis.truth[task].get(n, math.nan)], digits.get(n, 4))
                                                    for n in present])
        blocks += [Heading(task.upper(), 3), Table(header, rows)]
    if analysis.truth:
        blocks.append(Paragraph("The truth row scores the data's true probabilities as predictions: the best any model "
                                "can do on this eval set (synthetic data only)."))
    return blocks


def _delong(analysis: StudyAnalysis) -> list[Block]:
    if not analysis.delong:
        return []
    rows = [[arm, str(seed), task.upper(), f"{r.auc_a:.5f}", f"{r.auc_b:.5f}", f"{r.delta:+.5f}", f"{r.se:.5f}",
             f"{r.z:+.2f}", f"{r.p_value:.3g}"]
            for (arm, task, seed), r in sorted(analysis.delong.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1]))]
    return [Heading("DeLong tests of the AUC difference, per seed", 2),
            Paragraph("DeLong's variance of the paired AUC difference on one seed's eval set (examples treated as "
                      "independent; the user bootstrap above accounts for users). p is two-sided and not adjusted "
                      "for multiple tests."),
            Details(f"{len(rows)} tests", [Table(["arm", "seed", "task", "AUC arm", "AUC baseline", "delta", "se", "z", "p"], rows)])]


def _runs_table(analysis: StudyAnalysis, logs: dict[str, dict[int, list[dict[str, Any]]]]) -> Table:
    rows, classes = [], []
    for (arm, seed), run in analysis.study.runs.items():
        records = logs.get(arm, {}).get(seed, [])
        last = records[-1] if records else {}
        skipped = sum(bool(r.get("skipped")) for r in records)
        rows.append([arm, str(seed), run.status + (f" at step {run.diverged_at_step}" if run.status == "diverged" else "")
                     + (f" ({run.reason})" if run.status == "skipped" and run.reason else ""),
                     "-" if run.steps is None else str(run.steps), "-" if run.wall_s is None else f"{run.wall_s:.1f}",
                     "-" if last.get("loss") is None else f"{last['loss']:.4f}",
                     "-" if last.get("loss_scale") is None else f"{last['loss_scale']:g}", str(skipped)])
        classes.append("diverged" if run.status == "diverged" else "")
    return Table(["arm", "seed", "status", "steps", "wall s", "last logged loss", "last loss scale", "skipped steps"],
                 rows, classes)


def _conventions(analysis: StudyAnalysis) -> list[Block]:
    s = analysis.settings
    rules = [
        f"Pairing: arm and baseline on the same seed and the same eval examples; the delta of a study is the mean of the per-seed deltas.",
        f"Intervals: with {s.min_seeds_for_t} or more paired seeds, a Student-t interval over the per-seed deltas "
        f"(training noise and eval sampling); with fewer, the paired user bootstrap ({s.bootstrap_resamples} resamples of "
        f"users with replacement, seed {s.bootstrap_seed}; the same resample weights every run; interval = delta ± z × "
        f"bootstrap sd; ECE bins fixed from the original sample).",
        f"Confidence: {s.confidence:.0%} family-wise per arm over {s.checks_per_arm} checks "
        f"(multiple_testing = {s.multiple_testing!r}: each interval at {s.interval_confidence:.3%}).",
        f"Thresholds (study.json [report]): auc_regression {s.auc_regression}, ne_regression_pct {s.ne_regression_pct} (%), "
        f"calibration_tolerance {s.calibration_tolerance} (on |calibration - 1|), ece_regression {s.ece_regression}.",
        "Verdict: regression = interval excludes zero on the bad side and the delta is worse than the threshold; "
        "improvement = the mirror image; otherwise neutral. An arm regresses when any of its checks does; "
        "a diverged run is left out of the deltas and makes the arm's verdict 'diverged'.",
        "NE delta = 100 × (NE_arm / NE_baseline − 1); |cal−1| delta = |cal_arm − 1| − |cal_baseline − 1| (the judged "
        "calibration metric); calibration delta = cal_arm − cal_baseline (direction only).",
    ]
    return [Heading("Conventions", 2),
            BulletList([f"**{name}**: {text}" for name, text in metrics.METRIC_CONVENTIONS.items()]),
            Paragraph("How deltas, intervals and verdicts are formed:"),
            BulletList(rules)]


def _environment(analysis: StudyAnalysis) -> list[Block]:
    spec = analysis.study.spec
    blocks: list[Block] = [Heading("Environment and reproduction", 2)]
    environment = spec.get("environment")
    if isinstance(environment, dict) and environment:
        items = []
        for key, value in environment.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k} {v}" for k, v in value.items())
            items.append(f"**{key}**: {value}")
        blocks.append(BulletList(items))
    else:
        blocks.append(Paragraph("study.json records no environment."))
    command = spec.get("command")
    blocks.append(Paragraph("Reproduce the study (trains every run) and re-render this report from its run folders:"))
    blocks.append(CodeBlock((command if isinstance(command, str) else " ".join(command) if command else
                             "(study.json records no command)") + f"\nmxlab report {analysis.study.directory}"))
    resolved = {k: v for k, v in spec.items() if k not in ("environment", "command", "truth")}
    blocks.append(Details("resolved study spec (study.json)", [CodeBlock(json.dumps(resolved, indent=2))]))
    return blocks


# ----------------------------------------------------------------------------- entry points


def _reliability_curves(analysis: StudyAnalysis) -> dict[str, dict[str, metrics.ReliabilityBins]]:
    """Equal-count reliability bins per task and arm, pooled over the arm's finished seeds."""
    curves: dict[str, dict[str, metrics.ReliabilityBins]] = {task: {} for task in metrics.TASKS}
    study = analysis.study
    for arm in study.arms:
        pooled: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {t: ([], []) for t in metrics.TASKS}
        for seed in study.finished_seeds(arm):
            views = metrics.task_views(metrics.load_eval(study.run_dir(arm, seed) / "eval.npz"))
            for task, view in views.items():
                pooled[task][0].append(view.labels)
                pooled[task][1].append(np.asarray(view.probs, dtype=np.float64))
        for task, (labels, probs) in pooled.items():
            if labels:
                y, p = np.concatenate(labels), np.concatenate(probs)
                n_bins = reliability_bin_count(int(y.sum()) // len(labels), y.size)
                curves[task][arm] = metrics.reliability_bins(y, p, n_bins)
    return curves


def reliability_bin_count(positives_per_seed: int, n: int) -> int:
    """Bins for a reliability diagram: up to RELIABILITY_BINS, with about POSITIVES_PER_BIN positives of one
    seed's eval set in each (so few bins hold no positive at all), at least 3."""
    return int(min(n, max(3, min(RELIABILITY_BINS, positives_per_seed // POSITIVES_PER_BIN))))


def write_report(study_dir: str | os.PathLike, *, n_resamples: int | None = None,
                 analysis: StudyAnalysis | None = None) -> dict[str, Path]:
    """Write report.md, report.html (self-contained), summary.json and figures/*.png into the study folder.

    Returns {relative file name: path} for every file written. ``n_resamples`` overrides the bootstrap
    size of study.json; ``analysis`` reuses an already computed :func:`mxlab.analysis.analyze_study`.
    Reads files only. Refuses what :func:`mxlab.analysis.analyze_study` refuses.
    """
    directory = Path(study_dir)
    if analysis is None:
        analysis = analyze_study(directory, n_resamples=n_resamples)
    study = analysis.study
    written: dict[str, Path] = {}
    figures_dir = directory / "figures"

    def add_figure(name: str, draw: Callable[[Path], None]) -> Path:
        path = figures_dir / name
        _write_atomic(path, lambda temporary: draw_png(draw, temporary))
        written[f"figures/{name}"] = path
        return Path("figures") / name

    logs = {arm: {seed: read_training_log(study.run_dir(arm, seed)) for seed in study.seeds} for arm in study.arms}
    numerics_by_arm = {arm: [r for seed in study.seeds for r in read_numerics(study.run_dir(arm, seed))] for arm in study.arms}
    non_baseline = [a for a in study.arms if a != study.baseline]

    blocks: list[Block] = [Heading(f"Precision study: {study.name}", 1),
                           Paragraph(f"Baseline **{study.baseline}**; arms {', '.join(f'**{a}**' for a in non_baseline) or '(none)'}; "
                                     f"seeds {study.seeds}; {analysis.n_examples.get('ctr', 0)} eval impressions "
                                     f"({analysis.n_examples.get('cvr', 0)} clicked) from {analysis.n_users} users.")]
    blocks += _how_to_read(analysis) + _conclusions(analysis) + _headline(analysis)
    if analysis.comparisons:
        labels = {arm: f"{arm} (diverged: {len(r.diverged)} seed{'s' if len(r.diverged) > 1 else ''} left out)"
                  for arm, r in analysis.arms.items() if r.diverged}
        forest = add_figure("forest.png", lambda p: figures.forest_plot(p, analysis.comparisons, analysis.noise_floor,
                                                                         non_baseline, labels))
        blocks.append(Figure(forest, "Forest plot: each arm's delta per task and metric with the interval its verdict rests on"))
    blocks += _noise_floor(analysis) + _absolute_metrics(analysis)

    curves = _reliability_curves(analysis)
    if any(curves.values()):
        reliability = add_figure("reliability.png", lambda p: figures.reliability_diagram(p, curves, study.arms))
        blocks += [Heading("Reliability diagrams", 2),
                   Figure(reliability, f"Observed rate against mean prediction in equal-count bins (up to "
                                       f"{RELIABILITY_BINS}, about {POSITIVES_PER_BIN} positives per bin and seed), pooled "
                                       "over finished seeds; log axes, so a bin without positives is not drawn; the "
                                       "dotted diagonal is perfect calibration")]
    blocks += _delong(analysis)

    blocks.append(Heading("Training", 2))
    if any(records for seeds in logs.values() for records in seeds.values()):
        diverged = {(r.arm, r.seed): r.diverged_at_step for r in study.runs.values() if r.status == "diverged"}
        training = add_figure("training.png", lambda p: figures.training_curves(p, logs, study.arms, diverged))
        blocks.append(Figure(training, "Training loss and loss scale per run (one colour per arm, one line per seed)"))
    blocks.append(_runs_table(analysis, logs))

    if any(numerics_by_arm.values()):
        heatmap = add_figure("numerics.png", lambda p: figures.numerics_heatmap(p, numerics_by_arm))
        blocks += [Heading("Per-layer numerics", 2),
                   Paragraph("From numerics.jsonl (diagnostics sampled during training): SQNR of each quantized GEMM "
                             "operand against its high-precision shadow, and the fractions of elements that saturated, "
                             "flushed to zero or became subnormal; mean over sampled steps and seeds."),
                   Figure(heatmap, "Per-layer numerics: rows are module / GEMM, columns are arms")]
    else:
        blocks += [Heading("Per-layer numerics", 2), Paragraph("No run recorded numerics (diagnostics were off).")]

    plans: list[Block] = []
    for arm in study.arms:
        plan = next((text for seed in study.seeds if (text := read_plan(study.run_dir(arm, seed))) is not None), None)
        plans.append(Details(f"{arm}" + (" (baseline)" if arm == study.baseline else ""),
                             [CodeBlock(plan if plan is not None else "(no plan.txt)")]))
    blocks += [Heading("Recipes: the plan of each arm", 2),
               Paragraph("Which precision each GEMM of each module got (plan.txt of the arm's first run).")] + plans
    blocks += _conventions(analysis) + _environment(analysis)

    for name in FIGURE_NAMES:  # a figure of an earlier render that this one has no data for would be stale
        if f"figures/{name}" not in written:
            (figures_dir / name).unlink(missing_ok=True)
    _write_text(directory / "report.md", render_markdown(blocks))
    written["report.md"] = directory / "report.md"
    _write_text(directory / "report.html", render_html(blocks, f"mxlab study {study.name}", directory))
    written["report.html"] = directory / "report.html"
    summary = analysis.to_dict()
    summary["files"] = sorted(written) + ["summary.json"]
    _write_text(directory / "summary.json", json.dumps(summary, indent=2, allow_nan=False))
    written["summary.json"] = directory / "summary.json"
    return written


# ----------------------------------------------------------------------------- comparing studies


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _summary(directory: Path) -> dict[str, Any]:
    path = directory / "summary.json"
    if path.is_file():
        return json.loads(path.read_text())
    return analyze_study(directory).to_dict()


def compare_studies(dir_a: str | os.PathLike, dir_b: str | os.PathLike) -> str:
    """Markdown: how two studies differ in their spec (study.json, key by key) and in their deltas and
    verdicts for the arms they share. Uses each study's summary.json when present, else analyzes it
    (files only). Refuses folders without study.json."""
    a_dir, b_dir = Path(dir_a), Path(dir_b)
    study_a, study_b = load_study(a_dir), load_study(b_dir)
    flat_a, flat_b = _flatten(study_a.spec), _flatten(study_b.spec)
    lines = [f"# Comparing studies A = `{a_dir}` ({study_a.name}) and B = `{b_dir}` ({study_b.name})", ""]
    differing = [k for k in sorted(set(flat_a) | set(flat_b)) if flat_a.get(k, "(absent)") != flat_b.get(k, "(absent)")
                 and not k.startswith("truth.") and k != "created"]
    lines += ["## Spec differences", ""]
    if differing:
        lines += ["| key | A | B |", "|---|---|---|"]
        lines += [f"| {k} | {json.dumps(flat_a.get(k, '(absent)'))} | {json.dumps(flat_b.get(k, '(absent)'))} |" for k in differing]
    else:
        lines.append("The two specs are identical.")
    summary_a, summary_b = _summary(a_dir), _summary(b_dir)
    arms = [a for a in study_a.arms if a in study_b.arms and a not in (study_a.baseline, study_b.baseline)]
    lines += ["", "## Verdicts", ""]
    lines += ["| arm | A | B |", "|---|---|---|"] if arms else ["The studies share no compared arm."]
    for arm in arms:
        va = summary_a["verdicts"].get(arm, {}).get("verdict", "-")
        vb = summary_b["verdicts"].get(arm, {}).get("verdict", "-")
        lines.append(f"| {arm} | {va} | {vb}{' (changed)' if va != vb else ''} |")
    only_a = [a for a in study_a.arms if a not in study_b.arms]
    only_b = [b for b in study_b.arms if b not in study_a.arms]
    if only_a or only_b:
        lines += ["", f"Arms only in A: {only_a or 'none'}; only in B: {only_b or 'none'}."]
    if study_a.baseline != study_b.baseline:
        lines += ["", f"**The baselines differ** (A: {study_a.baseline}, B: {study_b.baseline}): deltas are not comparable."]

    def index(summary: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
        return {(c["arm"], c["task"], c["metric"]): c for c in summary["comparisons"]}

    comps_a, comps_b = index(summary_a), index(summary_b)

    def cell(c: dict[str, Any] | None) -> str:
        if c is None:
            return "-"
        i = c["interval"]
        fmt = lambda v: "n/a" if v is None else format_value(c["metric"], v, c["threshold"])  # noqa: E731
        verdict = c.get("verdict")
        return f"{fmt(c['delta'])} [{fmt(i['low'])}, {fmt(i['high'])}]" + (f" {verdict}" if verdict not in (None, "neutral") else "")

    if not arms:
        return "\n".join(lines) + "\n"
    lines += ["", "## Deltas against each study's baseline", "",
              "| arm | task | metric | A | B | B - A |", "|---|---|---|---|---|---|"]
    for arm in arms:
        for task in metrics.TASKS:
            for metric in DELTA_METRICS:
                ca, cb = comps_a.get((arm, task, metric.name)), comps_b.get((arm, task, metric.name))
                if ca is None and cb is None:
                    continue
                shift = "-" if ca is None or cb is None or ca["delta"] is None or cb["delta"] is None else \
                    format_value(metric.name, cb["delta"] - ca["delta"], ca["threshold"])
                lines.append(f"| {arm} | {task.upper()} | {metric.label} | {cell(ca)} | {cell(cb)} | {shift} |")
    return "\n".join(lines) + "\n"
