"""Bodies of the `mxlab data` commands (the CLI wrappers in mxlab/cli.py stay thin)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATASETS = ("movielens-100k",)


def fetch(dataset: str, cache_dir: Path | None) -> int:
    """Download and verify `dataset` into its cache; return the exit status (2 on a bad name or failure)."""
    if dataset not in DATASETS:
        print(f"error: unknown dataset {dataset!r}; accepted: {', '.join(DATASETS)}", file=sys.stderr)
        return 2
    from mxlab.data.movielens import fetch_movielens

    try:
        folder = fetch_movielens(cache_dir)
    except (RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        print(f"{name}: {entry['rows']} rows, sha256 {entry['sha256']}")
    print(f"MovieLens-100K is ready in {folder}")
    return 0


def _parse_assignment(text: str) -> tuple[str, object]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    if "=" not in text:
        raise ValueError(f"--set {text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        parsed = tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        parsed = value  # a bare string
    return key.strip(), parsed


def describe(source: str, max_history: int, assignments: list[str]) -> int:
    """Print a JSON description of a data source (sizes, features, label rates of the eval set and,
    for synthetic data, the metrics of the true probabilities and the oracles of its feature groups,
    mxlab.data.oracles); return the exit status."""
    from mxlab.data import make_source, truth_reference

    try:
        config = {"source": source, **dict(_parse_assignment(text) for text in assignments)}
        data_source = make_source(config, max_history)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    description = data_source.describe()
    clicks = conversions = examples = history_tokens = 0
    for batch in data_source.eval_batches(4096):
        examples += batch.batch_size
        clicks += float(batch.click.sum())
        conversions += float(batch.conversion.sum())
        history_tokens += int(batch.history_offsets[-1])
    description["eval"] = {
        "click_rate": clicks / max(examples, 1),
        "conversion_rate_given_click": conversions / clicks if clicks and data_source.info.has_conversion else None,
        "mean_history_length": history_tokens / max(examples, 1),
    }
    if data_source.info.has_truth:
        from mxlab.data.oracles import oracle_metrics

        description["truth_reference"] = truth_reference(data_source)
        description["oracles"] = oracle_metrics(data_source)
    print(json.dumps(description, indent=2, default=str))
    return 0
