"""Data sources for the CTR/CVR experiments: jagged batches from synthetic, MovieLens-100K and Criteo data.

`make_source(data_config, max_history)` builds a source from the experiment's [data] table: a built-in
registered in `SOURCE_REGISTRY` by name, or any factory by import path ("pkg.module:attr");
`validate_data_config(data_config)` checks that table without touching any file, so a runner can
refuse a bad spec before training starts. docs/data.md describes every source.
"""

from __future__ import annotations

from typing import Any

from mxlab.data.batch import DataInfo, DataSource, JaggedBatch, rebatch
from mxlab.data.protocols import Source, check_source
from mxlab.registry import Registry
from mxlab.tables import field_names, table_to_dataclass

# The built-in sources by name; a spec may also name any factory by import path ("pkg.module:attr").
SOURCE_REGISTRY = Registry(
    "data source",
    {
        "synthetic": "mxlab.data.synthetic:SyntheticSource",
        "movielens-100k": "mxlab.data.movielens:MovieLensSource",
        "criteo": "mxlab.data.criteo:CriteoSource",
    },
)
SOURCES = SOURCE_REGISTRY.names()
ESMM_TASKS = ("ctr", "cvr", "ctcvr")


def source_factory(source: Any) -> Any:
    """The class or factory a [data] source names (a registered name or "pkg.module:attr"); refuses an unknown
    name or a path that does not import, naming it and the accepted sources."""
    return SOURCE_REGISTRY.resolve(source)


def source_tasks(source: Any) -> tuple[str, ...]:
    """The tasks a source labels (its factory's `tasks`; every ESMM task when it says none): ("ctr",) for a
    click-only source. Refuses an unknown source, naming the accepted ones."""
    return tuple(getattr(source_factory(source), "tasks", ESMM_TASKS))


def source_knows_truth(source: Any) -> bool:
    """True when the source's eval set carries the true probabilities (its factory's `knows_truth`)."""
    return bool(getattr(source_factory(source), "knows_truth", False))


def config_class(source: Any) -> type | None:
    """The config dataclass of a source's [data] table (None for a plug-in without one); refuses an unknown
    source, naming the accepted ones."""
    return getattr(source_factory(source), "config_class", None)


def data_config_keys() -> dict[str, tuple[str, ...]]:
    """Return the accepted [data] keys of each built-in source."""
    return {
        source: field_names(config_class(source)) + tuple(getattr(source_factory(source), "table_only_keys", ()))
        for source in SOURCES
    }


def validate_data_config(data_config: dict) -> Any:
    """Return the typed config dataclass of `data_config` (a [data] table), or the table itself for a
    plug-in source without a `config_class`.

    Refuses (ValueError) a missing or unknown `source` (or an import path that does not import), an unknown
    key (listing the accepted ones), a value of the wrong type or out of range. Touches no data file.
    """
    if not isinstance(data_config, dict) or "source" not in data_config:
        raise ValueError(
            f"the [data] table needs a 'source' key; accepted sources: {', '.join(SOURCES)} or 'pkg.module:attr'"
        )
    source = data_config["source"]
    factory = source_factory(source)
    table_class = getattr(factory, "config_class", None)
    if table_class is None:
        return dict(data_config)
    data_config = factory.resolve_table(data_config) if hasattr(factory, "resolve_table") else data_config
    return table_to_dataclass(
        table_class,
        data_config,
        "data",
        where=f"[data] for source {source!r}",
        ignore=tuple(getattr(factory, "table_only_keys", ())),
    )


def make_source(data_config: dict, max_history: int) -> DataSource:
    """Return the data source described by `data_config`, with histories capped at `max_history`: the source's
    factory called with its validated config (or, for a plug-in without a config class, the table) and
    max_history.

    Refuses (ValueError) what `validate_data_config` refuses, a non-positive max_history and a built source
    that lacks a field of the Source protocol (mxlab.data.protocols); a missing file raises
    FileNotFoundError naming it (for MovieLens, with the fetch command).
    """
    if not isinstance(max_history, int) or isinstance(max_history, bool) or max_history < 1:
        raise ValueError(f"max_history must be a positive integer; got {max_history!r}")
    config = validate_data_config(data_config)
    source = source_factory(data_config["source"])(config, max_history)
    check_source(source, data_config["source"])
    return source


def __getattr__(name: str) -> Any:
    """`DATA_CONFIG_KEYS`: {source: accepted [data] keys}; `CLICK_ONLY_SOURCES`: the built-in sources whose only
    task is CTR (no conversion labels); both computed on first use."""
    if name == "DATA_CONFIG_KEYS":
        return data_config_keys()
    if name == "CLICK_ONLY_SOURCES":
        return tuple(source for source in SOURCES if source_tasks(source) == ("ctr",))
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
    "SOURCE_REGISTRY",
    "Source",
    "check_source",
    "source_factory",
    "source_knows_truth",
    "config_class",
    "data_config_keys",
    "make_source",
    "rebatch",
    "source_tasks",
    "truth_reference",
    "validate_data_config",
]
