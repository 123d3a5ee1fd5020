"""What a recipe reaches in a model and what applying it did: reachable modules, the Plan, module swaps.

Reachable ("quantizable") modules: modules whose type is exactly `nn.Linear`, `QLinear`s, and
modules of a class named `JaggedAttention` (mxlab.nn.attention). Subclasses of nn.Linear with
their own forward (e.g. the out_proj of nn.MultiheadAttention, which is never called) are not
reachable. Backends (mxlab.recipe.backends) build the Plan's entries and swap modules with
`replace_module`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from mxlab.nn.linear import QLinear


def _is_attention(module: nn.Module) -> bool:
    return any(cls.__name__ == "JaggedAttention" for cls in type(module).__mro__)


def _is_linear(module: nn.Module) -> bool:
    return type(module) is nn.Linear or isinstance(module, QLinear)


def reachable_modules(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(qualified name, module, kind) of every module a recipe can reach, in model order; kind is
    linear (nn.Linear, QLinear) or attention (JaggedAttention)."""
    found = []
    for name, module in model.named_modules():
        if _is_linear(module):
            found.append((name, module, "linear"))
        elif _is_attention(module):
            found.append((name, module, "attention"))
    return found


def quantizable_modules(model: nn.Module, recipe: Any | None = None) -> list[str]:
    """Qualified names of the modules a recipe can reach (linear layers and JaggedAttention), in
    model order. With `recipe`, attention modules are left out when it has no `[attention]` table
    (it could not quantize them)."""
    return [
        name
        for name, _, kind in reachable_modules(model)
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
            "module": self.module,
            "kind": self.kind,
            "policy": self.policy,
            "rule": self.rule,
            "quantized": self.quantized,
            "gemms": dict(self.gemms),
            "padded": list(self.padded),
            "backend": self.backend,
            "note": self.note,
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

    def loss_scaler(self, model: nn.Module | None = None) -> Any:
        """The loss scaler of the recipe's `[loss_scaling]` table (`mxlab.recipe.loss_scaling.make_loss_scaler`),
        which nothing calls for you: in your loop, `scaler.scale(loss).backward()` then `scaler.step(optimizer)`
        in place of `optimizer.step()` (as with torch.amp.GradScaler). `per_layer` needs the model."""
        from mxlab.recipe.loss_scaling import make_loss_scaler

        return make_loss_scaler(self.loss_scaling, model)

    @property
    def loss_scaling_usage(self) -> str:
        """What a training loop must call for the recipe's loss scaling, in words."""
        policy = self.loss_scaling.get("policy", "none")
        if policy == "none":
            return "loss scaling none"
        return (
            f"loss scaling {policy}, which your loop must call: scaler = plan.loss_scaler(model); "
            "scaler.scale(loss).backward(); scaler.step(optimizer)"
        )

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
            notes = "; ".join(
                text
                for text in (f"backend {entry.backend}" if entry.backend != "mxlab" else "", notes, entry.note)
                if text
            )
            rows.append([entry.module, entry.kind, entry.policy, entry.rule, precision, notes])
        widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
        lines = [
            f"recipe {self.recipe} (seed {self.seed}): {len(self.quantized_modules)} quantized, "
            f"{len(self.high_precision_modules)} high precision; {self.loss_scaling_usage}"
        ]
        for index, row in enumerate([header] + rows):
            lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * width for width in widths))
        return "\n".join(lines)


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` in place of the submodule `name` (a qualified name) of `model`. Refuses (ValueError)
    an empty name (the model itself) and a name that is not a submodule of `model`."""
    if not name:
        raise ValueError("replace_module needs a submodule's qualified name, got '' (the model itself)")
    try:
        model.get_submodule(name)
    except AttributeError as error:
        raise ValueError(f"replace_module: {name!r} is not a submodule of the model ({error})") from None
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


__all__ = ["Plan", "PlanEntry", "module_seed", "quantizable_modules", "reachable_modules", "replace_module"]
