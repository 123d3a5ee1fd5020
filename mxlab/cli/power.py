"""`mxlab power`: size a study before it runs, by simulating the pre-registered candidate's decision
(mxlab.analysis.decision.decide_candidates, as `mxlab report` runs it) on a pilot's measured noise."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from mxlab.cli.command import Command


def _numbers(option: str, text: str, kind: type, low: float) -> list:
    """The comma-separated values of an option; refuses a non-number or one below ``low``."""
    example = "3,5,8" if kind is int else "0.02,0.05,0.1"
    try:
        values = [kind(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < low:
        what = "integers >= 1" if kind is int else "numbers >= 0"
        raise ValueError(f"{option} {text!r}: expected a comma-separated list of {what}, e.g. {example}")
    return values


def _hours(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "n/a"


def power_main(
    pilot: Path | None,
    seeds: str = "3,5,8",
    margins: str | None = None,
    kind: str | None = None,
    effect: float = 0.0,
    metric: str | None = None,
    seed_sd: float | None = None,
    eval_sd: float | None = None,
    eval_shared: float = 0.5,
    eval_scale: float = 1.0,
    studies: int = 1000,
    max_seeds: int = 64,
    echo=typer.echo,
    effect_sd: float = 0.0,
    plan: Path | None = None,
    step_times: Path | None = None,
    spread_scale: float = 1.0,
) -> int:
    """Print the noise model, per margin the seeds the candidate needs to ship with the settings' power at a
    true delta of 0 and their device-hours, and per number of seeds the A/A regression rate, the ship rate
    and the power to find ``effect`` on ``metric``. With ``plan`` (a spec) and ``step_times`` (its shape's
    `mxlab bench step --json`), sizes that study from the pilot's spread x ``spread_scale``
    (mxlab.analysis.plan). Returns the exit status; refuses (status 2) a bad option or pilot, naming the value
    and what is accepted."""
    from mxlab.analysis.pilot import read_pilot
    from mxlab.analysis.power import NoiseModel, seeds_to_ship, simulate_decision
    from mxlab.experiment.report_settings import METRIC_KINDS, ReportSettings, worse_when

    try:
        seed_counts = _numbers("--seeds", seeds, int, 1)
        notes: list[str] = []
        if (plan is None) != (step_times is None):
            raise ValueError(
                "--plan SPEC and --step-times BENCH.json go together: the plan's runs are priced by the bench"
            )
        if plan is not None and pilot is None:
            raise ValueError("--plan needs --pilot DIR: the spread it carries to the plan")
        if pilot is not None:
            p = read_pilot(pilot)
            spread = f"paired spread over {p.n_seeds} seeds of {', '.join(p.pool)}"
            header = f"pilot {p.name}: {spread}; step times measured on {p.device}"
            if plan is not None:
                from mxlab.analysis.plan import plan_pilot, read_bench_steps
                from mxlab.experiment.spec import load_spec

                pilot_name = p.name
                p, notes = plan_pilot(p, load_spec(plan), read_bench_steps(step_times), spread_scale)
                header = f"plan {p.name} sized from pilot {pilot_name}'s {spread}"
            settings, models, n_candidates = p.settings, p.models, p.n_candidates
        else:
            if seed_sd is None or eval_sd is None:
                raise ValueError("give --pilot DIR (a study folder or its summary.json), or --seed-sd and --eval-sd")
            settings, p, n_candidates = ReportSettings(), None, 1
            name = metric or settings.primary[0]
            settings.margin(name)  # refuses an unknown metric
            models = {name: NoiseModel(seed_sd, eval_sd, eval_shared)}
            header = f"given noise on {name}: seed sd {seed_sd}, eval sd {eval_sd}, shared {eval_shared}"
        if effect_sd > 0 and effect == 0:
            raise ValueError("--effect-sd needs a planted --effect to vary around")
        target = metric or next(iter(models))
        if target not in models:
            settings.margin(target)  # refuses an unknown metric first
            raise ValueError(f"--metric {target!r} is not a co-primary endpoint here; accepted: {', '.join(models)}")
        kinds = sorted({m.split(".", 1)[1] for m in models})
        kind = kind or ("ne" if "ne" in kinds else kinds[0])
        if kind not in kinds:
            where = "accepted here" if kind in METRIC_KINDS else "accepted"
            raise ValueError(f"--kind {kind!r}: no endpoint of that kind; {where}: {', '.join(kinds)}")
        base = {m: settings.margin(m) for m in models}
        own = next(v for m, v in base.items() if m.endswith("." + kind))
        margin_list = _numbers("--margins", margins, float, 0) if margins else [own * f for f in (1, 2.5, 5, 10)]
    except ValueError as error:
        echo(f"error: {error}")
        return 2
    echo(header)
    for note in notes:
        echo(f"  {note}")
    for m, model in models.items():
        echo(
            f"  {m}: retraining sd {model.seed_sd:.4g}, eval sd {model.eval_sd:.4g}, shared {model.eval_shared:.2f}, "
            f"margin {base[m]:g}"
        )
    alpha = 1 - settings.confidence
    echo(
        f"rule: {n_candidates} pre-registered candidate(s) ship when every co-primary endpoint passes "
        f"(intersection-union: NE/AUC non-inferiority one-sided, calibration TOST, each at {alpha:g}, "
        f"{settings.correction} among candidates); regressions by {settings.correction} over the candidates' "
        f"endpoints; endpoints simulated independently; eval size x{eval_scale:g}; {studies} studies per row"
    )
    common = dict(n_candidates=n_candidates, eval_scale=eval_scale, n_studies=studies)
    common.update(confidence=settings.confidence, correction=settings.correction)
    cost = f"device-h ({' + '.join(p.arms)})" if p else "device-h"
    echo(f"seeds needed to ship with {settings.power:.0%} power at a true delta of 0, by the {kind} margin:")
    echo(f"  {'margin':>10}  {'seeds':>5}  {'ships at seeds':>16}  {'at one fewer':>16}  {cost}  device-h (all arms)")
    for i, value in enumerate(margin_list):
        trial = {m: (value if m.endswith("." + kind) else v) for m, v in base.items()}
        found = seeds_to_ship(models, trial, power=settings.power, max_seeds=max_seeds, seed=101 * i, **common)
        if found.seeds is None:
            echo(f"  {value:>10g}  more than {max_seeds}: ships in {found.at.ships:.3f} at {max_seeds}")
            continue
        fewer = "-" if found.fewer is None else f"{found.fewer.ships:.3f} ± {found.fewer.se(found.fewer.ships):.3f}"
        hours = (p.hours(found.seeds, p.arms), p.hours(found.seeds, p.all_arms)) if p else (math.nan, math.nan)
        echo(
            f"  {value:>10g}  {found.seeds:>5}  {found.at.ships:>8.3f} ± {found.at.se(found.at.ships):.3f}  "
            f"{fewer:>16}  {_hours(hours[0]):>{len(cost)}}  {_hours(hours[1])}"
        )
    signed = effect if worse_when(target) != "lower" else -effect
    echo(
        "at the settings' margins, per number of seeds: A/A regression rate, ship rate at delta 0"
        + (f", power to find {effect:+g} on {target} (does not ship: regression on it)" if effect else "")
        + (f", varying from seed to seed with sd {effect_sd:g}" if effect_sd > 0 else "")
    )
    for k in seed_counts:
        null = simulate_decision(models, n_seeds=k, margins=base, seed=k, **common)
        line = (
            f"  {k:>5}  A/A regression {null.regression:.3f} ± {null.se(null.regression):.3f}  "
            f"ships {null.ships:.3f} ± {null.se(null.ships):.3f}"
        )
        if effect:
            hit = simulate_decision(
                models, n_seeds=k, margins=base, effect={target: signed}, effect_sd=effect_sd, seed=1000 + k, **common
            )
            line += f"  power {hit.found:.3f} ± {hit.se(hit.found):.3f}"
        echo(line)
    return 0


def register(app: typer.Typer) -> None:
    """Add `mxlab power` to the top-level app."""

    @app.command("power", cls=Command)
    def power_command(
        study: Path | None = typer.Argument(None, metavar="PILOT", help="Same as --pilot."),
        pilot: Path | None = typer.Option(
            None, "--pilot", metavar="DIR", help="A pilot study: its folder or its summary.json."
        ),
        margins: str | None = typer.Option(
            None,
            "--margins",
            metavar="M,M,...",
            help="Margins of --kind to size for (default: 1, 2.5, 5, 10 x the pilot's).",
        ),
        kind: str | None = typer.Option(
            None, "--kind", metavar="KIND", help="The endpoints --margins apply to: ne, excess_ne, auc, calibration."
        ),
        seeds: str = typer.Option("3,5,8", "--seeds", metavar="K,K,...", help="Numbers of seeds to simulate."),
        effect: float = typer.Option(
            0.0, "--effect", metavar="X", help="A planted regression on --metric, in its units (NE: % of NE)."
        ),
        effect_sd: float = typer.Option(
            0.0, "--effect-sd", metavar="SD", min=0, help="Let the planted regression vary from seed to seed."
        ),
        metric: str | None = typer.Option(
            None, "--metric", metavar="METRIC", help="The endpoint of --effect (default: the first)."
        ),
        seed_sd: float | None = typer.Option(
            None, "--seed-sd", metavar="SD", min=0, help="Without a pilot: retraining sd of a per-seed delta."
        ),
        eval_sd: float | None = typer.Option(
            None, "--eval-sd", metavar="SD", min=0, help="Without a pilot: eval-sampling sd of a per-seed delta."
        ),
        eval_shared: float = typer.Option(
            0.5, "--eval-shared", metavar="FRACTION", min=0, max=1, help="Without a pilot: shared eval variance."
        ),
        eval_scale: float = typer.Option(
            1.0, "--eval-scale", metavar="X", min=1e-6, help="Eval-set size as a multiple of the pilot's."
        ),
        studies: int = typer.Option(1000, "--studies", metavar="N", min=10, help="Simulated studies per row."),
        max_seeds: int = typer.Option(64, "--max-seeds", metavar="K", min=3, help="The most seeds tried."),
        plan: Path | None = typer.Option(
            None,
            "--plan",
            metavar="SPEC",
            help="Size this larger study from the pilot: its arms, candidate, controls and [report] margins, its "
            "runs of train.max_steps priced by --step-times.",
        ),
        step_times: Path | None = typer.Option(
            None,
            "--step-times",
            metavar="BENCH.json",
            help="With --plan: `mxlab bench step --json` at the plan's model and batch (refused at another shape).",
        ),
        spread_scale: float = typer.Option(
            1.0,
            "--spread-scale",
            metavar="X",
            min=1e-6,
            help="With --plan: the stated assumption that the plan's retraining sd is X times the pilot's.",
        ),
    ) -> None:
        """Simulate the candidate's decision: seeds and device-hours to ship per margin; A/A and power per seeds.

        Example: mxlab power --pilot reports/gem-mxfp8 --margins 0.02,0.1,0.5 --seeds 8,16 --effect 0.1
        """
        if study is not None and pilot is not None:
            typer.echo("error: give the pilot once, as PILOT or --pilot")
            raise typer.Exit(2)
        raise typer.Exit(
            power_main(
                pilot or study,
                seeds,
                margins,
                kind,
                effect,
                metric,
                seed_sd,
                eval_sd,
                eval_shared,
                eval_scale,
                studies,
                max_seeds,
                effect_sd=effect_sd,
                plan=plan,
                step_times=step_times,
                spread_scale=spread_scale,
            )  # fmt: skip
        )
