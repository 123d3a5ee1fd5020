"""What a recipe reaches in a model and what applying it did: reachable modules, the Plan, module swaps.

Reachable ("quantizable") modules: modules whose type is exactly `nn.Linear`, `QLinear`s, and
modules of a class named `JaggedAttention` (mxlab.nn.attention). Subclasses of nn.Linear with
their own forward (e.g. the out_proj of nn.MultiheadAttention, which is never called) are not
reachable. Backends (mxlab.recipe.backends) build the Plan's entries and swap modules with
`replace_module`.
"""

from __future__ import annotations

import warnings
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
    op: str = ""  # a GEMM site's op (linear, mm, bmm, einsum, sdpa, ...); "" for a module
    reason: str = ""  # why a GEMM site stays high precision

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
            "op": self.op,
            "reason": self.reason,
        }


@dataclass
class Plan:
    """What `apply_recipe` did: each reachable module's policy, and which stayed high precision."""

    recipe: str
    seed: int
    entries: list[PlanEntry]
    loss_scaling: dict[str, Any]
    sites: Any = field(default=None, repr=False, compare=False)  # mxlab.recipe.sites.GemmSites of the model
    model: Any = field(default=None, repr=False, compare=False)
    rules: tuple[str, ...] = ()
    has_attention_table: bool = False
    flops: dict[str, list] | None = None  # {site: [forward GEMM FLOPs, under MX]} of the last coverage()
    inductor_casts_exact: bool = False  # apply_recipe turned on torch._inductor.config.emulate_precision_casts

    @property
    def all_entries(self) -> list[PlanEntry]:
        """The module entries, then every GEMM site met in a forward so far (mxlab.recipe.sites)."""
        found = list(self.sites.entries.values()) if self.sites is not None else []
        return self.entries + found

    @property
    def quantized_modules(self) -> list[str]:
        return [entry.module for entry in self.all_entries if entry.quantized]

    @property
    def high_precision_modules(self) -> list[str]:
        return [entry.module for entry in self.all_entries if not entry.quantized]

    @property
    def padded_modules(self) -> dict[str, list[str]]:
        return {entry.module: entry.padded for entry in self.all_entries if entry.padded}

    def coverage(self, example_inputs: Any) -> float:
        """The share of the model's forward GEMM FLOPs under MX on one forward of `example_inputs` (a tuple of
        positional arguments, a dict of keywords, or one argument; run under no_grad, buffers and rounding
        counters restored); per-site FLOPs land in `flops` and `table()` prints them. Warns for a rule that
        reaches no GEMM and for an `[attention]` table that reaches no attention."""
        if self.sites is None or self.model is None:
            raise ValueError("coverage needs the plan apply_recipe returned (it measures the model it was applied to)")
        self.flops = self.sites.measure(self.model, example_inputs)
        from fnmatch import fnmatchcase

        reached = [site for site, (flops, _) in self.flops.items() if flops]
        for rule in self.rules:
            if not any(fnmatchcase(site, rule) for site in reached):
                warnings.warn(
                    f"recipe {self.recipe!r}: rule match = {rule!r} reaches no GEMM on this batch", stacklevel=2
                )
        if self.has_attention_table and not any(
            entry.kind == "attention" and self.flops.get(entry.module, [0])[0] for entry in self.all_entries
        ):
            warnings.warn(
                f"recipe {self.recipe!r} has an [attention] table but the model runs no attention it reaches "
                "(JaggedAttention, F.scaled_dot_product_attention, nn.MultiheadAttention)",
                stacklevel=2,
            )
        total = sum(flops for flops, _ in self.flops.values())
        return sum(flops for flops, mx in self.flops.values() if mx) / total if total else 0.0

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
            "modules": [entry.to_dict() for entry in self.all_entries],
            "quantized": self.quantized_modules,
            "high_precision": self.high_precision_modules,
            "padded": self.padded_modules,
            "backends": {entry.module: entry.backend for entry in self.entries if entry.backend != "mxlab"},
            "loss_scaling": dict(self.loss_scaling),
            "flops": {site: {"flops": flops, "mx": mx} for site, (flops, mx) in (self.flops or {}).items()},
            "inductor_emulate_precision_casts": self.inductor_casts_exact,
        }

    def table(self) -> str:
        """A fixed-width text table: module or GEMM site, kind, policy, rule, each GEMM's precision, notes (a
        high-precision site's reason; forward FLOPs once `coverage` ran), and the coverage line."""
        header = ["module", "kind", "policy", "rule", "precision", "notes"]
        rows = []
        for entry in self.all_entries:
            if entry.quantized:
                precision = "; ".join(f"{gemm}: {text}" for gemm, text in entry.gemms.items())
            else:
                precision = "high precision (unchanged)"
            notes = "padded " + ", ".join(entry.padded) if entry.padded and entry.quantized else ""
            flops = (self.flops or {}).get(entry.module)
            notes = "; ".join(
                text
                for text in (
                    f"backend {entry.backend}" if entry.backend != "mxlab" else "",
                    f"op {entry.op}" if entry.op else "",
                    notes,
                    entry.note,
                    entry.reason,
                    f"{flops[0]:.3g} FLOPs" if flops else "",
                )
                if text
            )
            kind = entry.kind
            rows.append([entry.module, kind, entry.policy, entry.rule, precision, notes])
        widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
        lines = [
            f"recipe {self.recipe} (seed {self.seed}): {len(self.quantized_modules)} quantized, "
            f"{len(self.high_precision_modules)} high precision; {self.loss_scaling_usage}"
        ]
        if self.inductor_casts_exact:
            lines.append(
                "torch.compile: Inductor's emulate_precision_casts turned on (process-wide), so casts Inductor fuses "
                "round as in eager mode and a compiled bfloat16 model keeps eager bits; horizontal fusion of its CPU "
                "code turned off (cpp.max_horizontal_fusion_size = 1), whose loop split fails on MX casts"
            )
        if self.flops is not None:
            total = sum(flops for flops, _ in self.flops.values())
            mx = sum(flops for flops, under_mx in self.flops.values() if under_mx)
            share = mx / total if total else 0.0
            lines.append(f"coverage: {share:.1%} of forward GEMM FLOPs under MX ({mx:.4g} of {total:.4g})")
        elif self.sites is not None:
            lines.append("coverage: not measured (plan.coverage(example_inputs) finds every GEMM site and its FLOPs)")
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
