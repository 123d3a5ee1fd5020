"""The `mxlab` backend: mxlab's own emulation. Linear layers become QLinear (sharing their
Parameters), JaggedAttention modules get an AttentionPolicy; an all-high-precision policy leaves a
module as it was."""

from __future__ import annotations

from typing import Any

from torch import nn

from mxlab.nn.linear import QLinear
from mxlab.recipe.backends import Target
from mxlab.recipe.plan import PlanEntry, module_seed, replace_module
from mxlab.recipe.schema import AttentionPolicy, AttentionRecipe

BACKEND_NAME = "mxlab"


class MXLabConverter:
    """Converts linear and attention modules to mxlab's emulated precisions.

    `attention` is the recipe's `[attention]` table (None: attention modules stay high precision).
    """

    name = BACKEND_NAME

    def __init__(self, attention: AttentionRecipe | None = None) -> None:
        self.attention = attention

    def unavailable_reason(self, recipe: Any, device: Any = None) -> str | None:
        """Always None: mxlab's emulation runs on every device torch runs on."""
        return None

    def convert(self, model: nn.Module, targets: list[Target], *, seed: int = 0) -> list[PlanEntry]:
        """Give each target its policy; returns their PlanEntries. `seed` (the run seed) seeds
        stochastic rounding per module (`module_seed`). Refuses (ValueError) a target kind other
        than linear / attention, before changing any module."""
        wrong = [target.name for target in targets if target.kind not in ("linear", "attention")]
        if wrong:
            raise ValueError(f"the mxlab backend converts linear and attention modules, not {wrong}")
        return [
            self._linear(model, target, seed) if target.kind == "linear" else self._attention(target, seed)
            for target in targets
        ]

    @staticmethod
    def _linear(model: nn.Module, target: Target, seed: int) -> PlanEntry:
        name, module, policy = target.name, target.module, target.policy
        precision = policy.to_precision(name, module_seed(seed, name))
        if isinstance(module, QLinear):
            module.precision = precision
        elif precision is not None:
            module = QLinear.from_linear(module, precision)
            replace_module(model, name, module)
        quantized = precision is not None
        padded = module.padded_dims if isinstance(module, QLinear) else []
        return PlanEntry(
            name, "linear", policy.name, target.rule, quantized, policy.describe() if quantized else {}, padded
        )

    def _attention(self, target: Target, seed: int) -> PlanEntry:
        name, policy = target.name, target.policy
        attention_policy = None
        if self.attention is not None and not policy.high_precision:
            qk = self.attention.product_precision("qk", name, module_seed(seed, name, "qk"))
            pv = self.attention.product_precision("pv", name, module_seed(seed, name, "pv"))
            if qk is not None or pv is not None:
                attention_policy = AttentionPolicy(qk=qk, pv=pv)
        target.module.policy = attention_policy
        quantized = attention_policy is not None
        gemms = self.attention.describe() if quantized and self.attention is not None else {}
        return PlanEntry(name, "attention", policy.name, target.rule, quantized, gemms, [])


__all__ = ["BACKEND_NAME", "MXLabConverter"]
