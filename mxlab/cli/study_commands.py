"""The bodies of `mxlab run`, `mxlab report`, `mxlab compare` and `mxlab sweep-layers`.

`run` runs the study (mxlab.experiment) and then builds its report (mxlab.report). Each returns
the process exit code: 0 on success, 2 on bad input (the message names the value and the
accepted ones), 1 when a run failed, 130 when interrupted (Ctrl-C, or SIGTERM / SIGHUP as `timeout` and
batch schedulers send them, once: the same clean stop, so an MPS daemon started for the study is told to
quit and finished runs are kept for --resume).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from mxlab.experiment.execution import ExecutionOptions

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return code


def _guarded(body: Callable[[], int], interrupted_hint: str = "") -> int:
    from mxlab.experiment.executors.local import signals_as_interrupt

    try:
        with signals_as_interrupt():
            return body()
    except KeyboardInterrupt:
        typer.secho(f"interrupted. {interrupted_hint}".rstrip(), err=True, fg=typer.colors.YELLOW)
        return 130
    except ValueError as error:
        return _fail(str(error))
    except OSError as error:  # permission, read-only, disk full, missing path: one line, finished runs kept
        from mxlab.experiment.oserrors import os_error_line

        bad_path = isinstance(error, (FileNotFoundError, NotADirectoryError, FileExistsError))
        return _fail(os_error_line(error), EXIT_BAD_INPUT if bad_path else EXIT_FAILED)
    except RuntimeError as error:
        return _fail(str(error), EXIT_FAILED)


def _print_report_paths(paths: dict[str, Path]) -> None:
    for key in ("report.md", "report.html", "md", "html", "markdown"):
        if key in paths:
            typer.echo(f"  {key}: {paths[key]}")
    shown = {"report.md", "report.html", "md", "html", "markdown"}
    for key, path in paths.items():
        if key not in shown:
            typer.echo(f"  {key}: {path}")


def parse_seeds(text: str | None) -> list[int] | None:
    """'0,1,2' or '[0, 1, 2]' -> [0, 1, 2]; None stays None. Refuses anything that is not integers >= 0."""
    if text is None:
        return None
    items = [item.strip() for item in text.strip().strip("[]").split(",") if item.strip()]
    try:
        seeds = [int(item) for item in items]
    except ValueError:
        raise ValueError(f"--seeds expects integers like 0,1,2; got {text!r}") from None
    if not seeds or any(seed < 0 for seed in seeds):
        raise ValueError(f"--seeds expects integers >= 0 like 0,1,2; got {text!r}")
    return seeds


def closing_line(name: str, result: Any) -> str:
    """The line after a study: finished, diverged, failed (and skipped) runs counted apart, then how many of
    them trained now and how many were already done."""
    unfinished = set(result.diverged) | set(result.failed) | set(result.backend_skipped)
    finished = len([label for label in [*result.trained, *result.already_done] if label not in unfinished])
    trained_now = len([label for label in result.trained if label not in result.failed])
    trained_now -= len([label for label in result.backend_skipped if label in result.trained])
    return (
        f"study {name}: {finished} finished, {len(result.diverged)} diverged, {len(result.failed)} failed"
        + (f", {len(result.backend_skipped)} skipped (backend unavailable)" if result.backend_skipped else "")
        + f" ({trained_now} runs trained, {len(result.already_done)} already done)"
        + (f"; diverged: {', '.join(result.diverged)}" if result.diverged else "")
        + (f"; skipped: {', '.join(result.backend_skipped)}" if result.backend_skipped else "")
    )


def import_report_in_background() -> threading.Thread:
    """Import mxlab.report (seconds: SciPy, Matplotlib) on a daemon thread, so the report that follows the last runs
    finds it imported; a failure there is left to the report's own import. Returns the thread."""

    def load() -> None:
        with contextlib.suppress(Exception):
            importlib.import_module("mxlab.report")

    thread = threading.Thread(target=load, name="mxlab-report-import", daemon=True)
    thread.start()
    return thread


def write_study_report(out_dir: Path) -> dict[str, Path]:
    """Build the report of a study whose runs are saved; returns its files. Refuses (RuntimeError) a failed build."""
    from mxlab.report import write_report

    try:
        return dict(write_report(out_dir))
    except Exception as error:
        raise RuntimeError(
            f"the runs are saved under {out_dir / 'runs'}, but writing the report failed: "
            f"{type(error).__name__}: {error}. Re-render it with `mxlab report {out_dir}`."
        ) from error


