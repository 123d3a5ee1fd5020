"""Recipes: which precision every GEMM of a model gets, by module name.

A recipe (TOML, format in DESIGN.md) names precision policies and maps module qualified names to
them with fnmatch rules; the first matching rule wins, unmatched modules get `default`.
`apply_recipe(model, recipe)` swaps every reachable `nn.Linear` for a `QLinear` sharing its
parameters, sets the `policy` of every `JaggedAttention` module, and returns the `Plan`.

Reachable ("quantizable") modules: modules whose type is exactly `nn.Linear`, `QLinear`s, and
modules of a class named `JaggedAttention` (mxlab.nn.attention). Subclasses of nn.Linear with
their own forward (e.g. the out_proj of nn.MultiheadAttention, which is never called) are not
reachable. A rule that matches no reachable module is an error: the names in a recipe are the
names of one model (the shipped recipes use the GEM model's names: `history.blocks.0.attn.qkv`,
`towers.ctr.out`, ...), so on another model they fail and the message lists the names there are.

Policy tables (`[policies.NAME]`):

- `all = FMT` sets every operand of the three GEMMs; `fwd`, `dgrad`, `wgrad` set one GEMM,
  either to one format (`fwd = "e4m3"`) or per operand: fwd {input, weight}, dgrad
  {grad_output, weight}, wgrad {grad_output, input}. Each GEMM must be set by one or the other.
  FMT: e4m3 e5m2 e3m2 e2m3 e2m1 int8 (MX), fp8_tensor_e4m3 fp8_tensor_e5m2 (per-tensor FP8,
  current scaling), bf16 / fp32 (high precision: the operand is used as the baseline has it).
  A policy whose every operand is high precision leaves the module exactly as it was.
- `block = 32` or `[32, 32]` for every operand, or per operand `{weight = [32, 32]}` (others 32).
  A (32, 32) weight tile is transpose-invariant, so fwd and dgrad see the same quantized weight.
- `scale_mode`: floor (OCP v1.0), ceil, rceil, even. Default floor.
- `rounding = MODE` for every operand, or `{fwd = MODE, grad = MODE}`: `grad` is the rounding of
  the gradient operand (grad_output in dgrad and wgrad), `fwd` that of activations and weights
  in every GEMM. MODE: nearest_even (default), nearest_away, toward_zero, stochastic.
- `hadamard = false` (default), `true` (block 32) or a block size (16..256): a random Hadamard
  transform of both wgrad operands along the token axis before quantization.

`[attention]`: `qk` and `pv` are a format (every operand, forward and backward) or
`{fwd = FMT, grad = FMT}` (grad: the format of the incoming gradient in the backward products);
optional `block`, `scale_mode`, `rounding` as in a policy (default: those of the `default`
policy). An attention module gets these products when the policy it resolves to (rule or
default) is not all high precision; otherwise, or without an `[attention]` table, its policy is
None (plain matmuls).

`[loss_scaling]`: see mxlab.scaling.
"""
from __future__ import annotations

import copy
import glob
import zlib
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Optional

from torch import nn

from mxlab.nn.qmatmul import (
    HADAMARD_BLOCKS,
    OPERAND_FORMATS,
    ROUNDINGS,
    SCALE_MODES,
    GemmQuant,
    MatmulPrecision,
    OperandQuant,
)
from mxlab.scaling import LossScalingConfig, parse_loss_scaling

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RECIPE_KEYS = ("name", "description", "default", "policies", "rules", "attention", "loss_scaling")
POLICY_KEYS = ("all", "fwd", "dgrad", "wgrad", "block", "scale_mode", "rounding", "hadamard")
ATTENTION_KEYS = ("qk", "pv", "block", "scale_mode", "rounding")
RULE_KEYS = ("match", "policy")
GEMM_OPERANDS = {"fwd": ("input", "weight"), "dgrad": ("grad_output", "weight"), "wgrad": ("grad_output", "input")}
OPERAND_NAMES = ("input", "weight", "grad_output")
ROUNDING_KEYS = ("fwd", "grad")
LINEAR_LABELS = ("fwd", "dgrad", "wgrad")
ATTENTION_PRODUCTS = ("qk", "pv")
SWEEP_HIGH_PRECISION_POLICY = "bf16-sweep"

