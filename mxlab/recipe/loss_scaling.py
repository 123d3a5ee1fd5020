"""Loss-scaling policies: none, static, dynamic (torch GradScaler semantics) and per_layer.

Every scaler has the same interface: `scale(loss)` multiplies the loss by the current scale;
`step(optimizer)` unscales the gradients of the optimizer's parameters, skips the step if any
gradient is non-finite, updates the scale and returns whether the optimizer stepped;
`scale_value`, `skipped_steps`, `steps`, `scale_history` (list of (step, scale) at every change,
starting with the initial scale) and `state_dict()` / `load_state_dict()`.

No host synchronisation per step: the scale, the growth count and the skipped-step count are 0-d
tensors on the gradients' device; `step_on_device(optimizer)` checks every gradient for non-finite
values in one fused pass per device and dtype (`torch._amp_foreach_non_finite_check_and_unscale_`,
as GradScaler does), updates the scale there (`torch._amp_update_scale_`) and, for optimizers that
skip on the device (fused Adam / AdamW / SGD), hands them the overflow flag instead of reading it.
Other optimizers cost one read of the flag per step; `step` (which returns a bool), the properties
and `state_dict` read the device when called, and `per_layer` reads all products' statistics in one read
per step (each backward only adds its gradient's counts on the device).

- `none`: scale 1; every step is taken (a non-finite gradient is left for the caller to see).
- `static`: a fixed scale; a step with a non-finite gradient is skipped, the scale never changes.
- `dynamic`: as `torch.amp.GradScaler`: start at `init_scale`; a non-finite gradient skips the
  step and multiplies the scale by `backoff_factor` (resetting the growth count); after
  `growth_interval` consecutive finite steps the scale is multiplied by `growth_factor`.
- `per_layer`: the dynamic loss scale above, plus one power-of-two scale s_l per quantized
  product (each QLinear, each attention product). In backward, the gradient entering the
  product is multiplied by s_l before it is quantized and both gradients are divided by s_l
  after their GEMMs, so in exact arithmetic nothing changes and only the rounding does.
  After every step, for each product: if its scaled incoming gradient held a non-finite value,
  s_l *= backoff_factor; otherwise, if the fraction of its non-zero gradient elements below
  float32's smallest normal (`mxlab.nn.qmatmul.UNDERFLOW_LINE`, 2^-126) exceeds
  `underflow_threshold`, s_l *= growth_factor (capped at `max_layer_scale`). This is a
  per-layer overflow/underflow controller in the spirit of adaptive loss scaling (Zhao et al.,
  "Adaptive Loss Scaling for Mixed Precision Training",
  arXiv:1910.12385), which computes a loss scale per layer from that layer's gradient
  statistics; the controller here is the GradScaler rule applied per layer, not their
  analytic estimate. What it can and cannot change: s_l acts only inside the product (the
  gradients leave it unscaled), and an MX quantizer absorbs a power-of-two factor into its E8M0
  block scale exactly, except in blocks whose scale clamps at 2^-127 (amax < 2^(emax - 127)).
  In such a block a float32-normal element is still >= 2 in element units, a normal of every
  element format, so it keeps all its bits; the clamped scale only differs in that, with the
  floor scale mode, it cannot saturate. A current-scaled FP8 tensor absorbs the factor likewise.
  So s_l can recover bits only for gradient elements below 2^-126 (tests/test_scaling.py checks
  that rceil results are otherwise bit-exact). In this toolkit's FP32/BF16 emulation loss
  scaling of any kind is therefore expected to matter little for MX formats; the policy exists
  to measure that on real runs, per layer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from mxlab.tables import table_to_dataclass

LOSS_SCALING_POLICIES = ("none", "static", "dynamic", "per_layer")
PENDING_LIMIT = 1024  # scale values kept on the device before scale_history reads them back


@dataclass(frozen=True)
class LossScalingConfig:
    """The `[loss_scaling]` table of a recipe."""

    policy: str = "none"
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    underflow_threshold: float = 0.001
    max_layer_scale: float = 2.0**24

    def __post_init__(self) -> None:
        if self.policy not in LOSS_SCALING_POLICIES:
            raise ValueError(
                f"unknown loss_scaling policy {self.policy!r}; accepted: {', '.join(LOSS_SCALING_POLICIES)}"
            )
        checks = [
            ("init_scale", self.init_scale > 0 and math.isfinite(self.init_scale), "a finite number > 0"),
            ("growth_factor", self.growth_factor > 1, "a number > 1"),
            ("backoff_factor", 0 < self.backoff_factor < 1, "a number in (0, 1)"),
            ("growth_interval", isinstance(self.growth_interval, int) and self.growth_interval >= 1, "an integer >= 1"),
            ("underflow_threshold", 0 <= self.underflow_threshold <= 1, "a fraction in [0, 1]"),
            ("max_layer_scale", self.max_layer_scale >= 1, "a number >= 1"),
        ]
        for key, ok, accepted in checks:
            if not ok:
                raise ValueError(f"loss_scaling.{key} = {getattr(self, key)!r} is invalid; it must be {accepted}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_loss_scaling(table: dict[str, Any] | None) -> LossScalingConfig:
    """A LossScalingConfig from a recipe's `[loss_scaling]` table (None: policy none).

    Refuses what mxlab.tables.table_to_dataclass refuses (a non-table, an unknown key, a wrong type) and
    invalid values, with a ValueError naming them.
    """
    if table is None:
        return LossScalingConfig()
    return table_to_dataclass(LossScalingConfig, table, "loss_scaling")


def _optimizer_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class LossScaler:
    """Base scaler (also the `none` policy): scale 1, never skips.

    The state (scale, growth count, skipped steps) lives in 0-d tensors on the device of the loss
    and gradients; `step_on_device` neither reads it back nor syncs with the host when the optimizer
    can skip a step on the device (fused Adam / AdamW / SGD: `_step_supports_amp_scaling`). The
    properties `scale_value`, `skipped_steps` and `scale_history` read it (one sync each).
    """

    policy = "none"

    def __init__(self, config: LossScalingConfig) -> None:
        self.config = config
        self.steps = 0
        initial = self._initial_scale()
        self._scale = torch.tensor(initial, dtype=torch.float32)
        self._growth_tracker = torch.zeros((), dtype=torch.int32)
        self._skipped = torch.zeros((), dtype=torch.int64)
        self._history: list[tuple[int, float]] = [(0, initial)]
        self._pending: list[tuple[int, torch.Tensor]] = []  # (step, scale after it), not read back yet

    def _initial_scale(self) -> float:
        return 1.0

    def _move_to(self, device: torch.device) -> None:
        if self._scale.device != device:
            self._scale = self._scale.to(device)
            self._growth_tracker = self._growth_tracker.to(device)
            self._skipped = self._skipped.to(device)

    @property
    def scale_value(self) -> float:
        """The current loss scale (reads the device)."""
        return float(self._scale)

    @property
    def skipped_steps(self) -> int:
        """How many steps were skipped for a non-finite gradient (reads the device)."""
        return int(self._skipped)

    @property
    def scale_on_device(self) -> torch.Tensor:
        """The current loss scale as a 0-d float32 tensor on the scaler's device (no read)."""
        return self._scale

    @property
    def skipped_on_device(self) -> torch.Tensor:
        """The skipped-step count as a 0-d int64 tensor on the scaler's device (no read)."""
        return self._skipped

    @property
    def scale_history(self) -> list[tuple[int, float]]:
        """(step, scale) at every change of the scale, starting with (0, initial scale) (reads the device)."""
        self._fold_pending()
        return list(self._history)

    def _fold_pending(self) -> None:
        """Move the scales recorded on the device into the host history (one sync)."""
        if self._pending:
            values = torch.stack([value for _, value in self._pending]).tolist()
            for (step, _), value in zip(self._pending, values):
                if value != self._history[-1][1]:
                    self._history.append((step, float(value)))
            self._pending = []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss multiplied by the current scale (the same tensor under the `none` policy)."""
        if self.policy == "none":
            return loss
        self._move_to(loss.device)
        return loss * self._scale

    def _unscale(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Divide every gradient by the scale, one fused pass per device and dtype; return a 0-d float32
        tensor, nonzero when some gradient held a non-finite value (no host sync)."""
        grads = _optimizer_grads(optimizer)
        if grads:
            self._move_to(grads[0].device)
        found = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        inverse = self._scale.double().reciprocal().float()
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for grad in grads:
            groups.setdefault((grad.device, grad.dtype), []).append(grad)
        for (device, _), group in groups.items():
            found_here = torch.zeros((), dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, found_here, inverse.to(device))
            found = found + found_here.to(found.device)
        return found

    def _update(self, found: torch.Tensor) -> None:
        """Update the scale on the device after a step (found: nonzero when a gradient was non-finite)."""

    def step_on_device(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Unscale the gradients, step the optimizer unless a gradient is non-finite, update the scale;
        returns a 0-d bool tensor, True when the optimizer stepped. Syncs with the host only for an
        optimizer that cannot skip on the device (one read of the overflow flag)."""
        if self.policy == "none":  # `none` neither unscales nor checks
            optimizer.step()
            self.steps += 1
            return torch.ones((), dtype=torch.bool)
        found = self._unscale(optimizer)
        if getattr(optimizer, "_step_supports_amp_scaling", False):  # the fused kernels skip where found_inf
            optimizer.grad_scale, optimizer.found_inf = None, found
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale, optimizer.found_inf
        elif not bool(found):
            optimizer.step()
        self._skipped += (found > 0).to(torch.int64)
        self._update(found)
        self._pending.append((self.steps, self._scale.clone()))
        if len(self._pending) >= PENDING_LIMIT:
            self._fold_pending()  # one sync per PENDING_LIMIT steps
        self.steps += 1
        return found == 0

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """`step_on_device`, then whether the optimizer stepped (reads the device)."""
        return bool(self.step_on_device(optimizer))

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "scale_value": self.scale_value,
            "skipped_steps": self.skipped_steps,
            "steps": self.steps,
            "scale_history": [list(item) for item in self.scale_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from `state_dict()`; refuses a state of another policy."""
        if state.get("policy") != self.policy:
            raise ValueError(f"loss scaler state is for policy {state.get('policy')!r}, this scaler is {self.policy!r}")
        device = self._scale.device
        self._scale = torch.tensor(float(state["scale_value"]), dtype=torch.float32, device=device)
        self._skipped = torch.tensor(int(state["skipped_steps"]), dtype=torch.int64, device=device)
        self.steps = int(state["steps"])
        self._history = [(int(step), float(value)) for step, value in state["scale_history"]]
        self._pending = []


class StaticLossScaler(LossScaler):
    """A fixed scale; steps with a non-finite gradient are skipped."""

    policy = "static"

    def _initial_scale(self) -> float:
        return float(self.config.init_scale)


class DynamicLossScaler(StaticLossScaler):
    """torch GradScaler semantics: back off on a non-finite gradient, grow after `growth_interval` good steps."""

    policy = "dynamic"

    def _update(self, found: torch.Tensor) -> None:
        torch._amp_update_scale_(
            self._scale,
            self._growth_tracker,
            found,
            self.config.growth_factor,
            self.config.backoff_factor,
            self.config.growth_interval,
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "growth_tracker": int(self._growth_tracker)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._growth_tracker = torch.tensor(int(state["growth_tracker"]), dtype=torch.int32, device=self._scale.device)


def quantized_products(model: nn.Module) -> dict[str, Any]:
    """Every MatmulPrecision reachable in `model`, keyed `module` (QLinear) or `module.qk` / `module.pv` (attention)."""
    from mxlab.nn.qmatmul import MatmulPrecision

    products: dict[str, Any] = {}
    for name, module in model.named_modules():
        precision = getattr(module, "precision", None)
        if isinstance(precision, MatmulPrecision):
            products[name] = precision
        policy = getattr(module, "policy", None)
        for product in ("qk", "pv"):
            precision = getattr(policy, product, None)
            if isinstance(precision, MatmulPrecision):
                products[f"{name}.{product}"] = precision
    return products


class PerLayerLossScaler(DynamicLossScaler):
    """Dynamic loss scale plus a power-of-two scale per quantized product (see the module docstring)."""

    policy = "per_layer"

    def __init__(self, config: LossScalingConfig, model: nn.Module) -> None:
        super().__init__(config)
        self.products = quantized_products(model)
        if not self.products:
            raise ValueError(
                "loss_scaling policy 'per_layer' found no quantized product in the model; apply the recipe first"
            )
        for precision in self.products.values():
            precision.grad_scale = 1.0
            precision.reset_grad_stats()
        self.layer_scale_history: dict[str, list[tuple[int, float]]] = {name: [(0, 1.0)] for name in self.products}

    @property
    def layer_scales(self) -> dict[str, float]:
        return {name: float(precision.grad_scale) for name, precision in self.products.items()}

    def step_on_device(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """The dynamic step, then each product's scale from its gradient statistics (read on the host:
        this policy syncs once per step, for all products together)."""
        stepped = super().step_on_device(optimizer)
        gathered = {name: precision.reset_grad_stats() for name, precision in self.products.items()}
        gathered = {name: stats["counts"] for name, stats in gathered.items() if stats}
        if not gathered:
            return stepped
        device = next(iter(gathered.values())).device
        host = torch.stack([counts.to(device) for counts in gathered.values()]).tolist()  # the one sync
        for name, (nonfinite, nonzero, underflow) in zip(gathered, host):
            precision = self.products[name]
            current = float(precision.grad_scale)
            if nonfinite > 0:
                new = current * self.config.backoff_factor
            elif nonzero and underflow / nonzero > self.config.underflow_threshold:
                new = min(current * self.config.growth_factor, self.config.max_layer_scale)
            else:
                new = current
            if new != current:
                precision.grad_scale = new
                self.layer_scale_history[name].append((self.steps - 1, new))
        return stepped

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "layer_scales": self.layer_scales,
            "layer_scale_history": {
                name: [list(item) for item in history] for name, history in self.layer_scale_history.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        missing = sorted(set(self.products) - set(state["layer_scales"]))
        if missing:
            raise ValueError(f"per-layer loss scaler state has no scale for {missing}")
        for name, precision in self.products.items():
            precision.grad_scale = float(state["layer_scales"][name])
        self.layer_scale_history = {
            name: [(int(step), float(value)) for step, value in history]
            for name, history in state["layer_scale_history"].items()
        }


def make_loss_scaler(config: LossScalingConfig | dict[str, Any] | None, model: nn.Module | None = None) -> LossScaler:
    """The loss scaler for `config` (a LossScalingConfig, a `[loss_scaling]` table, or None for none).

    `per_layer` needs the model after `apply_recipe` (it sets a scale on each quantized product)
    and refuses to start without one.
    """
    if not isinstance(config, LossScalingConfig):
        config = parse_loss_scaling(config)
    if config.policy == "none":
        return LossScaler(config)
    if config.policy == "static":
        return StaticLossScaler(config)
    if config.policy == "dynamic":
        return DynamicLossScaler(config)
    if model is None:
        raise ValueError("loss_scaling policy 'per_layer' needs the model: make_loss_scaler(config, model)")
    return PerLayerLossScaler(config, model)
