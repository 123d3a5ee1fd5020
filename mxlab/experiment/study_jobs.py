"""The runs of a study as RunJobs: one per seed x arm, the fork design's warm-ups, and the arms one call trains."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxlab.experiment.integrity import recipe_file_record
from mxlab.experiment.spec import ExperimentSpec, post_training_recipe
from mxlab.experiment.train import RunJob

FORK_DIR = "_fork"  # runs/_fork/seedK: the fork design's warm-up runs


def study_jobs(spec: ExperimentSpec, runs_root: Path) -> list[RunJob]:
    """One RunJob per seed x arm of `spec` (`arm_jobs`), recipes loaded from spec.recipe_paths."""
    return arm_jobs(spec, runs_root, [recipe_arm(arm, spec.recipe_paths[arm]) for arm in spec.arms])


def recipe_arm(arm: str, path: Path) -> tuple[str, Any, str, dict[str, Any]]:
    """The arm tuple `arm_jobs` takes for the recipe file at `path`: (name, recipe, its path, {"recipe_file"})."""
    from mxlab.recipe import load_recipe

    return arm, load_recipe(path), str(path), {"recipe_file": recipe_file_record(path)}


def arm_jobs(
    spec: ExperimentSpec, runs_root: Path, arms: Sequence[tuple[str, Any, str, dict[str, Any]]]
) -> list[RunJob]:
    """One RunJob per seed of `spec` x arm of `arms` (seed-major; each arm a tuple (name, recipe, recipe
    source, extra config)), in runs_root/ARM/seedK; a post-training arm starts from its seed's baseline run,
    and in the fork design every other arm from its seed's warm-up folder (`fork_jobs`)."""

    def start(arm: str, seed: int) -> Path | None:
        if post_training_recipe(arm) is not None:
            return Path(runs_root) / spec.baseline / f"seed{seed}"
        return Path(runs_root) / FORK_DIR / f"seed{seed}" if spec.train.fork_from else None

    return [
        RunJob(
            arm=arm,
            seed=seed,
            recipe=recipe,
            recipe_source=recipe_source,
            run_dir=Path(runs_root) / arm / f"seed{seed}",
            spec=spec,
            fork_dir=start(arm, seed),
            post_training=post_training_recipe(arm) is not None,
            extra_config=dict(extra_config),
        )
        for seed in spec.seeds
        for arm, recipe, recipe_source, extra_config in arms
    ]


def check_only_arms(spec: ExperimentSpec, only_arms: Sequence[str] | None) -> None:
    """Refuses (ValueError) an empty `only_arms` or one naming an arm `spec` does not have, listing its arms."""
    if only_arms is None:
        return
    unknown = [arm for arm in only_arms if arm not in spec.arms]
    if unknown or not only_arms:
        named = ", ".join(repr(arm) for arm in unknown) or "no arm"
        raise ValueError(f"--only-arms names {named}; the spec {spec.name!r} has arms {', '.join(spec.arms)}")


def arms_now(jobs: list[RunJob], only_arms: Sequence[str] | None) -> list[RunJob]:
    """`jobs` of the arms in `only_arms` (all of them when None), with the runs those start from (a
    post-training arm's baseline run: trained unless done or recorded)."""
    if only_arms is None:
        return jobs
    chosen = [job for job in jobs if job.arm in only_arms]
    starts = {job.start_label for job in chosen}
    return [job for job in jobs if job.arm in only_arms or job.label in starts]


def fork_jobs(spec: ExperimentSpec, runs_root: Path) -> list[RunJob]:
    """The fork design's warm-up runs, one per seed (runs/_fork/seedK): recipe train.fork_from for
    train.fork_steps steps on the seed's data order; [] from scratch."""
    from mxlab.recipe import load_recipe

    if not spec.train.fork_from:
        return []
    steps = spec.train.fork_steps
    warmup = spec.with_train(
        fork_from="", fork_steps=0, max_steps=steps, epochs=max(spec.train.epochs, steps), lr_decay_steps=0
    )
    recipe = load_recipe(spec.fork_recipe_path)
    return [
        RunJob(
            arm=FORK_DIR,
            seed=seed,
            recipe=recipe,
            recipe_source=str(spec.fork_recipe_path),
            run_dir=Path(runs_root) / FORK_DIR / f"seed{seed}",
            spec=warmup,
            extra_config={
                "fork_warmup_of": spec.name,
                "fork_from": spec.train.fork_from,
                "recipe_file": recipe_file_record(spec.fork_recipe_path),
            },
        )
        for seed in spec.seeds
    ]
