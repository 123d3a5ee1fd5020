"""Experiment specs: TOML files (DESIGN.md, "An experiment") loaded into validated dataclasses.

Everything that can be wrong with a spec is found here, before any training: an unknown key,
a wrong type, an arm whose recipe file does not exist, an unknown data source.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxlab.data import SOURCE_REGISTRY, source_knows_truth
from mxlab.experiment.execution import EXECUTORS, ExecutionConfig
from mxlab.experiment.gate import GateConfig, gate_from_table
from mxlab.experiment.overrides import apply_overrides
from mxlab.experiment.report_settings import TRUTH_METRIC_KINDS, ReportSettings
from mxlab.experiment.spec_tables import report_settings, study_tasks, validate_data_table, validate_model_table
from mxlab.experiment.training_recipe import check_training_recipe
from mxlab.tables import OMITTED_AT_DEFAULT, check_keys, check_value, recorded_table, table_to_dataclass
from mxlab.tasks import TaskSet, task_set

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad")
PRECISIONS = ("bf16", "fp32")
TOP_LEVEL_KEYS = (
    *(
        "name",
        "description",
        "seeds",
        "baseline",
        "arms",
        "data",
        "model",
        "train",
        "report",
        "execution",
        "gate",
        "tasks",
    ),
)
REQUIRED_TOP_LEVEL_KEYS = ("name", "seeds", "baseline", "arms", "data", "model")
POST_TRAINING_PREFIX = "post:"  # an arm "post:RECIPE": the baseline's trained model evaluated under RECIPE, no training


def post_training_recipe(arm: str) -> str | None:
    """The recipe name of a post-training arm ("post:mxfp8-rceil" -> "mxfp8-rceil"), None for a training arm."""
    return arm[len(POST_TRAINING_PREFIX) :] if arm.startswith(POST_TRAINING_PREFIX) else None


@dataclass(frozen=True)
class TrainConfig:
    """The [train] table. `max_steps = 0` means no cap; `diagnostics_every = 0` means off. The keys of
    the shared training recipe (optimizer split, warm-up, clipping, output biases, loss spikes) are
    described and checked by mxlab.experiment.training_recipe.

    `precision` is what the model's high-precision GEMMs run in: "bf16" (torch.autocast to
    bfloat16 around the forward pass; master weights, optimizer state and losses stay float32;
    the baseline recipe's "bf16" policy then means real BF16 GEMMs) or "fp32" (no autocast).
    """

    batch_size: int = 256
    lr: float = 1e-3
    epochs: int = 1
    optimizer: str = "adamw"  # the dense parameters' (mxlab.experiment.optim)
    precision: str = "bf16"
    weight_decay: float = 0.01  # on the dense parameters of 2+ dims
    eval_batch_size: int = 4096
    checkpoint_every: int = 200
    diagnostics_every: int = 0
    max_steps: int = 0
    log_every: int = 10
    # Divergence: a non-finite forward loss on more than `nonfinite_patience` consecutive steps,
    # or a loss scale below `min_loss_scale`, stops the run and records it as diverged.
    nonfinite_patience: int = 0
    min_loss_scale: float = 2.0**-24
    # CPU runs: intra-op threads (torch.set_num_threads); 0 keeps torch's default. Small models
    # run faster on one thread, and on a busy machine much faster.
    cpu_threads: int = 0
    # The fork design (docs/statistics.md, "Study designs"): per seed one warm-up run of recipe
    # `fork_from` trains `fork_steps` steps; every arm continues from its weights and optimizer
    # state. "" = from scratch.
    fork_from: str = ""
    fork_steps: int = 0
    # Convergence: every `eval_every` steps (a multiple of log_every; 0 = off) the metrics record of
    # that step also holds the held-out NE and AUC on the first `eval_slice` eval examples (0 = all).
    eval_every: int = 0
    eval_slice: int = 0
    # The learning rate's decay phase: the last `lr_decay_steps` steps of every run take the rate
    # down linearly from `lr` to lr / lr_decay_steps at the last step (0 = a constant rate). A fork
    # warm-up never decays (it is the constant phase every arm continues from), so in the fork
    # design each arm ends in its own decay: the eval then scores a settled model rather than a
    # snapshot of one still moving at full rate.
    lr_decay_steps: int = 0
    # Stop each run after `stop_after` steps of its schedule (0 = run it to the end): the rate's warm-up and decay
    # stay those of max_steps, so a short run is the first steps of the full one (a stability screen). From
    # scratch only.
    stop_after: int = dataclasses.field(default=0, metadata=OMITTED_AT_DEFAULT)
    # The shared training recipe (mxlab.experiment.training_recipe; docs/running.md, "The training recipe")
    embedding_optimizer: str = "rowwise-adagrad"
    embedding_lr: float = 0.01
    warmup_share: float = 0.1
    clip_grad_norm: float = 1.0
    output_bias: str = "base-rates"
    spike_factor: float = 2.0
    # Training through torch.compile: the training step calls the model through `torch.compile(model)`
    # (torch's default settings, as `mxlab bench step --compile`; the loss, backward and optimizer stay
    # eager, evaluation too), compiled from an empty cache at each run's start. Off: eager (the default).
    compile: bool = False


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment: arms x seeds over one data source and one model shape.

    `recipe_paths` maps each arm to its recipe file (`<spec dir>/recipes/ARM.toml`).
    """

    name: str
    seeds: tuple[int, ...]
    baseline: str
    arms: tuple[str, ...]
    data: dict[str, Any]
    model: dict[str, Any]
    train: TrainConfig = field(default_factory=TrainConfig)
    report: ReportSettings = field(default_factory=ReportSettings)  # the [report] table
    description: str = ""
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    recipe_paths: dict[str, Path] = field(default_factory=dict)
    gate: GateConfig = field(default_factory=GateConfig)  # the [gate] table (mxlab.experiment.gate)
    spec_path: Path | None = None
    fork_recipe_path: Path | None = None  # the warm-up's recipe file in the fork design
    tasks: TaskSet = field(default_factory=TaskSet)  # the [tasks] table (mxlab.tasks)

    @property
    def task_names(self) -> tuple[str, ...]:
        """The evaluated tasks: ESMM's that the source labels (mxlab.data.source_tasks), or the independent heads."""
        return study_tasks(self.tasks, self.data["source"])

    @property
    def design(self) -> dict[str, Any]:
        """The study design as study.json records it: {"kind": "from-scratch"} or
        {"kind": "fork", "from": RECIPE, "warmup_steps": N, "recipe": path}."""
        if not self.train.fork_from:
            return {"kind": "from-scratch"}
        return {
            "kind": "fork",
            "from": self.train.fork_from,
            "warmup_steps": self.train.fork_steps,
            "recipe": str(self.fork_recipe_path) if self.fork_recipe_path else None,
        }

    def to_dict(self) -> dict[str, Any]:
        """The resolved spec as plain JSON-able data (what study.json records)."""
        return {
            "name": self.name,
            "description": self.description,
            "seeds": list(self.seeds),
            "baseline": self.baseline,
            "arms": list(self.arms),
            "data": copy.deepcopy(self.data),
            "model": copy.deepcopy(self.model),
            "train": recorded_table(self.train),
            "report": self.report.to_dict(),
            "execution": dataclasses.asdict(self.execution),
            "gate": self.gate.to_dict(),
            "recipes": {arm: str(path) for arm, path in self.recipe_paths.items()},
            "spec_path": str(self.spec_path) if self.spec_path else None,
            "design": self.design,
            **({} if self.tasks.is_default else {"tasks": self.tasks.to_dict()}),
        }

    def with_train(self, **changes: Any) -> ExperimentSpec:
        """A copy with some [train] values replaced (validated like the file's)."""
        merged = {**dataclasses.asdict(self.train), **changes}
        return dataclasses.replace(self, train=_build_table(TrainConfig, merged, "train"))