_REPO_RECIPE_DIR = Path(__file__).resolve().parent.parent / "experiments" / "recipes"


# --------------------------------------------------------------------------------- dataclasses
@dataclass(frozen=True)
class LinearPolicy:
    """One named policy: the precision of the fwd, dgrad and wgrad GEMMs of a linear layer.

    `fwd` operands are (input, weight); `dgrad` (grad_output, weight); `wgrad` (input,
    grad_output), the order in which qmatmul's grad_b GEMM takes them.
    """

    name: str
    fwd: GemmQuant
    dgrad: GemmQuant
    wgrad: GemmQuant
    scale_mode: str = "floor"
    rounding_fwd: str = "nearest_even"
    rounding_grad: str = "nearest_even"

    @property
    def high_precision(self) -> bool:
        return self.fwd.high_precision and self.dgrad.high_precision and self.wgrad.high_precision

    def to_precision(self, name: str = "", seed: int = 0) -> Optional[MatmulPrecision]:
        """A fresh MatmulPrecision for one module (None when every GEMM is high precision)."""
        if self.high_precision:
            return None
        return MatmulPrecision(self.fwd, self.dgrad, self.wgrad, labels=LINEAR_LABELS, name=name, seed=seed)

    def describe(self) -> dict[str, str]:
        """Each GEMM's operands in words, keyed fwd / dgrad / wgrad."""
        return {label: describe_gemm(gemm) for label, gemm in zip(LINEAR_LABELS, (self.fwd, self.dgrad, self.wgrad))}


@dataclass(frozen=True)
class AttentionRecipe:
    """The `[attention]` table: forward and gradient operand precisions of QK^T and PV."""

    qk_fwd: OperandQuant
    qk_grad: OperandQuant
    pv_fwd: OperandQuant
    pv_grad: OperandQuant

    def product_precision(self, product: str, name: str, seed: int) -> Optional[MatmulPrecision]:
        """MatmulPrecision of `product` (qk or pv) for the module `name`; None when all high precision."""
        fwd, grad = (self.qk_fwd, self.qk_grad) if product == "qk" else (self.pv_fwd, self.pv_grad)
        precision = MatmulPrecision(
            fwd=GemmQuant(fwd, fwd),
            grad_a=GemmQuant(grad, fwd),
            grad_b=GemmQuant(fwd, grad),
            labels=(product, f"{product}_grad_a", f"{product}_grad_b"),
            name=name,
            seed=seed,
        )
        return None if precision.high_precision else precision

    def describe(self) -> dict[str, str]:
        return {
            "qk": f"fwd {self.qk_fwd.describe()}, grad {self.qk_grad.describe()}",
            "pv": f"fwd {self.pv_fwd.describe()}, grad {self.pv_grad.describe()}",
        }


@dataclass
class AttentionPolicy:
    """What a JaggedAttention module's `policy` holds: the precisions of its two products
    (None: that product is a plain matmul)."""

    qk: Optional[MatmulPrecision] = None
    pv: Optional[MatmulPrecision] = None

    def __repr__(self) -> str:
        def short(precision: Optional[MatmulPrecision]) -> str:
            return "high precision" if precision is None else precision.fwd.describe()

        return f"AttentionPolicy(qk={short(self.qk)}, pv={short(self.pv)})"


