"""`mxlab power`: size a study before it runs, by simulating the decision rule on a noise model."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from mxlab.cli.command import Command


def power_main(
    study: Path | None,
    seeds: str,
    arms: int | None,
    effect: float,
    metric: str | None,
    seed_sd: float | None,
    eval_sd: float | None,
    eval_shared: float,
    eval_scale: float,
    studies: int,
    echo=typer.echo,
    effect_sd: float = 0.0,
) -> int:
    """Print, per number of seeds, the family-wise false-regression rate under A/A, the power for ``effect``
    (varying from seed to seed with sd ``effect_sd``) and the smallest detectable regression (of a
    constant effect). Returns the exit status; refuses (status 2) a bad option."""
    from mxlab.analysis import NoiseModel, analyze_study, detectable_effect, fit_noise_model, simulate
    from mxlab.analysis.compare import worse_when
    from mxlab.experiment.report_settings import ReportSettings

    try:
        seed_counts = [int(s) if s.strip().isdigit() else -1 for s in seeds.split(",") if s.strip()]
        if not seed_counts or min(seed_counts) < 1:  # -1: not an integer
            raise ValueError(f"--seeds {seeds!r}: expected a comma-separated list of integers >= 1, e.g. 3,5,8")
        if study is not None:
            analysis = analyze_study(study)
            settings = analysis.settings
            models = {}
            for m in settings.primary:
                found = [d for (a, name), d in analysis.inputs.deltas.items() if name == m]
                models[m] = fit_noise_model(found)
            n_arms = arms or max(len(analysis.arms), 1)
            source = f"fitted on {study} ({len(analysis.arms)} arm(s))"
        else:
            if seed_sd is None or eval_sd is None:
                raise ValueError(
                    "give a finished study folder, or --seed-sd and --eval-sd (with --metric) for one metric"
                )
            settings = ReportSettings()
            name = metric or settings.primary[0]
            settings = ReportSettings.from_dict({"primary": [name]})
            models = {name: NoiseModel(seed_sd, eval_sd, eval_shared)}
            n_arms = arms or 1
            source = f"given: seed sd {seed_sd}, eval sd {eval_sd}, shared {eval_shared}"
        target = metric or settings.primary[0]
        if effect_sd > 0 and effect == 0:
            raise ValueError("--effect-sd needs a planted --effect to vary around")
        if target not in models:
            raise ValueError(f"--metric {target!r} is not a primary metric here; accepted: {', '.join(models)}")
    except ValueError as error:
        echo(f"error: {error}")
        return 2
    margins = {m: settings.margin(m) for m in models}
    worse = {m: worse_when(m) for m in models}
    family = n_arms * len(models)
    echo(f"noise model ({source}), eval size x{eval_scale:g}:")
    for m, model in models.items():
        echo(
            f"  {m}: retraining sd {model.seed_sd:.4g}, eval sd {model.eval_sd:.4g}, shared {model.eval_shared:.2f}, "
            f"margin {margins[m]:g}"
        )
    echo(
        f"{n_arms} arm(s) x {len(models)} primary metric(s) = {family} hypotheses, {settings.correction}, "
        f"family-wise {settings.confidence:.0%}; {studies} simulated studies per row; effect {effect:+g} on {target}"
        + (f", varying from seed to seed with sd {effect_sd:g}" if effect_sd > 0 else "")
    )
    echo(
        f"{'seeds':>5}  {'A/A false-regression rate':>26}  {'power':>16} "
        f" smallest detectable ({settings.power:.0%} power)"
    )
    for k in seed_counts:
        null = simulate(
            models,
            n_seeds=k,
            n_arms=n_arms,
            margins=margins,
            worse_when=worse,
            eval_scale=eval_scale,
            n_studies=studies,
            confidence=settings.confidence,
            correction=settings.correction,
            seed=k,
        )
        planted = simulate(
            models,
            n_seeds=k,
            n_arms=n_arms,
            margins=margins,
            worse_when=worse,
            eval_scale=eval_scale,
            effect={target: effect * (1 if worse[target] == "higher" else -1)},
            effect_sd=effect_sd,
            n_studies=studies,
            confidence=settings.confidence,
            correction=settings.correction,
            seed=1000 + k,
        )
        model = models[target]
        se = math.sqrt(
            model.seed_sd**2 / k + model.eval_sd**2 / eval_scale * (model.eval_shared + (1 - model.eval_shared) / k)
        )
        mde = detectable_effect(se, k - 1, (1 - settings.confidence) / family, settings.power) if k >= 3 else math.nan
        power = "n/a" if not math.isfinite(planted.power) else f"{planted.power:.3f} ± {planted.power_se:.3f}"
        echo(
            f"{k:>5}  {null.false_regression_rate:>18.3f} ± {null.false_regression_se:.3f}  {power:>16}  "
            + (f"{mde:.4g}" if math.isfinite(mde) else "none: a verdict needs 3 seeds")
        )
    return 0


def register(app: typer.Typer) -> None:
    """Add `mxlab power` to the top-level app."""

    @app.command("power", cls=Command)
    def power_command(
        study: Path | None = typer.Argument(
            None, metavar="STUDY", help="A finished study folder to fit the noise model on."
        ),
        seeds: str = typer.Option(
            "3,5,8", "--seeds", metavar="K,K,...", help="Numbers of seeds to simulate, comma-separated."
        ),
        arms: int | None = typer.Option(
            None, "--arms", metavar="N", min=1, help="Arms besides the baseline (default: the study's)."
        ),
        effect: float = typer.Option(
            0.0, "--effect", metavar="X", help="A planted regression on --metric, in its units (NE: % of NE)."
        ),
        effect_sd: float = typer.Option(
            0.0,
            "--effect-sd",
            metavar="SD",
            min=0,
            help="Let the planted regression vary from seed to seed with "
            "this sd (a recipe whose cost depends on the run).",
        ),
        metric: str | None = typer.Option(
            None, "--metric", metavar="METRIC", help="The metric of --effect (default: the first primary)."
        ),
        seed_sd: float | None = typer.Option(
            None, "--seed-sd", metavar="SD", min=0, help="Without a study: retraining sd of a per-seed delta."
        ),
        eval_sd: float | None = typer.Option(
            None, "--eval-sd", metavar="SD", min=0, help="Without a study: eval-sampling sd of a per-seed delta."
        ),
        eval_shared: float = typer.Option(
            0.5,
            "--eval-shared",
            metavar="FRACTION",
            min=0,
            max=1,
            help="Share of the eval variance common to all seeds.",
        ),
        eval_scale: float = typer.Option(
            1.0, "--eval-scale", metavar="X", min=1e-6, help="Eval-set size as a multiple of the fitted one."
        ),
        studies: int = typer.Option(2000, "--studies", metavar="N", min=10, help="Simulated studies per row."),
    ) -> None:
        """Simulate the decision rule: false-regression rate under A/A and power, per number of seeds.

        Example: mxlab power reports/quickstart --seeds 3,5,8 --effect 1.0
        (add --effect-sd 1.0 for a cost that varies from seed to seed around that mean)
        """
        raise typer.Exit(
            power_main(
                study,
                seeds,
                arms,
                effect,
                metric,
                seed_sd,
                eval_sd,
                eval_shared,
                eval_scale,
                studies,
                effect_sd=effect_sd,
            )
        )