# ----------------------------------------------------------------------------------------------
# tables


def _build_table(cls: type, table: Mapping[str, Any], where: str) -> Any:
    """The frozen dataclass `cls` of a TOML table: keys and types checked (mxlab.tables), then its ranges."""
    config = table_to_dataclass(cls, table, where)
    _check_ranges(config, where)
    return config


def _check_ranges(config: Any, where: str) -> None:
    if isinstance(config, ExecutionConfig):
        if config.executor not in EXECUTORS:
            raise ValueError(f"{where}.executor {config.executor!r} is not one of: {', '.join(EXECUTORS)}")
        for key, low in (("gpus", 0), ("cpus_per_run", 1), ("max_retries", 0), ("runs_per_device", 1)):
            if getattr(config, key) < low:
                raise ValueError(f"{where}.{key} must be >= {low}, got {getattr(config, key)}")
    if isinstance(config, TrainConfig):
        check_training_recipe(config, where)
        for key in ("batch_size", "eval_batch_size", "epochs", "log_every"):
            if getattr(config, key) < 1:
                raise ValueError(f"{where}.{key} must be >= 1, got {getattr(config, key)}")
        for key in (
            "checkpoint_every",
            "diagnostics_every",
            "max_steps",
            "nonfinite_patience",
            "cpu_threads",
            "fork_steps",
            "eval_every",
            "eval_slice",
            "lr_decay_steps",
            "stop_after",
        ):
            if getattr(config, key) < 0:
                raise ValueError(f"{where}.{key} must be >= 0 (0 = off), got {getattr(config, key)}")
        for key in ("lr", "weight_decay", "min_loss_scale"):
            if not math.isfinite(getattr(config, key)):
                raise ValueError(f"{where}.{key} must be a finite number, got {getattr(config, key)}")
        if not config.lr > 0:
            raise ValueError(f"{where}.lr must be > 0, got {config.lr}")
        for key in ("weight_decay", "min_loss_scale"):
            if getattr(config, key) < 0:
                raise ValueError(f"{where}.{key} must be >= 0, got {getattr(config, key)}")
        if config.precision not in PRECISIONS:
            raise ValueError(f"{where}.precision {config.precision!r} is not one of: {', '.join(PRECISIONS)}")
        if config.optimizer not in OPTIMIZERS:
            raise ValueError(f"{where}.optimizer {config.optimizer!r} is not one of: {', '.join(OPTIMIZERS)}")
        if bool(config.fork_from) != bool(config.fork_steps):
            raise ValueError(
                f"{where}.fork_from ({config.fork_from!r}) and {where}.fork_steps ({config.fork_steps}) go "
                f"together: a recipe name and a number of warm-up steps >= 1, or neither (from scratch)"
            )
        if config.lr_decay_steps and config.max_steps and config.lr_decay_steps > config.max_steps:
            raise ValueError(
                f"{where}.lr_decay_steps ({config.lr_decay_steps}) must be <= {where}.max_steps "
                f"({config.max_steps}): the decay is the last part of each run's own steps"
            )
        if config.stop_after and (config.fork_from or (config.max_steps and config.stop_after > config.max_steps)):
            raise ValueError(
                f"{where}.stop_after ({config.stop_after}) must be <= {where}.max_steps ({config.max_steps}) and "
                f"needs a from-scratch study (fork_from {config.fork_from!r}): it stops a run early in its schedule"
            )
        if config.eval_every and config.eval_every % config.log_every:
            raise ValueError(
                f"{where}.eval_every ({config.eval_every}) must be a multiple of {where}.log_every "
                f"({config.log_every}): held-out metrics are written into that step's metrics record"
            )