@dataclass(frozen=True)
class Rule:
    match: str
    policy: str


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. `table` is the recipe as a plain dict (TOML-shaped), from which
    `parse_recipe(recipe.table)` rebuilds the same recipe."""

    name: str
    default: str
    policies: dict[str, LinearPolicy]
    rules: tuple[Rule, ...]
    attention: Optional[AttentionRecipe]
    loss_scaling: LossScalingConfig
    description: str = ""
    source: Optional[str] = None
    table: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def policy_for(self, module_name: str) -> tuple[LinearPolicy, str]:
        """(policy, the rule's match pattern or 'default') for a module name."""
        for rule in self.rules:
            if fnmatchcase(module_name, rule.match):
                return self.policies[rule.policy], rule.match
        return self.policies[self.default], "default"

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON/TOML-serializable dict (name included)."""
        return copy.deepcopy({**self.table, "name": self.name})


# --------------------------------------------------------------------------------- parsing
def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _check_keys(table: Any, accepted: tuple[str, ...], where: str) -> None:
    if not isinstance(table, dict):
        raise _fail(where, f"must be a table, got {table!r}")
    unknown = [key for key in table if key not in accepted]
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(map(repr, unknown))}; accepted: {', '.join(accepted)}")


def _check_choice(value: Any, accepted: tuple[str, ...], what: str, where: str) -> str:
    if value not in accepted:
        raise _fail(where, f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


def _parse_block(value: Any, where: str) -> Any:
    if isinstance(value, bool) or not (value == 32 or (isinstance(value, list) and value == [32, 32])):
        raise _fail(where, f"unknown block {value!r}; accepted: 32 or [32, 32]")
    return 32 if value == 32 else (32, 32)


def _operand_blocks(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        _check_keys(value, OPERAND_NAMES, f"{where}.block")
        return {name: _parse_block(value.get(name, 32), f"{where}.block.{name}") for name in OPERAND_NAMES}
    block = _parse_block(value, f"{where}.block")
    return {name: block for name in OPERAND_NAMES}


def _roundings(value: Any, where: str) -> tuple[str, str]:
    if isinstance(value, dict):
        _check_keys(value, ROUNDING_KEYS, f"{where}.rounding")
        return (
            _check_choice(value.get("fwd", "nearest_even"), ROUNDINGS, "rounding", f"{where}.rounding.fwd"),
            _check_choice(value.get("grad", "nearest_even"), ROUNDINGS, "rounding", f"{where}.rounding.grad"),
        )
    mode = _check_choice(value, ROUNDINGS, "rounding", f"{where}.rounding")
    return mode, mode


def _hadamard(value: Any, where: str) -> Optional[int]:
    if value is False:
        return None
    if value is True:
        return 32
    if isinstance(value, int) and not isinstance(value, bool) and value in HADAMARD_BLOCKS:
        return value
    raise _fail(where, f"hadamard = {value!r} is invalid; accepted: false, true (block 32) or a block of {HADAMARD_BLOCKS}")


def _parse_policy(name: str, table: Any) -> LinearPolicy:
    where = f"[policies.{name}]"
    if isinstance(table, dict) and "backend" in table:  # a policy of another backend (Transformer Engine)
        from mxlab.te_backend import parse_backend_policy

        return parse_backend_policy(name, table)
    _check_keys(table, POLICY_KEYS, where)
    scale_mode = _check_choice(table.get("scale_mode", "floor"), SCALE_MODES, "scale_mode", f"{where}.scale_mode")
    rounding_fwd, rounding_grad = _roundings(table.get("rounding", "nearest_even"), where)
    blocks = _operand_blocks(table.get("block", 32), where)
    hadamard = _hadamard(table.get("hadamard", False), f"{where}.hadamard")
    default_fmt = table.get("all")
    if default_fmt is not None:
        _check_choice(default_fmt, OPERAND_FORMATS, "format", f"{where}.all")

    def operand(gemm: str, operand_name: str) -> OperandQuant:
        spec = table.get(gemm, default_fmt)
        if spec is None:
            raise _fail(where, f"the precision of {gemm} is not given; set {gemm} = FMT, {gemm} = {{...}} or all = FMT")
        if isinstance(spec, dict):
            _check_keys(spec, GEMM_OPERANDS[gemm], f"{where}.{gemm}")
            fmt = spec.get(operand_name, default_fmt)
            if fmt is None:
                raise _fail(f"{where}.{gemm}", f"operand {operand_name!r} has no format (operands: {', '.join(GEMM_OPERANDS[gemm])})")
        else:
            fmt = spec
        _check_choice(fmt, OPERAND_FORMATS, "format", f"{where}.{gemm}.{operand_name}")
        rounding = rounding_grad if operand_name == "grad_output" else rounding_fwd
        return OperandQuant(fmt, blocks[operand_name], scale_mode, rounding)

    fwd = GemmQuant(operand("fwd", "input"), operand("fwd", "weight"))
    dgrad = GemmQuant(operand("dgrad", "grad_output"), operand("dgrad", "weight"))
    wgrad = GemmQuant(operand("wgrad", "input"), operand("wgrad", "grad_output"), hadamard=hadamard)
    if hadamard is not None and wgrad.a.high_precision and wgrad.b.high_precision:
        raise _fail(where, "hadamard is set but both wgrad operands are high precision; it would change nothing")
    return LinearPolicy(name, fwd, dgrad, wgrad, scale_mode, rounding_fwd, rounding_grad)


def _parse_attention(table: Any, default_policy: LinearPolicy) -> AttentionRecipe:
    where = "[attention]"
    _check_keys(table, ATTENTION_KEYS, where)
    scale_mode = _check_choice(table.get("scale_mode", default_policy.scale_mode), SCALE_MODES, "scale_mode", f"{where}.scale_mode")
    if "rounding" in table:
        rounding_fwd, rounding_grad = _roundings(table["rounding"], where)
    else:
        rounding_fwd, rounding_grad = default_policy.rounding_fwd, default_policy.rounding_grad
    block = _parse_block(table.get("block", 32), f"{where}.block")
    products = {}
    for product in ATTENTION_PRODUCTS:
        spec = table.get(product)
        if spec is None:
            raise _fail(where, f"{product} is not given; set {product} = FMT or {product} = {{fwd = FMT, grad = FMT}} (FMT bf16 keeps it high precision)")
        if isinstance(spec, dict):
            _check_keys(spec, ROUNDING_KEYS, f"{where}.{product}")
            missing = [key for key in ROUNDING_KEYS if key not in spec]
            if missing:
                raise _fail(f"{where}.{product}", f"missing {', '.join(missing)}")
            fwd_fmt, grad_fmt = spec["fwd"], spec["grad"]
        else:
            fwd_fmt = grad_fmt = spec
        _check_choice(fwd_fmt, OPERAND_FORMATS, "format", f"{where}.{product}")
        _check_choice(grad_fmt, OPERAND_FORMATS, "format", f"{where}.{product}")
        products[product] = (
            OperandQuant(fwd_fmt, block, scale_mode, rounding_fwd),
            OperandQuant(grad_fmt, block, scale_mode, rounding_grad),
        )
    return AttentionRecipe(*products["qk"], *products["pv"])


def parse_recipe(table: dict[str, Any], source: Optional[str] = None, name: Optional[str] = None) -> Recipe:
    """A validated Recipe from a TOML-shaped dict.

    Refuses (ValueError naming the offending key or value and the accepted ones): unknown keys
    at any level, unknown formats, scale modes, roundings or blocks, a missing or unknown default
    policy, rules naming unknown policies, malformed rules or loss-scaling tables.
    """
    where = source or "recipe"
    _check_keys(table, RECIPE_KEYS, where)
    recipe_name = table.get("name", name)
    if not isinstance(recipe_name, str) or not recipe_name:
        raise _fail(where, "needs a name = \"...\"")
    policies_table = table.get("policies")
    if not isinstance(policies_table, dict) or not policies_table:
        raise _fail(where, "needs at least one [policies.NAME] table")
    try:
        policies = {policy_name: _parse_policy(policy_name, policy) for policy_name, policy in policies_table.items()}
        default = table.get("default")
        if not isinstance(default, str) or default not in policies:
            raise _fail("default", f"names unknown policy {default!r}; policies: {', '.join(policies)}")
        rules_table = table.get("rules", [])
        if not isinstance(rules_table, list):
            raise _fail("rules", "must be an array of tables: [[rules]] match = \"...\" policy = \"...\"")
        rules = []
        for index, rule in enumerate(rules_table):
            rule_where = f"[[rules]] #{index + 1}"
            _check_keys(rule, RULE_KEYS, rule_where)
            if not isinstance(rule.get("match"), str) or not rule["match"]:
                raise _fail(rule_where, f"needs match = \"PATTERN\" (fnmatch on module names), got {rule.get('match')!r}")
            if not isinstance(rule.get("policy"), str) or rule["policy"] not in policies:
                raise _fail(rule_where, f"names unknown policy {rule.get('policy')!r}; policies: {', '.join(policies)}")
            rules.append(Rule(rule["match"], rule["policy"]))
        attention = _parse_attention(table["attention"], policies[default]) if "attention" in table else None
        loss_scaling = parse_loss_scaling(table.get("loss_scaling"))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    description = table.get("description", "")
    if not isinstance(description, str):
        raise _fail(where, f"description must be a string, got {description!r}")
    return Recipe(
        name=recipe_name,
        default=default,
        policies=policies,
        rules=tuple(rules),
        attention=attention,
        loss_scaling=loss_scaling,
        description=description,
        source=source,
        table=copy.deepcopy({**table, "name": recipe_name}),
    )


def recipe_dirs(search_dirs: tuple[str | Path, ...] | list[str | Path] = ()) -> list[Path]:
    """Directories searched for a recipe name: `search_dirs`, ./experiments/recipes, then the repository's."""
    dirs = [Path(d) for d in search_dirs] + [Path.cwd() / "experiments" / "recipes", _REPO_RECIPE_DIR]
    unique: list[Path] = []
    for directory in dirs:
        if directory not in unique:
            unique.append(directory)
    return unique


def available_recipes(search_dirs: tuple[str | Path, ...] | list[str | Path] = ()) -> list[str]:
    """Names of the recipes (*.toml stems) found in the search directories."""
    return sorted({path.stem for directory in recipe_dirs(search_dirs) if directory.is_dir() for path in directory.glob("*.toml")})


def load_recipe(name_or_path: str | Path, search_dirs: tuple[str | Path, ...] | list[str | Path] = ()) -> Recipe:
    """Load and validate a recipe from a TOML path or a recipe name (looked up as NAME.toml in
    `search_dirs`, ./experiments/recipes and the repository's experiments/recipes).

    Refuses an unknown name (listing the available ones), unreadable TOML (with the parser's
    message) and everything `parse_recipe` refuses.
    """
    path = Path(name_or_path)
    if not path.is_file():
        candidates = [directory / f"{name_or_path}.toml" for directory in recipe_dirs(search_dirs)]
        found = [candidate for candidate in candidates if candidate.is_file()]
        if not found:
            raise ValueError(
                f"no recipe {str(name_or_path)!r}: not a file and not a name in {', '.join(map(str, recipe_dirs(search_dirs)))}; "
                f"available: {', '.join(available_recipes(search_dirs)) or 'none'}"
            )
        path = found[0]
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: malformed TOML: {error}") from None
    return parse_recipe(table, source=str(path), name=path.stem)


# --------------------------------------------------------------------------------- model side
def _is_attention(module: nn.Module) -> bool:
    return any(cls.__name__ == "JaggedAttention" for cls in type(module).__mro__)


def _is_linear(module: nn.Module) -> bool:
    from mxlab.nn.linear import QLinear

    return type(module) is nn.Linear or isinstance(module, QLinear)


def _reachable(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    found = []
    for name, module in model.named_modules():
        if _is_linear(module):
            found.append((name, module, "linear"))
        elif _is_attention(module):
            found.append((name, module, "attention"))
    return found


def quantizable_modules(model: nn.Module, recipe: Optional[Recipe] = None) -> list[str]:
    """Qualified names of the modules a recipe can reach (linear layers and JaggedAttention), in
    model order. With `recipe`, attention modules are left out when it has no `[attention]` table
    (it could not quantize them)."""
    return [
        name for name, _, kind in _reachable(model)
        if kind == "linear" or recipe is None or recipe.attention is not None
    ]


def module_seed(run_seed: int, module_name: str, product: str = "") -> int:
    """The base seed of one module's (or attention product's) stochastic rounding: a function of
    the run seed and the qualified name only, so it does not depend on which other modules exist."""
    return (int(run_seed) * 0x9E3779B1 + zlib.crc32(f"{module_name}/{product}".encode())) & 0xFFFFFFFFFFFF


@dataclass
class PlanEntry:
    """One reachable module in the plan."""

    module: str
    kind: str  # linear | attention
    policy: str  # the policy name
    rule: str  # the matching rule's pattern, or "default"
    quantized: bool
    gemms: dict[str, str]  # GEMM (fwd/dgrad/wgrad or qk/pv) -> precision in words
    padded: list[str] = field(default_factory=list)
    backend: str = "mxlab"  # mxlab (emulation) | te (the module became a Transformer Engine te.Linear)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module, "kind": self.kind, "policy": self.policy, "rule": self.rule,
            "quantized": self.quantized, "gemms": dict(self.gemms), "padded": list(self.padded),
            "backend": self.backend, "note": self.note,
        }


@dataclass
class Plan:
    """What `apply_recipe` did: each reachable module's policy, and which stayed high precision."""

    recipe: str
    seed: int
    entries: list[PlanEntry]
    loss_scaling: dict[str, Any]

    @property
    def quantized_modules(self) -> list[str]:
        return [entry.module for entry in self.entries if entry.quantized]

    @property
    def high_precision_modules(self) -> list[str]:
        return [entry.module for entry in self.entries if not entry.quantized]

    @property
    def padded_modules(self) -> dict[str, list[str]]:
        return {entry.module: entry.padded for entry in self.entries if entry.padded}

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-serializable dict."""
        return {
            "recipe": self.recipe,
            "seed": self.seed,
            "modules": [entry.to_dict() for entry in self.entries],
            "quantized": self.quantized_modules,
            "high_precision": self.high_precision_modules,
            "padded": self.padded_modules,
            "backends": {entry.module: entry.backend for entry in self.entries if entry.backend != "mxlab"},
            "loss_scaling": dict(self.loss_scaling),
        }

    def table(self) -> str:
        """A fixed-width text table: module, kind, policy, rule, each GEMM's precision, notes."""
        header = ["module", "kind", "policy", "rule", "precision", "notes"]
        rows = []
        for entry in self.entries:
            if entry.quantized:
                precision = "; ".join(f"{gemm}: {text}" for gemm, text in entry.gemms.items())
            else:
                precision = "high precision (unchanged)"
            notes = "padded " + ", ".join(entry.padded) if entry.padded and entry.quantized else ""
            notes = "; ".join(text for text in (f"backend {entry.backend}" if entry.backend != "mxlab" else "", notes, entry.note) if text)
            rows.append([entry.module, entry.kind, entry.policy, entry.rule, precision, notes])
        widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
        lines = [f"recipe {self.recipe} (seed {self.seed}): {len(self.quantized_modules)} quantized, "
                 f"{len(self.high_precision_modules)} high precision; loss scaling {self.loss_scaling.get('policy')}"]
        for index, row in enumerate([header] + rows):
            lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * width for width in widths))
        return "\n".join(lines)


