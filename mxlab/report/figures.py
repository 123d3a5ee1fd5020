"""The report's figures (matplotlib, Agg canvas; no pyplot state, no display needed).

Each function draws one PNG from already-computed results and returns nothing; the caller
chooses the path. They read no run folders themselves, except that the caller passes the
arrays it has read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from mxlab import metrics
from mxlab.analysis import Comparison

VERDICT_COLORS = {
    "regression": "#d62728",
    "improvement": "#2ca02c",
    "non-inferior": "#1f77b4",
    "equivalent": "#1f77b4",
    "inconclusive": "#555555",
    None: "#555555",
}
ARM_PALETTE = [
    "#000000",
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
]
DPI = 100


def _new_figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def arm_colors(arms: Sequence[str]) -> dict[str, str]:
    """A fixed colour per arm, in study order (the baseline, first, is black)."""
    return {arm: ARM_PALETTE[i % len(ARM_PALETTE)] for i, arm in enumerate(arms)}


def forest_plot(
    path: Path,
    comparisons: list[Comparison],
    controls: list[Comparison],
    arms: Sequence[str],
    metric_names: Sequence[str],
    row_labels: Mapping[str, str] | None = None,
) -> None:
    """Deltas against the baseline with the interval each verdict rests on: one panel per primary metric,
    one row per arm (labelled ``row_labels[arm]`` when given) plus the A/A control; the shaded band is
    +- the margin."""
    rows = list(arms) + (["A/A"] if controls else [])
    figure = _new_figure(max(3.6 * len(metric_names), 6.0), 1.5 + 0.34 * len(rows))
    axes = figure.subplots(1, len(metric_names), squeeze=False)[0]
    by_key = {(c.arm, c.metric): c for c in list(comparisons) + list(controls)}
    for j, metric in enumerate(metric_names):
        ax = axes[j]
        margin = None
        for y, arm in enumerate(rows):
            c = by_key.get((arm, metric))
            if c is None or not np.isfinite(c.delta):
                ax.text(0, y, "no data", ha="center", va="center", fontsize=7, color="#999999")
                continue
            margin = c.margin
            color = VERDICT_COLORS.get(c.verdict, "#555555") if arm != "A/A" else "#999999"
            if np.isfinite(c.low) and np.isfinite(c.high):
                ax.plot([c.low, c.high], [y, y], color=color, lw=2)
            ax.plot([c.delta], [y], "o", color=color, markersize=6)
        if margin:
            ax.axvspan(-margin, margin, color="#dddddd", alpha=0.6, lw=0)
        ax.axvline(0, color="#333333", lw=0.8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([(row_labels or {}).get(r, r) for r in rows] if j == 0 else [""] * len(rows), fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.tick_params(axis="x", labelsize=7)
        worse = "left" if metric.endswith(".auc") else "either side" if metric.endswith(".calibration") else "right"
        ax.set_title(f"{metric} delta (worse: {worse})", fontsize=9)
    figure.suptitle(
        "Delta against the baseline (dot) and the interval its verdict rests on (bar)\nred = regression, "
        "green = improvement, blue = non-inferior or equivalent, grey = inconclusive; shaded = within the margin",
        fontsize=8,
    )
    figure.savefig(path)


def reliability_diagram(
    path: Path, curves: Mapping[str, Mapping[str, metrics.ReliabilityBins]], arms: Sequence[str]
) -> None:
    """Mean label against mean prediction in equal-count bins, one panel per task, one line per arm
    (``curves[task][arm]``; a panel per task of ``curves``, every task when it is empty); log-log axes, the
    diagonal is perfect calibration."""
    colors = arm_colors(arms)
    tasks = [task for task in metrics.TASKS if task in curves] or list(metrics.TASKS)
    figure = _new_figure(4.2 * len(tasks), 4.0)
    axes = figure.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        low, high = 1.0, 0.0
        for rank, arm in enumerate(arms):
            bins = curves.get(task, {}).get(arm)
            if bins is None:
                continue
            x, y = bins.mean_prediction, bins.mean_label
            positive = (x > 0) & (y > 0)
            ax.plot(
                x[positive],
                y[positive],
                "-o",
                color=colors[arm],
                lw=2.2 if rank == 0 else 1.2,
                markersize=3,
                label=arm + (" (baseline)" if rank == 0 else ""),
            )
            if positive.any():
                low, high = (
                    min(low, x[positive].min(), y[positive].min()),
                    max(high, x[positive].max(), y[positive].max()),
                )
        if high > low:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.plot([low, high], [low, high], ":", color="#888888", lw=1, label="perfect calibration")
        ax.set_xlabel("mean prediction in bin", fontsize=8)
        ax.set_ylabel("observed rate in bin", fontsize=8)
        ax.set_title(f"{task.upper()} reliability", fontsize=10)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left")
    figure.savefig(path)


def training_curves(
    path: Path,
    logs: Mapping[str, Mapping[int, list[dict[str, Any]]]],
    arms: Sequence[str],
    diverged: Mapping[tuple[str, int], int | None],
) -> None:
    """Training loss (left) and loss scale with skipped steps (right) against step; one colour per arm,
    one line per seed; a cross marks where a run diverged."""
    colors = arm_colors(arms)
    figure = _new_figure(12, 4.0)
    loss_ax, scale_ax = figure.subplots(1, 2)
    for arm in arms:
        for n, (seed, records) in enumerate(sorted(logs.get(arm, {}).items())):
            if not records:
                continue
            steps = np.array([r["step"] for r in records], dtype=float)
            loss = np.array([np.nan if r.get("loss") is None else r["loss"] for r in records], dtype=float)
            label = arm if n == 0 else None
            loss_ax.plot(steps, loss, color=colors[arm], lw=1.0, alpha=0.85, label=label)
            scale = np.array([np.nan if r.get("loss_scale") is None else r["loss_scale"] for r in records], dtype=float)
            scale_ax.plot(steps, scale, color=colors[arm], lw=1.0, alpha=0.85, label=label, drawstyle="steps-post")
            skipped = np.array([bool(r.get("skipped")) for r in records])
            if skipped.any():
                scale_ax.plot(steps[skipped], scale[skipped], "v", color=colors[arm], markersize=4)
            if (arm, seed) in diverged:
                finite = np.isfinite(loss)
                if finite.any():
                    last = np.flatnonzero(finite)[-1]
                    loss_ax.plot([steps[last]], [loss[last]], "X", color="#d62728", markersize=9)
    loss_ax.set_title("training loss (ESMM total) per run; X = diverged", fontsize=10)
    loss_ax.set_xlabel("step", fontsize=8)
    loss_ax.set_ylabel("loss", fontsize=8)
    scale_ax.set_title("loss scale per run; triangles = skipped steps", fontsize=10)
    scale_ax.set_xlabel("step", fontsize=8)
    scale_ax.set_yscale("log", base=2)
    for ax in (loss_ax, scale_ax):
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    figure.savefig(path)


NUMERICS_PANELS = (
    ("sqnr_db", "SQNR (dB, higher is better)", 1.0, "viridis"),
    ("saturated_frac", "saturated (% of elements)", 100.0, "Reds"),
    ("flushed_frac", "flushed to zero (% of elements)", 100.0, "Reds"),
    ("subnormal_frac", "subnormal (% of elements)", 100.0, "Oranges"),
)


def numerics_table(
    records_by_arm: Mapping[str, list[dict[str, Any]]],
) -> tuple[list[str], list[str], dict[str, np.ndarray]]:
    """(row labels "module / gemm", arms, {key: (rows, arms) mean over steps and seeds}) from numerics records.
    Non-finite values (an exact GEMM has infinite SQNR) are left out of the means."""
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    rows: dict[str, None] = {}
    arms = [arm for arm, records in records_by_arm.items() if records]
    for arm in arms:
        for r in records_by_arm[arm]:
            row = f"{r['module']} / {r['gemm']}"
            rows.setdefault(row, None)
            for key, *_ in NUMERICS_PANELS:
                value = r.get(key)
                if value is not None and np.isfinite(value):
                    sums[(key, row, arm)].append(float(value))
    labels = list(rows)
    tables = {}
    for key, *_ in NUMERICS_PANELS:
        table = np.full((len(labels), len(arms)), np.nan)
        for i, row in enumerate(labels):
            for j, arm in enumerate(arms):
                values = sums.get((key, row, arm))
                if values:
                    table[i, j] = np.mean(values)
        tables[key] = table
    return labels, arms, tables


def numerics_heatmap(path: Path, records_by_arm: Mapping[str, list[dict[str, Any]]]) -> None:
    """Per-layer heatmaps (rows: module / GEMM, columns: arms) of SQNR, saturation, flush-to-zero and
    subnormal fractions, averaged over the sampled steps and seeds."""
    labels, arms, tables = numerics_table(records_by_arm)
    figure = _new_figure(2.4 + 0.8 * len(arms) * len(NUMERICS_PANELS), 1.6 + 0.28 * len(labels))
    axes = figure.subplots(1, len(NUMERICS_PANELS), squeeze=False)[0]
    annotate = len(labels) * len(arms) <= 160
    for n, (ax, (key, title, scale, cmap)) in enumerate(zip(axes, NUMERICS_PANELS)):
        values = tables[key] * scale
        image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap=cmap)
        colorbar = figure.colorbar(image, ax=ax, shrink=0.8)
        colorbar.ax.tick_params(labelsize=7)
        ax.set_xticks(range(len(arms)))
        ax.set_xticklabels(arms, rotation=35, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels if n == 0 else [""] * len(labels), fontsize=7)
        ax.set_title(title, fontsize=9)
        if annotate:
            for i in range(len(labels)):
                for j in range(len(arms)):
                    if np.isfinite(values[i, j]):
                        shade = float(image.norm(values[i, j]))  # 0..1 along the colour map
                        dark = shade < 0.5 if cmap == "viridis" else shade > 0.6
                        ax.text(
                            j,
                            i,
                            f"{values[i, j]:.3g}",
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="white" if dark else "black",
                        )
    figure.savefig(path)


def heldout_curves(
    path: Path,
    series: Mapping[str, Mapping[int, list[tuple[int, Mapping[str, Any]]]]],
    arms: Sequence[str],
    metrics_shown: Sequence[str] | None = None,
) -> None:
    """Held-out NE (one panel per metric; by default ctr.ne and ctcvr.ne, each where a record holds it) against
    step; one colour per arm, one line per seed; the fork warm-ups ("_fork", grey, dashed) lead into the arms
    that continue from them."""
    if metrics_shown is None:
        held = {key for seeds in series.values() for points in seeds.values() for _, record in points for key in record}
        metrics_shown = [m for m in ("ctr.ne", "ctcvr.ne") if m in held] or ["ctr.ne"]
    colors = {**arm_colors(arms), "_fork": "#7f7f7f"}
    figure = _new_figure(6 * len(metrics_shown), 4.0)
    axes = np.atleast_1d(figure.subplots(1, len(metrics_shown)))
    for ax, metric in zip(axes, metrics_shown):
        for arm, seeds in series.items():
            for n, (_, points) in enumerate(sorted(seeds.items())):
                steps = np.array([p[0] for p in points], dtype=float)
                values = np.array([np.nan if p[1].get(metric) is None else p[1][metric] for p in points], dtype=float)
                ax.plot(
                    steps,
                    values,
                    color=colors.get(arm, "#17becf"),
                    lw=1.0,
                    alpha=0.85,
                    marker=".",
                    ls="--" if arm == "_fork" else "-",
                    label=(("fork warm-up" if arm == "_fork" else arm) if n == 0 else None),
                )
        ax.set_title(f"held-out {metric} per run (lower is better)", fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    figure.savefig(path)
