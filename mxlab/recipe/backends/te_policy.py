"""The Transformer Engine backend's policy: a `[policies.NAME]` table with `backend = "te"`.

A recipe policy with `backend = "te"` sends the linear layers it matches to `te.Linear`
(mxlab.recipe.backends.te converts them):

```toml
[policies.te]
backend = "te"
te_recipe = "fp8_current"      # fp8_current | fp8_delayed | fp8_block | mxfp8
fp8_format = "hybrid"          # optional: hybrid (E4M3 forward, E5M2 gradients) | e4m3
unaligned = "error"            # optional: error | high_precision (see mxlab.recipe.backends.te)
amax_history_len = 1024        # fp8_delayed only (optional)
amax_compute_algo = "max"      # fp8_delayed only (optional): max | most_recent
```

| te_recipe | TE recipe class | scaling | default fp8_format |
|---|---|---|---|
| fp8_current | Float8CurrentScaling | per tensor, from the tensor's own amax | hybrid |
| fp8_delayed | DelayedScaling | per tensor, from an amax history | hybrid |
| fp8_block | Float8BlockScaling | 1x128 blocks (input, grad), 128x128 (weight) | e4m3 |
| mxfp8 | MXFP8BlockScaling | MX blocks of 32, E8M0 scales (compute capability >= 10.0) | e4m3 |

This module only parses and describes; it imports neither torch's TE nor the rest of the recipe package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BACKEND_NAME = "te"
TE_RECIPES = ("fp8_current", "fp8_delayed", "fp8_block", "mxfp8")
TE_RECIPE_CLASSES = {
    "fp8_current": "Float8CurrentScaling",
    "fp8_delayed": "DelayedScaling",
    "fp8_block": "Float8BlockScaling",
    "mxfp8": "MXFP8BlockScaling",
}
TE_DEFAULT_FORMATS = {"fp8_current": "hybrid", "fp8_delayed": "hybrid", "fp8_block": "e4m3", "mxfp8": "e4m3"}
TE_FP8_FORMATS = ("hybrid", "e4m3")
TE_ALIGNMENT = {"fp8_current": 16, "fp8_delayed": 16, "fp8_block": 16, "mxfp8": 32}
UNALIGNED_CHOICES = ("error", "high_precision")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
TE_POLICY_KEYS = ("backend", "te_recipe", "fp8_format", "unaligned", "amax_history_len", "amax_compute_algo")
BACKENDS = (BACKEND_NAME,)


@dataclass(frozen=True)
class TEPolicy:
    """A `backend = "te"` policy: the matched linear layers run as te.Linear under `te_recipe`.

    `scale_mode`, `rounding_fwd` and `rounding_grad` are what an `[attention]` table inherits
    when this is the recipe's default policy (TE's recipes do not quantize attention products;
    mxlab's emulation does, with these defaults unless the table sets its own).
    """

    name: str
    te_recipe: str
    fp8_format: str
    unaligned: str = "error"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    scale_mode: str = "floor"
    rounding_fwd: str = "nearest_even"
    rounding_grad: str = "nearest_even"

    backend = BACKEND_NAME

    @property
    def high_precision(self) -> bool:
        return False

    @property
    def alignment(self) -> int:
        return TE_ALIGNMENT[self.te_recipe]

    @property
    def te_recipe_class(self) -> str:
        return TE_RECIPE_CLASSES[self.te_recipe]

    def operand_formats(self) -> dict[str, str]:
        """The FP8 element format of input, weight and grad_output under this policy."""
        grad = "E5M2" if self.fp8_format == "hybrid" else "E4M3"
        return {"input": "E4M3", "weight": "E4M3", "grad_output": grad}

    def scaling(self) -> str:
        """How TE scales the operands, in words."""
        if self.te_recipe == "fp8_current":
            return "per-tensor current scaling"
        if self.te_recipe == "fp8_delayed":
            return f"per-tensor delayed scaling (amax history {self.amax_history_len}, {self.amax_compute_algo})"
        if self.te_recipe == "fp8_block":
            return "1x128 blocks (input, grad_output), 128x128 (weight)"
        return "MX blocks of 32, E8M0 scales"

    def describe(self) -> dict[str, str]:
        """Each GEMM's operands in words, keyed fwd / dgrad / wgrad."""
        fmt = self.operand_formats()
        prefix = f"TE {self.te_recipe_class}"
        return {
            "fwd": f"{prefix}: input {fmt['input']} x weight {fmt['weight']}, {self.scaling()}",
            "dgrad": f"{prefix}: grad_output {fmt['grad_output']} x weight {fmt['weight']}",
            "wgrad": f"{prefix}: input {fmt['input']} x grad_output {fmt['grad_output']}",
        }