def _replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def apply_recipe(model: nn.Module, recipe: Recipe, *, seed: int = 0) -> Plan:
    """Apply `recipe` to `model` in place and return the Plan.

    Every reachable linear module whose policy is not all high precision becomes a QLinear sharing
    the same Parameters (a QLinear whose policy is high precision gets precision None, i.e. plain
    nn.Linear); every JaggedAttention gets `policy` = AttentionPolicy or None. `seed` (the run seed)
    seeds stochastic rounding, per module (see `module_seed`). Never patches torch functions.
    Refuses (ValueError) a rule that matches no reachable module, listing the reachable names, and
    a model with no reachable module at all. A linear module whose policy has backend = "te" becomes
    a Transformer Engine te.Linear (see mxlab.te_backend, which refuses, before any swap, with
    BackendUnavailableError when TE cannot run here).
    """
    from mxlab.nn.linear import QLinear

    if not isinstance(recipe, Recipe):
        raise ValueError(f"apply_recipe needs a Recipe (see load_recipe), got {type(recipe).__name__}")
    reachable = _reachable(model)
    names = [name for name, _, _ in reachable]
    if not names:
        raise ValueError(f"recipe {recipe.name!r}: the model has no nn.Linear or JaggedAttention module to apply it to")
    for rule in recipe.rules:
        if not any(fnmatchcase(name, rule.match) for name in names):
            shown = ", ".join(names[:40]) + (f", ... ({len(names)} in all)" if len(names) > 40 else "")
            raise ValueError(
                f"recipe {recipe.name!r}: rule match = {rule.match!r} matches no module of this model "
                f"(recipes name modules of one model; the shipped ones use the GEM model's names). "
                f"Reachable modules: {shown}"
            )
    te_linears = [(name, module, recipe.policy_for(name)[0]) for name, module, kind in reachable
                  if kind == "linear" and getattr(recipe.policy_for(name)[0], "backend", "mxlab") == "te"]
    if te_linears:  # refuses (TE missing, no CUDA, unsupported recipe, unaligned module) before any swap
        from mxlab import te_backend

        te_handle = te_backend.check_te_linears(te_linears)
    entries = []
    for name, module, kind in reachable:
        policy, rule = recipe.policy_for(name)
        if kind == "linear" and getattr(policy, "backend", "mxlab") == "te":
            entries.append(te_backend.apply_te_policy(model, name, module, policy, rule, te_handle))
            continue
        if kind == "linear":
            precision = policy.to_precision(name, module_seed(seed, name))
            if isinstance(module, QLinear):
                module.precision = precision
            elif precision is not None:
                module = QLinear.from_linear(module, precision)
                _replace_module(model, name, module)
            quantized = precision is not None
            gemms = policy.describe() if quantized else {}
            padded = module.padded_dims if isinstance(module, QLinear) else []
        else:
            attention_policy = None
            if recipe.attention is not None and not policy.high_precision:
                qk = recipe.attention.product_precision("qk", name, module_seed(seed, name, "qk"))
                pv = recipe.attention.product_precision("pv", name, module_seed(seed, name, "pv"))
                if qk is not None or pv is not None:
                    attention_policy = AttentionPolicy(qk=qk, pv=pv)
            module.policy = attention_policy
            quantized = attention_policy is not None
            gemms = recipe.attention.describe() if quantized and recipe.attention is not None else {}
            padded = []
        entries.append(PlanEntry(name, kind, policy.name, rule, quantized, gemms, padded))
    return Plan(recipe=recipe.name, seed=int(seed), entries=entries, loss_scaling=recipe.loss_scaling.to_dict())


