"""The recipe schema: parse and validate a recipe table into a `Recipe` (policies, rules, attention, loss scaling).

A recipe (TOML, format in DESIGN.md) names precision policies and maps module qualified names to
them with fnmatch rules; the first matching rule wins, unmatched modules get `default`
(`Recipe.policy_for`). Applying one to a model is mxlab.recipe.apply; finding one by name is
mxlab.recipe.library. The names in a recipe are the names of one model (the shipped recipes use
the GEM model's names: `history.blocks.0.attn.qkv`, `towers.ctr.out`, ...).

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

A policy table with a `backend` key belongs to another backend (`backend = "te"`: Transformer
Engine, see mxlab.recipe.backends.te_policy).

`[loss_scaling]`: see mxlab.recipe.loss_scaling.
"""

from __future__ import annotations

import copy
import glob
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from mxlab.nn.precision import HADAMARD_BLOCKS, OPERAND_FORMATS, GemmQuant, MatmulPrecision, OperandQuant
from mxlab.numerics.vocab import Rounding, ScaleMode
from mxlab.recipe.backends.te_policy import parse_backend_policy
from mxlab.recipe.loss_scaling import LossScalingConfig, parse_loss_scaling

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

    def to_precision(self, name: str = "", seed: int = 0) -> MatmulPrecision | None:
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

    def product_precision(self, product: str, name: str, seed: int) -> MatmulPrecision | None:
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

    qk: MatmulPrecision | None = None
    pv: MatmulPrecision | None = None

    def __repr__(self) -> str:
        def short(precision: MatmulPrecision | None) -> str:
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
    attention: AttentionRecipe | None
    loss_scaling: LossScalingConfig
    description: str = ""
    source: str | None = None
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
            _check_choice(value.get("fwd", "nearest_even"), tuple(Rounding), "rounding", f"{where}.rounding.fwd"),
            _check_choice(value.get("grad", "nearest_even"), tuple(Rounding), "rounding", f"{where}.rounding.grad"),
        )
    mode = _check_choice(value, tuple(Rounding), "rounding", f"{where}.rounding")
    return mode, mode


def _hadamard(value: Any, where: str) -> int | None:
    if value is False:
        return None
    if value is True:
        return 32
    if isinstance(value, int) and not isinstance(value, bool) and value in HADAMARD_BLOCKS:
        return value
    raise _fail(
        where, f"hadamard = {value!r} is invalid; accepted: false, true (block 32) or a block of {HADAMARD_BLOCKS}"
    )


def _parse_policy(name: str, table: Any) -> LinearPolicy:
    where = f"[policies.{name}]"
    if isinstance(table, dict) and "backend" in table:  # a policy of another backend (Transformer Engine)
        return parse_backend_policy(name, table)
    _check_keys(table, POLICY_KEYS, where)
    scale_mode = _check_choice(table.get("scale_mode", "floor"), tuple(ScaleMode), "scale_mode", f"{where}.scale_mode")
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
                raise _fail(
                    f"{where}.{gemm}",
                    f"operand {operand_name!r} has no format (operands: {', '.join(GEMM_OPERANDS[gemm])})",
                )
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
    scale_mode = _check_choice(
        table.get("scale_mode", default_policy.scale_mode), tuple(ScaleMode), "scale_mode", f"{where}.scale_mode"
    )
    if "rounding" in table:
        rounding_fwd, rounding_grad = _roundings(table["rounding"], where)
    else:
        rounding_fwd, rounding_grad = default_policy.rounding_fwd, default_policy.rounding_grad
    block = _parse_block(table.get("block", 32), f"{where}.block")
    products = {}
    for product in ATTENTION_PRODUCTS:
        spec = table.get(product)
        if spec is None:
            raise _fail(
                where,
                f"{product} is not given; set {product} = FMT or {product} = "
                f"{{fwd = FMT, grad = FMT}} (FMT bf16 keeps it high precision)",
            )
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


def parse_recipe(table: dict[str, Any], source: str | None = None, name: str | None = None) -> Recipe:
    """A validated Recipe from a TOML-shaped dict.

    Refuses (ValueError naming the offending key or value and the accepted ones): unknown keys
    at any level, unknown formats, scale modes, roundings or blocks, a missing or unknown default
    policy, rules naming unknown policies, malformed rules or loss-scaling tables.
    """
    where = source or "recipe"
    _check_keys(table, RECIPE_KEYS, where)
    recipe_name = table.get("name", name)
    if not isinstance(recipe_name, str) or not recipe_name:
        raise _fail(where, 'needs a name = "..."')
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
            raise _fail("rules", 'must be an array of tables: [[rules]] match = "..." policy = "..."')
        rules = []
        for index, rule in enumerate(rules_table):
            rule_where = f"[[rules]] #{index + 1}"
            _check_keys(rule, RULE_KEYS, rule_where)
            if not isinstance(rule.get("match"), str) or not rule["match"]:
                raise _fail(rule_where, f'needs match = "PATTERN" (fnmatch on module names), got {rule.get("match")!r}')
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
        raise ValueError(
            f"recipe {recipe.name!r}: its default policy {recipe.default!r} is all high precision; nothing to sweep"
        )
    if not isinstance(module_name, str) or not module_name:
        raise ValueError(f"module_name must be a module's qualified name, got {module_name!r}")
    table = recipe.to_dict()
    high_name = SWEEP_HIGH_PRECISION_POLICY
    while high_name in table["policies"]:
        high_name += "_"
    table["policies"][high_name] = {"all": "bf16"}
    if "attention" in table:  # pin what [attention] inherits from the default policy, which may change below
        table["attention"].setdefault("scale_mode", default_policy.scale_mode)
        table["attention"].setdefault(
            "rounding", {"fwd": default_policy.rounding_fwd, "grad": default_policy.rounding_grad}
        )
    pattern = glob.escape(module_name)
    if invert:
        table["rules"] = [{"match": pattern, "policy": high_name}]
        table["name"] = f"{recipe.name}:all-but:{module_name}"
    else:
        table["rules"] = [{"match": pattern, "policy": recipe.default}]
        table["default"] = high_name
        table["name"] = f"{recipe.name}:only:{module_name}"
    return parse_recipe(table, source=f"single_layer_recipe({recipe.name!r}, {module_name!r}, invert={invert})")


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
    lines.append(
        f"  loss scaling: {scaling.policy}" + (f" (init {scaling.init_scale:g})" if scaling.policy != "none" else "")
    )
    return "\n".join(lines)
