"""Data sources for the CTR/CVR experiments: jagged batches from synthetic, MovieLens-100K and Criteo data.

`make_source(data_config, max_history)` builds a source from the experiment's [data] table;
`validate_data_config(data_config)` checks that table without touching any file, so a runner can
refuse a bad spec before training starts. docs/data.md describes every source.
"""

from __future__ import annotations

from typing import Any

from mxlab.data.batch import DataInfo, DataSource, JaggedBatch, rebatch
from mxlab.data.config import config_keys, dataclass_from_config

SOURCES = ("synthetic", "movielens-100k", "criteo")
CLICK_ONLY_SOURCES = ("criteo",)  # no conversion labels (DataInfo.has_conversion False): CTR is the only task


def source_tasks(source: str) -> tuple[str, ...]:
    """The tasks a source labels (mxlab.metrics.tasks_of): ("ctr",) for a click-only source, else every task.
    Refuses an unknown source, naming the accepted ones."""
    from mxlab.metrics import tasks_of

    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; accepted: {', '.join(SOURCES)}")
    return tasks_of(source not in CLICK_ONLY_SOURCES)


def config_class(source: Any) -> type:
    """The config dataclass of a source's [data] table; refuses an unknown source, naming the accepted ones."""
    if source == "synthetic":
        from mxlab.data.synthetic import SyntheticConfig

        return SyntheticConfig
    if source == "movielens-100k":
        from mxlab.data.movielens import MovieLensConfig

        return MovieLensConfig
    if source == "criteo":
        from mxlab.data.criteo import CriteoConfig

        return CriteoConfig
    raise ValueError(f"unknown data source {source!r}; accepted: {', '.join(SOURCES)}")


# Keys a source's [data] table accepts that resolve into its config's fields (synthetic presets).
_TABLE_ONLY_KEYS = {"synthetic": ("preset", "eval_impressions_per_user")}


def data_config_keys() -> dict[str, tuple[str, ...]]:
    """Return the accepted [data] keys of each source."""
    return {source: config_keys(config_class(source)) + _TABLE_ONLY_KEYS.get(source, ()) for source in SOURCES}


def validate_data_config(data_config: dict) -> Any:
    """Return the typed config dataclass of `data_config` (a [data] table).

    Refuses (ValueError) a missing or unknown `source`, an unknown key (listing the accepted
    ones), a value of the wrong type or out of range. Touches no file.
    """
    if not isinstance(data_config, dict) or "source" not in data_config:
        raise ValueError(f"the [data] table needs a 'source' key; accepted sources: {', '.join(SOURCES)}")
    source = data_config["source"]
    table_class = config_class(source)
    if source == "synthetic":
        from mxlab.data.synthetic import resolve_synthetic_table

        data_config = resolve_synthetic_table(data_config)
    return dataclass_from_config(
        table_class, data_config, f"[data] for source {source!r}", ignore=_TABLE_ONLY_KEYS.get(source, ())
    )


def make_source(data_config: dict, max_history: int) -> DataSource:
    """Return the data source described by `data_config`, with histories capped at `max_history`.

    Refuses (ValueError) what `validate_data_config` refuses and a non-positive max_history;
    a missing file raises FileNotFoundError naming it (for MovieLens, with the fetch command).
    """
    if not isinstance(max_history, int) or isinstance(max_history, bool) or max_history < 1:
        raise ValueError(f"max_history must be a positive integer; got {max_history!r}")
    config = validate_data_config(data_config)
    if config.source == "synthetic":
        from mxlab.data.synthetic import SyntheticSource

        return SyntheticSource(config, max_history)
    if config.source == "movielens-100k":
        from mxlab.data.movielens import MovieLensSource

        return MovieLensSource(config, max_history)
    from mxlab.data.criteo import CriteoSource

    return CriteoSource(config, max_history)


def __getattr__(name: str) -> Any:
    """`DATA_CONFIG_KEYS`: {source: accepted [data] keys}, computed on first use."""
    if name == "DATA_CONFIG_KEYS":
        return data_config_keys()
    raise AttributeError(f"module 'mxlab.data' has no attribute {name!r}")


def truth_reference(source: DataSource) -> dict[str, float]:
    """Return the metrics the true probabilities reach on the eval set: for ctr, cvr (on clicked
    examples) and ctcvr, `{task}_auc`, `{task}_log_loss`, `{task}_ne`, `{task}_label_rate`; also
    `ctr_auc_without_history_term` and the true mean rates. These are the best any model can do.

    Refuses (ValueError) a source without known truth.
    """
    if not source.info.has_truth or not hasattr(source, "truth_reference"):
        raise ValueError(f"source {source.info.name!r} has no known true probabilities; only 'synthetic' does")
    return source.truth_reference()


__all__ = [
    "DATA_CONFIG_KEYS",
    "DataInfo",
    "DataSource",
    "JaggedBatch",
    "CLICK_ONLY_SOURCES",
    "SOURCES",
    "config_class",
    "data_config_keys",
    "make_source",
    "rebatch",
    "source_tasks",
    "truth_reference",
    "validate_data_config",
]