def describe_gemm(gemm: GemmQuant) -> str:
    """One GEMM's precision in words (GemmQuant.describe), e.g. `e4m3 b32 rceil` or `bf16`."""
    return gemm.describe()


def single_layer_recipe(recipe: Recipe, module_name: str, invert: bool = False) -> Recipe:
    """A recipe that quantizes only `module_name` with `recipe`'s default policy (all other modules
    high precision), or with invert=True every module by the default policy except `module_name`,
    which stays high precision. Rules of `recipe` are dropped; [attention] and [loss_scaling] are
    kept. `module_name` is matched literally; apply_recipe refuses it if the model has no such module.
    Refuses a recipe whose default policy is all high precision (nothing to sweep).
    """
    default_policy = recipe.policies[recipe.default]
    if default_policy.high_precision:
        raise ValueError(f"recipe {recipe.name!r}: its default policy {recipe.default!r} is all high precision; nothing to sweep")
    if not isinstance(module_name, str) or not module_name:
        raise ValueError(f"module_name must be a module's qualified name, got {module_name!r}")
    table = recipe.to_dict()
    high_name = SWEEP_HIGH_PRECISION_POLICY
    while high_name in table["policies"]:
        high_name += "_"
    table["policies"][high_name] = {"all": "bf16"}
    if "attention" in table:  # pin what [attention] inherits from the default policy, which may change below
        table["attention"].setdefault("scale_mode", default_policy.scale_mode)
        table["attention"].setdefault("rounding", {"fwd": default_policy.rounding_fwd, "grad": default_policy.rounding_grad})
    pattern = glob.escape(module_name)
    if invert:
        table["rules"] = [{"match": pattern, "policy": high_name}]
        table["name"] = f"{recipe.name}:all-but:{module_name}"
    else:
        table["rules"] = [{"match": pattern, "policy": recipe.default}]
        table["default"] = high_name
        table["name"] = f"{recipe.name}:only:{module_name}"
    return parse_recipe(table, source=f"single_layer_recipe({recipe.name!r}, {module_name!r}, invert={invert})")


