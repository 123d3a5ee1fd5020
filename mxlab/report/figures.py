"""The report's figures (matplotlib, Agg canvas; no pyplot state, no display needed).

Each function draws one PNG from already-computed results and returns the drawn Figure; the caller
chooses the path. They read no run folders themselves, except that the caller passes the
arrays it has read. Step axes tick at integers; legends sit inside the image (a figure-level
legend beside the panels where all panels share one); a panel whose every series is constant
is not drawn, and the figure says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter

from mxlab import metrics
from mxlab.analysis import Comparison
from mxlab.report.convergence import WARMUP_ARM

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
WARMUP_STYLE = {"color": "#7f7f7f", "ls": "--"}  # the fork warm-ups, before the arms continue them


def _new_figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> Figure:
    """Write the figure to ``path`` (legends and labels within the saved image) and return it."""
    figure.savefig(path, bbox_inches="tight", pad_inches=0.05)
    return figure


def _step_axis(ax: Any) -> None:
    """Label the x axis 'step' and tick it at integers only."""
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _shared_legend(figure: Figure, axes: Sequence[Any]) -> None:
    """One legend for all panels (their labels in first-seen order), outside the panels on the right, inside
    the image; none when no line is labelled."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        figure.legend(list(seen.values()), list(seen), loc="outside right upper", fontsize=7)


def is_flat(series: Sequence[Sequence[float]]) -> bool:
    """True when every finite value of every series is the same number (or there is none): a flat panel."""
    values = np.concatenate([np.asarray(s, dtype=float).ravel() for s in series]) if series else np.array([])
    values = values[np.isfinite(values)]
    return values.size == 0 or bool(np.all(values == values[0]))


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
) -> Figure:
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
    return _save(figure, path)


def reliability_diagram(
    path: Path, curves: Mapping[str, Mapping[str, metrics.ReliabilityBins]], arms: Sequence[str]
) -> Figure:
    """Mean label against mean prediction in equal-count bins, one panel per task, one line per arm
    (``curves[task][arm]``; a panel per task of ``curves``, every task when it is empty); log-log axes, the
    diagonal is perfect calibration."""
    colors = arm_colors(arms)
    tasks = list(curves) or list(metrics.TASKS)
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
    _shared_legend(figure, axes)
    return _save(figure, path)


def training_curves(
    path: Path,
    logs: Mapping[str, Mapping[int, list[dict[str, Any]]]],
    arms: Sequence[str],
    diverged: Mapping[tuple[str, int], int | None],
) -> Figure:
    """Training loss (left) and loss scale with skipped steps (right) against step; one colour per arm,
    one line per seed, the fork warm-ups (``logs["_fork"]``) grey and dashed; a cross marks where a run
    diverged. The loss-scale panel is left out when every run kept one constant scale."""

    def series(records: list[dict[str, Any]], key: str) -> np.ndarray:
        return np.array([np.nan if r.get(key) is None else r[key] for r in records], dtype=float)

    colors = arm_colors(arms)
    runs = [(arm, seed, records) for arm in [WARMUP_ARM, *arms] for seed, records in sorted(logs.get(arm, {}).items())]
    runs = [run for run in runs if run[2]]
    scales = [series(records, "loss_scale") for _, _, records in runs]
    skipped_any = any(bool(r.get("skipped")) for _, _, records in runs for r in records)
    draw_scale = skipped_any or not is_flat(scales)
    figure = _new_figure(12 if draw_scale else 7, 4.0)
    axes = figure.subplots(1, 2 if draw_scale else 1, squeeze=False)[0]
    loss_ax = axes[0]
    labelled: set[str] = set()
    for (arm, seed, records), scale in zip(runs, scales):
        style = WARMUP_STYLE if arm == WARMUP_ARM else {"color": colors[arm], "ls": "-"}
        label = None if arm in labelled else "fork warm-up" if arm == WARMUP_ARM else arm
        labelled.add(arm)
        steps, loss = series(records, "step"), series(records, "loss")
        loss_ax.plot(steps, loss, lw=1.0, alpha=0.85, label=label, **style)
        if draw_scale:
            axes[1].plot(steps, scale, lw=1.0, alpha=0.85, drawstyle="steps-post", **style)
            skipped = np.array([bool(r.get("skipped")) for r in records])
            if skipped.any():
                axes[1].plot(steps[skipped], scale[skipped], "v", color=style["color"], markersize=4)
        finite = np.isfinite(loss)
        if (arm, seed) in diverged and finite.any():
            last = np.flatnonzero(finite)[-1]
            loss_ax.plot([steps[last]], [loss[last]], "X", color="#d62728", markersize=9)
    kept_scale = [v for scale in scales for v in scale if np.isfinite(v)]
    constant = f"; loss scale {kept_scale[0]:g} in every run" if kept_scale and not draw_scale else ""
    loss_ax.set_title(f"training loss (ESMM total) per run; X = diverged{constant}", fontsize=10)
    loss_ax.set_ylabel("loss", fontsize=8)
    if draw_scale:
        axes[1].set_title("loss scale per run; triangles = skipped steps", fontsize=10)
        axes[1].set_yscale("log", base=2)
    for ax in axes:
        _step_axis(ax)
        ax.tick_params(labelsize=7)
    _shared_legend(figure, axes)
    return _save(figure, path)


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