def run(
    spec_path: Path,
    *,
    device: str,
    out: Path | None,
    resume: bool,
    overrides: Sequence[str],
    options: ExecutionOptions,
    rerun_diverged: bool = False,
    only_arms: Sequence[str] | None = None,
) -> int:
    """`mxlab run`: load and validate the spec, run the study with the execution `options` (with
    `rerun_diverged`, first move its diverged runs aside to train them again: mxlab.experiment.rerun; refused
    without `resume`; none diverged: says so and returns 0; `only_arms`: train only those arms now), render
    the report, print where it is."""

    def body() -> int:
        if device == "cpu" and options.executor in (None, "local") and options.nproc_per_node == 1:
            # CPU workers come from a fork server (mxlab.experiment.executors.local): it imports torch and
            # mxlab while this process does (an idle process if the spec's [execution] then asks for Ray)
            from mxlab.worker_server import start_worker_server

            start_worker_server()
        from mxlab.experiment.runner import reproduce_command, run_study
        from mxlab.experiment.spec import load_spec

        if rerun_diverged and not resume:
            raise ValueError("--rerun-diverged needs --resume: it reruns the diverged runs of an existing study")
        options.check()
        spec = load_spec(spec_path, overrides)
        if rerun_diverged:
            from mxlab.experiment.rerun import prepare_rerun

            out_dir = out if out is not None else Path("reports") / spec.name
            flags = [*options.flags(), "--resume", "--rerun-diverged"]
            rerun = prepare_rerun(spec, out_dir, reproduce_command(spec, out_dir, device, overrides, flags))
            if not rerun:
                typer.echo(f"no diverged runs in {out_dir}: nothing to rerun")
                return 0
            typer.echo(f"rerunning {len(rerun)} diverged runs from scratch: {', '.join(rerun)}")
        result = run_study(
            spec,
            out,
            device=device,
            resume=resume,
            overrides=overrides,
            options=options,
            rerun=rerun_diverged,
            when_all_started=import_report_in_background,
            only_arms=only_arms,
        )
        typer.echo(closing_line(spec.name, result))
        typer.echo(f"runs in {result.out_dir / 'runs'}")
        if result.failed:
            for label, reason in result.failed.items():
                typer.secho(f"failed: {label}: {reason}", err=True, fg=typer.colors.RED)
            raise RuntimeError(
                f"{len(result.failed)} runs failed (recorded in their done.json); "
                f"fix the cause and run again with --resume to retry them"
            )
        typer.echo("report:")
        _print_report_paths(write_study_report(result.out_dir))
        return 0

    hint = f"Finished runs are kept; continue with: mxlab run {spec_path} --resume" + (f" --out {out}" if out else "")
    hint += " --rerun-diverged" if rerun_diverged else ""
    hint += "".join(f" {flag}" for flag in options.flags())
    return _guarded(body, hint + "".join(f" --set {override}" for override in overrides))


def report(study_dir: Path, settings_from: Path | None = None) -> int:
    """`mxlab report`: re-render the report of a study folder from its run folders; ``settings_from``: a spec
    whose [report] table replaces the study's (the report says post hoc where it differs from the record),
    checked against the tasks of the study's recorded data source as `mxlab run` checks a spec."""

    def body() -> int:
        if not (Path(study_dir) / "study.json").is_file():
            raise ValueError(f"{study_dir} is not a study folder (no study.json); run `mxlab run SPEC.toml` first")
        from mxlab import io
        from mxlab.experiment.spec import report_settings, tomllib
        from mxlab.report import write_report
        from mxlab.tasks import task_set

        settings = None
        if settings_from is not None:
            if not Path(settings_from).is_file():
                raise ValueError(f"--settings {settings_from}: no such file")
            recorded = io.read_json(Path(study_dir) / "study.json")
            source = (recorded.get("data") or {}).get("source")
            table = tomllib.loads(Path(settings_from).read_text()).get("report", {})
            try:
                settings = report_settings(table, source, task_set(recorded.get("tasks")))
            except ValueError as error:
                raise ValueError(f"--settings {settings_from} for a study of data source {source!r}: {error}") from None
        paths = write_report(Path(study_dir), settings=settings)
        typer.echo("report:")
        _print_report_paths(dict(paths))
        return 0

    return _guarded(body)


def merge(out: Path, folders: Sequence[Path]) -> int:
    """`mxlab merge`: merge the records of study folders into OUT, then write its report."""

    def body() -> int:
        from mxlab.experiment.merge import merge_studies
        from mxlab.report import write_report

        study = merge_studies(out, folders)
        typer.echo(f"merged {len(folders)} folders into {out}: seeds {study['seeds']}")
        typer.echo("report:")
        _print_report_paths(dict(write_report(Path(out))))
        return 0

    return _guarded(body)


def compare(study_a: Path, study_b: Path) -> int:
    """`mxlab compare`: print how two study folders differ."""

    def body() -> int:
        for folder in (study_a, study_b):
            if not (Path(folder) / "study.json").is_file():
                raise ValueError(f"{folder} is not a study folder (no study.json)")
        from mxlab.report import compare_studies

        typer.echo(compare_studies(Path(study_a), Path(study_b)))
        return 0

    return _guarded(body)


def sweep_layers(
    spec_path: Path,
    *,
    recipe: str,
    seeds: str | None,
    steps: int | None,
    device: str,
    out: Path | None,
    resume: bool,
    overrides: Sequence[str],
    runs_per_device: int | None = None,
    mps: bool = False,
) -> int:
    """`mxlab sweep-layers`: run the layer-sensitivity sweep and print the ranking."""

    def body() -> int:
        from mxlab.experiment.spec import load_spec
        from mxlab.experiment.sweep import sweep_layers as run_sweep

        spec = load_spec(spec_path, overrides)
        result = run_sweep(
            spec,
            recipe,
            seeds=parse_seeds(seeds),
            steps=steps,
            out_dir=out,
            device=device,
            resume=resume,
            runs_per_device=runs_per_device,
            mps=mps,
        )
        typer.echo(result.table)
        typer.echo(f"written: {result.markdown_path} and {result.json_path}")
        return 0

    return _guarded(body, "Finished runs are kept; continue with the same command and --resume.")