def rounding_state(model: nn.Module) -> dict[str, int]:
    """The call counters of every quantized product (keyed as mxlab.scaling.quantized_products), which
    with the module seeds fix the stochastic-rounding bits; save it with a checkpoint to resume them."""
    from mxlab.scaling import quantized_products

    return {name: int(precision.calls) for name, precision in quantized_products(model).items()}


def load_rounding_state(model: nn.Module, state: dict[str, int]) -> None:
    """Restore the counters saved by `rounding_state`; refuses a state that misses a product of the model."""
    from mxlab.scaling import quantized_products

    products = quantized_products(model)
    missing = sorted(set(products) - set(state))
    if missing:
        raise ValueError(f"rounding state has no counter for {missing}; it was saved from another plan")
    for name, precision in products.items():
        precision.calls = int(state[name])


def describe_recipe(recipe: Recipe) -> str:
    """A plain-text summary of a recipe: its policies (each GEMM's operands), rules, attention and loss scaling."""
    lines = [f"recipe {recipe.name}" + (f": {recipe.description}" if recipe.description else "")]
    if recipe.source:
        lines.append(f"  from {recipe.source}")
    lines.append("  (operand order: fwd input x weight, dgrad grad_output x weight, wgrad input x grad_output)")
    for name, policy in recipe.policies.items():
        marker = " (default)" if name == recipe.default else ""
        if policy.high_precision:
            lines.append(f"  policy {name}{marker}: high precision (modules left unchanged)")
            continue
        lines.append(f"  policy {name}{marker}:")
        lines.extend(f"    {gemm:6} {text}" for gemm, text in policy.describe().items())
    for rule in recipe.rules:
        lines.append(f"  rule   {rule.match!r} -> {rule.policy}")
    if recipe.attention is None:
        lines.append("  attention: high precision (no [attention] table)")
    else:
        lines.extend(f"  attention {product}: {text}" for product, text in recipe.attention.describe().items())
    scaling = recipe.loss_scaling
    lines.append(f"  loss scaling: {scaling.policy}" + (f" (init {scaling.init_scale:g})" if scaling.policy != "none" else ""))
    return "\n".join(lines)