# ----------------------------------------------------------------------------------------------
# recipes


def recipe_dir_for(spec_path: Path) -> Path:
    """The folder where a spec's arms find their recipes: `<spec dir>/recipes`."""
    return Path(spec_path).resolve().parent / "recipes"


def resolve_recipe_path(name: str, recipe_dir: Path) -> Path:
    """The recipe file of an arm, found where `load_recipe` finds recipes (mxlab.recipe.library.find_recipe):
    `recipe_dir/NAME.toml` (beside the spec) first, then $MXLAB_RECIPES, then the shipped recipes;
    refuses a name found in none, listing the folders searched and the names there."""
    from mxlab.recipe.library import find_recipe

    try:
        return find_recipe(name, [recipe_dir])
    except ValueError as error:
        raise ValueError(f"unknown arm/recipe {name!r}: {error}") from None


def _check_recipe_loads(arm: str, path: Path) -> None:
    """Refuses (ValueError naming the arm and the file) a recipe file that load_recipe refuses."""
    from mxlab.recipe import load_recipe

    try:
        load_recipe(path)
    except ValueError as error:
        raise ValueError(f"arm {arm!r}: recipe {path} is invalid: {error}") from error


# ----------------------------------------------------------------------------------------------
# loading


def spec_from_dict(
    raw: Mapping[str, Any], *, recipe_dir: Path, spec_path: Path | None = None, check_recipes: bool = True
) -> ExperimentSpec:
    """Validate a raw spec table into an ExperimentSpec.

    Refuses (ValueError naming the value and the accepted ones): an unknown or missing key, a
    wrong type, an empty or duplicated arm or seed list, a baseline that is not an arm, an arm
    without a recipe file in `recipe_dir`, an unknown data source.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"an experiment spec must be a table, got {raw!r}")
    check_keys(raw, TOP_LEVEL_KEYS, "")
    missing = [key for key in REQUIRED_TOP_LEVEL_KEYS if key not in raw]
    if missing:
        raise ValueError(f"the spec is missing {missing[0]!r}; required keys: {', '.join(REQUIRED_TOP_LEVEL_KEYS)}")

    name = check_value(raw["name"], str, "name")
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name {name!r} must be a non-empty folder name (no '/', not starting with '.')")
    description = check_value(raw.get("description", ""), str, "description")

    seeds_raw = raw["seeds"]
    if not isinstance(seeds_raw, list) or not seeds_raw:
        raise ValueError(f"seeds must be a non-empty list of integers, got {seeds_raw!r}")
    seeds = tuple(check_value(seed, int, f"seeds[{index}]") for index, seed in enumerate(seeds_raw))
    if any(seed < 0 for seed in seeds):
        raise ValueError(f"seeds must be >= 0, got {list(seeds)}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")

    arms_raw = raw["arms"]
    if not isinstance(arms_raw, list) or not arms_raw:
        raise ValueError(f"arms must be a non-empty list of recipe names, got {arms_raw!r}")
    arms = tuple(check_value(arm, str, f"arms[{index}]") for index, arm in enumerate(arms_raw))
    if len(set(arms)) != len(arms):
        duplicated = sorted({arm for arm in arms if arms.count(arm) > 1})
        raise ValueError(f"arms must be distinct; repeated: {', '.join(duplicated)}")
    baseline = check_value(raw["baseline"], str, "baseline")
    if baseline not in arms:
        raise ValueError(f"baseline {baseline!r} is not one of the arms: {', '.join(arms)}")

    data = validate_data_table(raw["data"])
    model = validate_model_table(raw["model"])
    train = _build_table(TrainConfig, raw.get("train", {}), "train")
    recipe_paths = {arm: resolve_recipe_path(post_training_recipe(arm) or arm, recipe_dir) for arm in arms}
    if post_training_recipe(baseline) is not None:
        raise ValueError(
            f"baseline {baseline!r} is a post-training arm; the baseline must train "
            f"(a post-training arm evaluates the baseline's trained model)"
        )
    fork_recipe_path = None
    if train.fork_from:
        try:
            fork_recipe_path = resolve_recipe_path(train.fork_from, recipe_dir)
        except ValueError as error:
            raise ValueError(f"train.fork_from: {error}") from None
    tasks = task_set(raw.get("tasks"))
    report = report_settings(raw.get("report", {}), data["source"], tasks)
    try:
        report.check_arms(arms, baseline)
    except ValueError as error:
        raise ValueError(f"[report]: {error}") from None
    if report.plateau_window and not train.eval_every:
        raise ValueError(
            f"[report] plateau_window = {report.plateau_window:g} needs held-out records to judge: set "
            "[train] eval_every (a multiple of log_every), or plateau_window = 0 for no plateau rule"
        )
    execution = _build_table(ExecutionConfig, raw.get("execution", {}), "execution")
    gate = gate_from_table(
        raw.get("gate", {}),
        seeds=seeds,
        fork=bool(train.fork_from),
        has_truth=source_knows_truth(data["source"]),
        tasks=study_tasks(tasks, data["source"]),
    )
    needs_truth = [m for m in report.primary if m.split(".", 1)[1] in TRUTH_METRIC_KINDS]
    if needs_truth and not source_knows_truth(data["source"]):
        truthful = [name for name in SOURCE_REGISTRY if source_knows_truth(name)]
        raise ValueError(
            f"[report] primary {needs_truth} needs a source with truth ({', '.join(truthful)}); "
            f"[data] source is {data['source']!r}"
        )

    if check_recipes:
        for arm, path in recipe_paths.items():
            _check_recipe_loads(arm, path)
        if fork_recipe_path is not None:
            _check_recipe_loads(f"fork warm-up {train.fork_from}", fork_recipe_path)

    return ExperimentSpec(
        name=name,
        seeds=seeds,
        baseline=baseline,
        arms=arms,
        data=data,
        model=model,
        train=train,
        report=report,
        description=description,
        execution=execution,
        recipe_paths=recipe_paths,
        gate=gate,
        spec_path=Path(spec_path).resolve() if spec_path else None,
        fork_recipe_path=fork_recipe_path,
        tasks=tasks,
    )


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentSpec:
    """Load, override (`key=value` strings, see `parse_override`) and validate the spec at `path`.

    Returns the ExperimentSpec; refuses a missing file, malformed TOML and everything
    `spec_from_dict` refuses.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no experiment spec at {path}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path} is not valid TOML: {error}") from error
    raw = apply_overrides(raw, overrides)
    return spec_from_dict(raw, recipe_dir=recipe_dir_for(path), spec_path=path)