def parse_backend_policy(name: str, table: Any) -> TEPolicy:
    """A validated TEPolicy from a `[policies.NAME]` table that has a `backend` key.

    Refuses (ValueError naming the value and the accepted ones): a backend other than "te", a
    missing or unknown te_recipe, unknown keys (mxlab's emulation keys such as fwd/all/block do not
    apply to TE), an unknown fp8_format or unaligned choice, delayed-scaling options on another
    recipe, a non-positive amax_history_len.
    """
    where = f"[policies.{name}]"
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table, got {table!r}")
    backend = table.get("backend")
    if backend not in BACKENDS:
        raise ValueError(
            f"{where}.backend: unknown backend {backend!r}; accepted: {', '.join(BACKENDS)} "
            f"(leave backend out for mxlab's own emulation)"
        )
    unknown = [key for key in table if key not in TE_POLICY_KEYS]
    if unknown:
        raise ValueError(
            f'{where}: unknown key(s) {", ".join(map(repr, unknown))} for backend = "te"; '
            f"accepted: {', '.join(TE_POLICY_KEYS)} (TE's recipe fixes every GEMM's operands)"
        )
    te_recipe = table.get("te_recipe")
    if te_recipe not in TE_RECIPES:
        raise ValueError(f"{where}.te_recipe: unknown TE recipe {te_recipe!r}; accepted: {', '.join(TE_RECIPES)}")
    fp8_format = table.get("fp8_format", TE_DEFAULT_FORMATS[te_recipe])
    if fp8_format not in TE_FP8_FORMATS:
        raise ValueError(f"{where}.fp8_format: unknown {fp8_format!r}; accepted: {', '.join(TE_FP8_FORMATS)}")
    unaligned = table.get("unaligned", "error")
    if unaligned not in UNALIGNED_CHOICES:
        raise ValueError(f"{where}.unaligned: unknown {unaligned!r}; accepted: {', '.join(UNALIGNED_CHOICES)}")
    delayed_keys = [key for key in ("amax_history_len", "amax_compute_algo") if key in table]
    if delayed_keys and te_recipe != "fp8_delayed":
        raise ValueError(
            f'{where}: {", ".join(delayed_keys)} apply to te_recipe = "fp8_delayed" only, not {te_recipe!r}'
        )
    history = table.get("amax_history_len", 1024)
    if isinstance(history, bool) or not isinstance(history, int) or history < 1:
        raise ValueError(f"{where}.amax_history_len: must be a positive integer, got {history!r}")
    algo = table.get("amax_compute_algo", "max")
    if algo not in AMAX_COMPUTE_ALGOS:
        raise ValueError(f"{where}.amax_compute_algo: unknown {algo!r}; accepted: {', '.join(AMAX_COMPUTE_ALGOS)}")
    return TEPolicy(name, te_recipe, fp8_format, unaligned, history, algo)


def is_te_policy(policy: Any) -> bool:
    """True for a policy of the TE backend."""
    return getattr(policy, "backend", None) == BACKEND_NAME


def te_recipe_names(recipe: Any) -> list[str]:
    """The TE recipe names (fp8_current, ...) that the policies of an mxlab Recipe use, sorted."""
    policies = getattr(recipe, "policies", None) or {}
    return sorted({policy.te_recipe for policy in policies.values() if is_te_policy(policy)})
