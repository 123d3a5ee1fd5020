"""A study folder never mixes: what each arm's recipe file held, checked on --resume, and flagged in the report.

Every run records its recipe file's text and SHA-256 (config.json `recipe_file`) and its effective plan
(plan.json); study.json records the same for every arm (`recipe_files`). `--resume` refuses a recipe
whose text changed since; the report flags an arm whose runs disagree. `--out` into a folder that is
not a study (something else is there) is refused before anything is written.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from mxlab import io

FORK_KEY = "_fork"  # the fork design's warm-up recipe in study.json's recipe_files
STUDY_ENTRIES = (
    "study.json",
    "runs",
    "records",
    "report.md",
    "report.html",
    "summary.json",
    "figures",
    "sweep",
    "diverged",
    ".lock",
)
RERUNS = "reruns"  # study.json's list of reruns of diverged runs (mxlab.experiment.rerun)


def recipe_file_record(path: Path) -> dict[str, Any]:
    """{"path", "sha256", "text"} of a recipe file as it is now."""
    text = Path(path).read_text()
    return {"path": str(path), "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}


def spec_recipe_files(spec: Any) -> dict[str, dict[str, Any]]:
    """{arm: recipe_file_record} for every arm of `spec` (and FORK_KEY for the fork warm-up's recipe)."""
    files = {arm: recipe_file_record(path) for arm, path in spec.recipe_paths.items()}
    if spec.fork_recipe_path is not None:
        files[FORK_KEY] = recipe_file_record(spec.fork_recipe_path)
    return files


def _text_change(old: str, new: str) -> str:
    """The first changed line of two texts: "line 2: 'noise = 0.01' (recorded) vs 'noise = 0.02' (now)"."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old_lines, b=new_lines).get_opcodes():
        if tag != "equal":
            was = " / ".join(old_lines[i1:i2]) or "(nothing)"
            now = " / ".join(new_lines[j1:j2]) or "(nothing)"
            return f"line {j1 + 1}: {was!r} (recorded) vs {now!r} (now)"
    return "whitespace at the end of the file"


def recorded_recipe_files(out_dir: Path, study: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """{arm: recipe_file_record} as the study folder recorded them: study.json's recipe_files, else each
    run's config.json (the first run of an arm that has one)."""
    recorded = dict((study or {}).get("recipe_files") or {})
    runs = Path(out_dir) / "runs"
    if runs.is_dir():
        for config_path in sorted(runs.glob("*/seed*/config.json")):
            arm = config_path.parent.parent.name
            if arm not in recorded:
                entry = io.read_json(config_path).get("recipe_file")
                if entry:
                    recorded[arm] = entry
    return recorded


def check_recipes_unchanged(spec: Any, out_dir: Path, study: dict[str, Any] | None) -> None:
    """Refuses (ValueError naming the arm, the file and the first changed line) an arm whose recipe file
    holds other text than the study folder recorded for it."""
    recorded = recorded_recipe_files(out_dir, study)
    for arm, now in spec_recipe_files(spec).items():
        before = recorded.get(arm)
        if before is None or before.get("sha256") == now["sha256"]:
            continue
        name = "the fork warm-up" if arm == FORK_KEY else f"arm {arm!r}"
        change = _text_change(before.get("text", ""), now["text"]) if "text" in before else "its SHA-256"
        raise ValueError(
            f"cannot resume {out_dir}: {name}'s recipe {now['path']} changed since the study started "
            f"({change}); put the recorded recipe back, or give the edited one a new name (a new arm) "
            f"or a fresh --out"
        )


def check_foreign_folder(out_dir: Path) -> None:
    """Refuses (ValueError naming what is there) an existing non-empty folder that is not a study folder
    (no study.json, no runs/)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or (out_dir / "study.json").is_file() or (out_dir / "runs").is_dir():
        return
    entries = sorted(path.name for path in out_dir.iterdir())
    if not entries:
        return
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    raise ValueError(
        f"--out {out_dir} is not a study folder (no study.json or runs/) and is not empty: it holds {shown}; "
        f"choose an empty or new folder"
    )


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def mixed_arms(runs_root: Path, arms: list[str], seeds: list[int]) -> dict[str, str]:
    """{arm: what differs} for every arm whose runs (RUNS_ROOT/ARM/seedK) recorded different recipe texts or plans."""
    mixed = {}
    for arm in arms:
        hashes, plans = {}, {}
        for seed in seeds:
            run = Path(runs_root) / arm / f"seed{seed}"
            config = _json_or_none(run / "config.json") or {}
            if (config.get("recipe_file") or {}).get("sha256"):
                hashes[seed] = config["recipe_file"]["sha256"][:12]
            plan = _json_or_none(run / "plan.json")
            if isinstance(plan, dict):
                plans[seed] = json.dumps({k: v for k, v in plan.items() if k != "seed"}, sort_keys=True)
        if len(set(hashes.values())) > 1:
            mixed[arm] = "recipe files differ: " + ", ".join(f"seed {s} {h}" for s, h in hashes.items())
        elif len(set(plans.values())) > 1:
            groups: dict[str, list[int]] = {}
            for seed, plan in plans.items():
                groups.setdefault(plan, []).append(seed)
            mixed[arm] = "plans differ between seeds " + " | ".join(str(group) for group in groups.values())
    return mixed


def mixed_arm_warnings(runs_root: Path, arms: list[str], seeds: list[int]) -> list[str]:
    """The report's warning lines for `mixed_arms` (one per arm; [] when every arm is consistent)."""
    return [
        f"**{arm} mixes recipes** ({what}): its runs did not all train the same recipe; rerun them in a fresh "
        f"study folder before reading its verdicts."
        for arm, what in mixed_arms(runs_root, arms, seeds).items()
    ]


def unfinished_reruns(out_dir: Path, study: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """{label: its study.json "reruns" entry} for every run a recorded rerun started that has neither a done run
    folder (finished or diverged) nor a record yet."""
    from mxlab.experiment.artefacts import run_is_complete
    from mxlab.experiment.records import record_is_done

    unfinished = {}
    for entry in (study or {}).get(RERUNS) or []:
        for label in entry.get("runs", []):
            arm, _, seed = label.partition("/seed")
            if not run_is_complete(Path(out_dir) / "runs" / label) and not record_is_done(out_dir, arm, int(seed)):
                unfinished[label] = entry
    return unfinished


def relative_to_study(out_dir: Path, path: str | Path | None) -> str | None:
    """`path` as written from the study folder (e.g. ../../experiments/recipes/bf16.toml): a report or a
    study.json copied to another machine names no absolute path of this one."""
    if path is None:
        return None
    return os.path.relpath(Path(path).resolve(), Path(out_dir).resolve())


def study_paths(spec_record: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The spec record of study.json with its file paths (recipes, spec_path, design.recipe, recipe_files)
    written relative to the study folder."""
    record = dict(spec_record)
    record["recipes"] = {arm: relative_to_study(out_dir, path) for arm, path in record.get("recipes", {}).items()}
    record["spec_path"] = relative_to_study(out_dir, record.get("spec_path"))
    if isinstance(record.get("design"), dict) and record["design"].get("recipe"):
        record["design"] = {**record["design"], "recipe": relative_to_study(out_dir, record["design"]["recipe"])}
    if isinstance(record.get("recipe_files"), dict):
        record["recipe_files"] = {
            arm: {**entry, "path": relative_to_study(out_dir, entry["path"])}
            for arm, entry in record["recipe_files"].items()
        }
    return record