def numerics_heatmap(path: Path, records_by_arm: Mapping[str, list[dict[str, Any]]]) -> Figure:
    """Per-layer heatmaps (rows: module / GEMM, columns: arms) of SQNR, saturation, flush-to-zero and
    subnormal fractions, averaged over the sampled steps and seeds; a quantity with one value in every cell
    is named in the title instead of drawn."""
    labels, arms, tables = numerics_table(records_by_arm)
    panels = [p for p in NUMERICS_PANELS if not is_flat([tables[p[0]]])] or list(NUMERICS_PANELS[:1])
    drawn = {panel[0] for panel in panels}
    flat = [
        f"{title}: {np.nanmax(tables[key]) * scale:.3g}"
        for key, title, scale, _cmap in NUMERICS_PANELS
        if key not in drawn and np.isfinite(tables[key]).any()
    ]
    figure = _new_figure(2.4 + 0.8 * len(arms) * len(panels), 1.6 + 0.28 * len(labels))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    annotate = len(labels) * len(arms) <= 160
    for n, (ax, (key, title, scale, cmap)) in enumerate(zip(axes, panels)):
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
    if flat:
        figure.suptitle("the same in every cell, not drawn: " + ", ".join(flat), fontsize=8)
    return _save(figure, path)


def heldout_curves(
    path: Path,
    series: Mapping[str, Mapping[int, list[tuple[int, Mapping[str, Any]]]]],
    arms: Sequence[str],
    metrics_shown: Sequence[str] | None = None,
) -> Figure:
    """Held-out NE (one panel per metric with data; default every task's NE the records hold, CTR and CTCVR
    first) against step; one colour per arm, one line per seed; the fork warm-ups ("_fork", grey, dashed)
    lead into the arms that continue from them."""
    colors = arm_colors(arms)
    if metrics_shown is None:
        recorded = {m for s in series.values() for p in s.values() for _, h in p for m in h if m.endswith(".ne")}
        metrics_shown = [m for m in ("ctr.ne", "ctcvr.ne") if m in recorded] + sorted(
            recorded - {"ctr.ne", "ctcvr.ne"}
        ) or ["ctr.ne"]

    def values(points: list[tuple[int, Mapping[str, Any]]], metric: str) -> np.ndarray:
        return np.array([np.nan if p[1].get(metric) is None else p[1][metric] for p in points], dtype=float)

    shown = [
        m for m in metrics_shown if any(np.isfinite(values(p, m)).any() for s in series.values() for p in s.values())
    ] or list(metrics_shown[:1])
    figure = _new_figure(6 * len(shown), 4.0)
    axes = figure.subplots(1, len(shown), squeeze=False)[0]
    for ax, metric in zip(axes, shown):
        for arm, seeds in series.items():
            style = WARMUP_STYLE if arm == WARMUP_ARM else {"color": colors.get(arm, "#17becf"), "ls": "-"}
            for n, (_, points) in enumerate(sorted(seeds.items())):
                steps = np.array([p[0] for p in points], dtype=float)
                label = ("fork warm-up" if arm == WARMUP_ARM else arm) if n == 0 else None
                ax.plot(steps, values(points, metric), lw=1.0, alpha=0.85, marker=".", label=label, **style)
        ax.set_title(f"held-out {metric} per run (lower is better)", fontsize=10)
        _step_axis(ax)
        ax.tick_params(labelsize=7)
    _shared_legend(figure, axes)
    return _save(figure, path)
