"""Below the ship table: the calibration diagnostics per arm (deciles, slope, NE after a held-out
recalibration; mxlab.analysis.recalibration) and, for from-scratch designs, the stability endpoint
(mxlab.analysis.stability)."""

from __future__ import annotations

import math

import numpy as np

from mxlab.analysis import StudyAnalysis
from mxlab.analysis.recalibration import DECILES, RunCalibration, eval_calibration
from mxlab.analysis.stability import MAD_FLOOR, STUCK_MADS, stability
from mxlab.report.document import Block, Details, Heading, Paragraph, Table

NOT_HERE = (
    "**⚠ Not computed: the run folders (eval.npz) are not in this study folder.** The calibration by "
    "prediction decile, the calibration slope and NE after a held-out recalibration need each run's "
    "per-example predictions; summary.json holds none, and no numbers are shown in their place."
)


def _mean_range(values: list[float], digits: int = 3) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    mean = float(np.mean(finite))
    if len(finite) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{min(finite):.{digits}f}, {max(finite):.{digits}f}]"


def _mean(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    return f"{np.mean(finite):.3f}" if finite else "n/a"


def _pct(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    return f"{np.mean(finite):+.3f}%" if finite else "n/a"


def calibration_runs(analysis: StudyAnalysis) -> dict[str, dict[int, dict[str, RunCalibration]]]:
    """arm -> seed -> task -> RunCalibration of every finished run (reads each eval.npz)."""
    study = analysis.study
    return {
        arm: {s: eval_calibration(study.eval_arrays(arm, s)) for s in study.finished_seeds(arm)} for arm in study.arms
    }


def calibration_section(analysis: StudyAnalysis) -> list[Block]:
    """The calibration diagnostics (secondary: no verdict), or a visibly marked note without the run folders."""
    blocks: list[Block] = [Heading("Calibration diagnostics", 2)]
    if not analysis.study.has_runs:
        return blocks + [Paragraph(NOT_HERE)]
    runs = calibration_runs(analysis)
    base = analysis.study.baseline
    tasks = [t for t in analysis.study.tasks if any(t in r for seeds in runs.values() for r in seeds.values())]
    rows, decile_rows = [], {t: [] for t in tasks}
    for arm, seeds in runs.items():
        for task in tasks:
            found = {s: r[task] for s, r in seeds.items() if task in r}
            if not found:
                continue
            paired = [s for s in found if s in runs.get(base, {}) and arm != base]

            def delta(field: str, found=found, paired=paired, task=task) -> list[float]:
                return [100 * (getattr(found[s], field) / getattr(runs[base][s][task], field) - 1) for s in paired]

            rows.append(
                [
                    arm + (" (baseline)" if arm == base else ""),
                    task,
                    _mean_range([r.slope for r in found.values()]),
                    _mean_range([r.raw_ne for r in found.values()], 4),
                    _mean_range([r.recalibrated_ne for r in found.values()], 4),
                    _pct(delta("raw_ne")) if paired else "-",
                    _pct(delta("recalibrated_ne")) if paired else "-",
                ]
            )
            columns = np.array([r.deciles for r in found.values()]).T
            decile_rows[task].append([arm] + [_mean(list(c)) for c in columns])
    blocks.append(
        Paragraph(
            "Per arm and task, mean over finished seeds [min, max]: the **calibration slope** (logistic regression "
            "of the labels on logit(p); 1 = calibrated spread, below 1 = predictions too extreme), **NE on a "
            "held-out half of the eval users** raw and after a Platt recalibration (intercept and slope on "
            "logit(p)) fitted on the other half, and each against the baseline's of the same seed. A raw NE gap "
            "that the recalibration closes is calibration; one that stays is ranking. Secondary: no verdict "
            '(docs/statistics.md, "Calibration diagnostics").'
        )
    )
    header = [
        "arm",
        "task",
        "calibration slope",
        "NE (held-out half)",
        "NE recalibrated",
        "ΔNE raw",
        "ΔNE recalibrated",
    ]
    blocks.append(Table(header, rows))
    deciles = [Table(["arm"] + [f"d{i + 1}" for i in range(DECILES)], decile_rows[t]) for t in tasks if decile_rows[t]]
    titled: list[Block] = []
    for task, table in zip([t for t in tasks if decile_rows[t]], deciles):
        titled += [Paragraph(f"**{task}**: sum p / sum y per prediction decile (d1 = lowest predictions)"), table]
    blocks.append(
        Details("Calibration by prediction decile (mean over seeds; 1 = calibrated, < 1 under-predicts)", titled)
    )
    return blocks


def stability_section(analysis: StudyAnalysis) -> list[Block]:
    """The stability endpoint of a from-scratch study; [] for a fork design (every arm starts from a trained model)."""
    if analysis.study.is_fork:
        return []
    settings = analysis.settings
    threshold, by_oracle, rows = stability(
        analysis.study, analysis.inputs.run_metrics, settings.confidence, settings.correction
    )
    task = analysis.study.tasks[0].upper()
    criterion = (
        f"stuck = finished with a final held-out {task} AUC at or below {threshold:.4f}, the no-history oracle's "
        "on the same eval set: the run never learned the user history"
        if by_oracle
        else f"stuck = finished with a final held-out {task} AUC below {threshold:.4f} (the baseline runs' median "
        f"minus {STUCK_MADS:g} x their median absolute deviation, at least {MAD_FLOOR:g})"
        if math.isfinite(threshold)
        else "stuck runs not assessed: fewer than 3 finished baseline runs"
    )
    table = []
    for r in rows:
        verdict = (
            "(reference)"
            if r.arm == analysis.study.baseline
            else "n/a"
            if not math.isfinite(r.p_value)
            else "**less stable**"
            if r.less_stable
            else "no evidence of a difference"
        )
        table.append(
            [
                r.arm,
                str(r.runs),
                ", ".join(map(str, r.diverged)) or "-",
                ", ".join(map(str, r.stuck)) or "-",
                f"{r.failed}/{r.runs}" + (f" ({r.share:.0%})" if r.runs else ""),
                f"{r.p_value:.3g}" if math.isfinite(r.p_value) else "-",
                verdict,
            ]
        )
    return [
        Heading("Stability", 2),
        Paragraph(
            "Per arm, the runs that diverged (training stopped on a non-finite loss) or got stuck ("
            + criterion
            + "), against the baseline's by Fisher's exact test (one-sided: the arm fails more often), "
            f'{settings.correction} over the arms at {1 - settings.confidence:g} (docs/statistics.md, "Stability").'
        ),
        Table(["arm", "runs", "diverged (seeds)", "stuck (seeds)", "failed", "Fisher p", "stability"], table),
    ]


def diagnostics(analysis: StudyAnalysis) -> list[Block]:
    """The blocks below the ship table: calibration diagnostics, then stability (from scratch only)."""
    return calibration_section(analysis) + stability_section(analysis)
