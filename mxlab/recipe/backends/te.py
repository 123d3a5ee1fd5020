"""Transformer Engine (TE) as a recipe backend: the linear layers of a `backend = "te"` policy
(mxlab.recipe.backends.te_policy) become te.Linear modules running TE's own FP8 / MXFP8 kernels.

`TEConverter().convert(model, targets)` (called by mxlab.recipe.apply_recipe) swaps each matched
`nn.Linear`/`QLinear` for a `te.Linear` with the same weight and bias values (copied; new
Parameters, so build the optimizer after apply_recipe, as the runner does) whose forward and
backward run under `te.autocast(recipe=...)` with the policy's TE recipe. The plan marks those
modules with backend "te".

Shapes. TE's FP8 GEMMs need in_features and out_features to be multiples of 16 (32 for mxfp8)
and a token count that is a multiple of 16 (32 for mxfp8). The token count is handled here: the
flattened input is zero-padded with rows up to the alignment and the output cropped, which changes
no quantized value of the real rows (zeros raise no amax and fill no block beyond the real ones).
A module whose feature sizes are not aligned is refused by default, naming the module and the two
fixes; with `unaligned = "high_precision"` it stays a plain linear layer and the plan says why.

state_dict: te.Linear keeps the keys `weight` and `bias` and adds `_extra_state` (TE's scaling
state). `te_state_dict_to_plain` / `plain_state_dict_to_te` map a state_dict between a model with TE
modules and the same model without them, both ways.

Refusals come before any module is swapped (`BackendUnavailableError`, a RuntimeError): TE not
installed (with how to install it), no CUDA device, a TE recipe the GPU cannot run (TE's own
reason, e.g. "Device compute capability 10.0 or higher required for MXFP8 execution."). The
runner records an arm refused this way as skipped (done.json status "skipped" with the reason).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from mxlab.recipe.backends import Target
from mxlab.recipe.backends.te_policy import (
    AMAX_COMPUTE_ALGOS,
    BACKEND_NAME,
    BACKENDS,
    TE_ALIGNMENT,
    TE_RECIPE_CLASSES,
    TE_RECIPES,
    TEPolicy,
    is_te_policy,
    parse_backend_policy,
    te_recipe_names,
)
from mxlab.recipe.plan import PlanEntry, replace_module

TE_VERSION_PIN = "2.20"
INSTALL_HINT = (
    "install it with `pip install 'mxlab[te]'` (transformer-engine 2.20, needs CUDA), or on an offline "
    "GPU machine from the wheels that shared/te/prepare.sh gathers (see shared/te/README.md)"
)


class BackendUnavailableError(RuntimeError):
    """A recipe needs a backend (Transformer Engine) that this machine cannot run; the message says why."""


# --------------------------------------------------------------------------------- TE handle
@dataclass(frozen=True)
class TEHandle:
    """The imported TE: `pytorch` (transformer_engine.pytorch), `recipe` (transformer_engine.common.recipe).

    `requires_cuda` is False only for test stand-ins that run on the CPU.
    """

    pytorch: Any
    recipe: Any
    version: str
    requires_cuda: bool = True

    def __deepcopy__(self, memo: dict) -> TEHandle:  # a handle to imported modules: copies share it
        return self

    def __reduce__(self) -> Any:  # pickled (a model sent to a worker): imported again on the other side
        return (load_transformer_engine, ())

    def autocast(self, te_recipe: Any) -> Any:
        """TE's autocast context with `te_recipe` (te.autocast; te.fp8_autocast on TE before 2.8)."""
        autocast = getattr(self.pytorch, "autocast", None)
        if autocast is not None:
            return autocast(enabled=True, recipe=te_recipe)
        return self.pytorch.fp8_autocast(enabled=True, fp8_recipe=te_recipe)


def load_transformer_engine() -> TEHandle:
    """Import Transformer Engine; returns a TEHandle.

    Refuses (BackendUnavailableError, with how to install TE) when it cannot be imported.
    """
    try:
        te = importlib.import_module("transformer_engine.pytorch")
        recipe = importlib.import_module("transformer_engine.common.recipe")
    except Exception as error:  # ImportError, or a broken install (missing CUDA libraries: OSError, RuntimeError)
        raise BackendUnavailableError(
            f"Transformer Engine cannot be imported ({type(error).__name__}: {error}); {INSTALL_HINT}"
        ) from None
    version = str(getattr(importlib.import_module("transformer_engine"), "__version__", "unknown"))
    return TEHandle(pytorch=te, recipe=recipe, version=version)


def te_recipe_support(handle: TEHandle, te_recipe: str) -> tuple[bool, str]:
    """(can this GPU run `te_recipe`, TE's reason when not), from TE's own is_*_available checks."""
    check_name = {
        "fp8_current": "is_fp8_available",
        "fp8_delayed": "is_fp8_available",
        "fp8_block": "is_fp8_block_scaling_available",
        "mxfp8": "is_mxfp8_available",
    }[te_recipe]
    check = getattr(handle.pytorch, check_name, None)
    if check is None:
        return (
            False,
            f"this Transformer Engine ({handle.version}) has no "
            f"{check_name}; mxlab pins transformer-engine {TE_VERSION_PIN}",
        )
    try:
        result = check(return_reason=True)
    except TypeError:  # an older signature without return_reason
        result = check()
    if isinstance(result, tuple):
        return bool(result[0]), str(result[1] or "")
    return bool(result), ""


def _device_words(device: torch.device | str | None) -> str:
    """The CUDA device's name and compute capability, for messages ("this machine" without CUDA)."""
    if not torch.cuda.is_available():
        return "this machine"
    index = (
        torch.device(device).index
        if device is not None and torch.device(device).index is not None
        else torch.cuda.current_device()
    )
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} (compute capability {major}.{minor})"


def unavailable_reason(te_recipes: Iterable[str], device: torch.device | str | None = None) -> str | None:
    """None when TE can run every recipe in `te_recipes` here (on `device` when given); else the reason.

    Reasons, all found before any training: TE cannot be imported (with how to install it), no CUDA
    device, a `device` that is not CUDA, a recipe the GPU cannot run (TE's own reason, with the
    device's name and compute capability). An empty `te_recipes` needs nothing and gives None.
    Refuses (ValueError) an unknown TE recipe name.
    """
    names = sorted(set(te_recipes))
    unknown = [name for name in names if name not in TE_RECIPES]
    if unknown:
        raise ValueError(f"unknown TE recipe(s) {unknown}; accepted: {', '.join(TE_RECIPES)}")
    if not names:
        return None
    reasons = []
    try:
        handle: TEHandle | None = load_transformer_engine()
    except BackendUnavailableError as error:
        handle = None
        reasons.append(str(error))
    if handle is None or handle.requires_cuda:
        if not torch.cuda.is_available():
            reasons.append(
                "Transformer Engine runs on CUDA GPUs only and torch.cuda.is_available() is False on this machine"
            )
        elif device is not None and torch.device(device).type != "cuda":
            reasons.append(f"Transformer Engine runs on CUDA GPUs only; the run's device is {device}")
    if reasons or handle is None:
        return "; ".join(reasons)
    for name in names:
        supported, reason = te_recipe_support(handle, name)
        if not supported:
            return (
                f"TE recipe {name!r} ({TE_RECIPE_CLASSES[name]}) cannot run on {_device_words(device)}: "
                f"{reason or 'Transformer Engine reports it unsupported'}"
            )
    return None


def recipe_unavailable_reason(recipe: Any, device: torch.device | str | None = None) -> str | None:
    """None when every TE policy of an mxlab Recipe can run here (or it has none); else the reason."""
    return unavailable_reason(te_recipe_names(recipe), device)


def require_te(te_recipes: Iterable[str], device: torch.device | str | None = None) -> TEHandle:
    """The TEHandle when TE can run every recipe in `te_recipes`; refuses (BackendUnavailableError) with the reason."""
    reason = unavailable_reason(te_recipes, device)
    if reason is not None:
        raise BackendUnavailableError(reason)
    return load_transformer_engine()


def build_te_recipe(policy: TEPolicy, handle: TEHandle) -> Any:
    """TE's recipe object for a TEPolicy (Float8CurrentScaling, DelayedScaling, Float8BlockScaling or
    MXFP8BlockScaling)."""
    recipes = handle.recipe
    fp8_format = getattr(recipes.Format, policy.fp8_format.upper())
    cls = getattr(recipes, policy.te_recipe_class)
    if policy.te_recipe == "fp8_delayed":
        return cls(
            fp8_format=fp8_format, amax_history_len=policy.amax_history_len, amax_compute_algo=policy.amax_compute_algo
        )
    return cls(fp8_format=fp8_format)


# --------------------------------------------------------------------------------- modules
def unaligned_dims(linear: nn.Linear, alignment: int) -> list[str]:
    """Which of in_features / out_features are not multiples of `alignment` (empty: TE can run it)."""
    return [
        f"{label} {size}"
        for label, size in (("in_features", linear.in_features), ("out_features", linear.out_features))
        if size % alignment
    ]


def check_te_linears(
    linears: list[tuple[str, nn.Linear, TEPolicy]], device: torch.device | str | None = None
) -> TEHandle:
    """Check, before any module is swapped, that TE can take these (name, linear, policy) triples.

    Returns the TEHandle. Refuses: TE unavailable here (BackendUnavailableError), a module whose
    feature sizes are not aligned for its TE recipe under `unaligned = "error"` (ValueError naming
    the module, its sizes and both fixes).
    """
    handle = require_te([policy.te_recipe for _, _, policy in linears], device)
    refused = []
    for name, linear, policy in linears:
        bad = unaligned_dims(linear, policy.alignment)
        if bad and policy.unaligned == "error":
            refused.append(f"{name} ({', '.join(bad)}; {policy.te_recipe} needs multiples of {policy.alignment})")
    if refused:
        raise ValueError(
            f"Transformer Engine cannot run these modules: {'; '.join(refused)}. Send them to a high-precision "
            'policy with a rule (e.g. [[rules]] match = "towers.*.out" policy = "hp" '
            'with [policies.hp] all = "bf16"), '
            f'or set unaligned = "high_precision" in the TE policy to keep every such module unquantized'
        )
    return handle


@functools.cache
def _te_linear_class(base: type) -> type:
    """A subclass of `base` (te.Linear) whose forward runs under TE's autocast with the module's own recipe."""

    class MXLabTELinear(base):  # type: ignore[misc, valid-type]
        """te.Linear that enters te.autocast with its recipe and pads the token count to the recipe's alignment."""

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:  # noqa: D102
            return _te_forward(self, super().forward, x, *args, **kwargs)

    MXLabTELinear.__name__ = MXLabTELinear.__qualname__ = f"MXLabTE{base.__name__}"
    return MXLabTELinear


def _te_forward(module: nn.Module, base_forward: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    handle: TEHandle = module.mxlab_te_handle
    if handle.requires_cuda and not x.is_cuda:
        raise RuntimeError(
            f"{module.mxlab_te_name}: a Transformer Engine module runs on CUDA only; its input is on {x.device}"
        )
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    flat = x.reshape(rows, x.shape[-1])
    pad = -rows % module.mxlab_te_alignment if rows else module.mxlab_te_alignment
    if pad:
        flat = F.pad(flat, (0, 0, 0, pad))
    with handle.autocast(module.mxlab_te_recipe):
        out = base_forward(flat, *args, **kwargs)
    if pad:
        out = out[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def make_te_linear(name: str, linear: nn.Linear, policy: TEPolicy, handle: TEHandle) -> nn.Module:
    """A te.Linear (subclass running under TE's autocast with `policy`'s recipe) holding copies of
    `linear`'s weight and bias, on `linear`'s device when it is CUDA (else the current CUDA device;
    the runner moves the model afterwards) and in its dtype. The CPU and CUDA random states are
    left as they were."""
    device = linear.weight.device
    if handle.requires_cuda and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    cls = _te_linear_class(handle.pytorch.Linear)
    # TE initializes its own weights (overwritten below) from the RNGs: restore them, so that a TE arm
    # draws the same random numbers afterwards as the other arms of its seed
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type="cuda"):
        module = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            params_dtype=linear.weight.dtype,
            device=device,
        )
    with torch.no_grad():
        module.weight.copy_(linear.weight)
        if linear.bias is not None:
            module.bias.copy_(linear.bias)
    module.train(linear.training)
    module.mxlab_te_name = name
    module.mxlab_te_policy = policy
    module.mxlab_te_recipe = build_te_recipe(policy, handle)
    module.mxlab_te_alignment = policy.alignment
    module.mxlab_te_has_bias = linear.bias is not None
    module.mxlab_te_handle = handle
    return module


def is_te_module(module: nn.Module) -> bool:
    """True for a module that this backend put in place of a linear layer."""
    return hasattr(module, "mxlab_te_policy")


def te_module_names(model: nn.Module) -> list[str]:
    """Qualified names of the TE modules of a model, in model order."""
    return [name for name, module in model.named_modules() if is_te_module(module)]


def apply_te_policy(
    model: nn.Module, name: str, linear: nn.Linear, policy: TEPolicy, rule: str, handle: TEHandle
) -> PlanEntry:
    """Swap `linear` (at `name` in `model`) for a TE module under `policy`; returns its PlanEntry.

    A module whose feature sizes TE cannot run (allowed only with unaligned = "high_precision")
    stays a plain nn.Linear; its entry says why. Call `check_te_linears` first.
    """
    bad = unaligned_dims(linear, policy.alignment)
    if bad:
        if isinstance(linear, nn.Linear) and hasattr(linear, "precision"):
            linear.precision = None  # a QLinear from an earlier recipe: back to plain nn.Linear numerics
        return PlanEntry(
            name,
            "linear",
            policy.name,
            rule,
            False,
            {},
            [],
            backend="mxlab",
            note=f"kept high precision: {', '.join(bad)} not a multiple of {policy.alignment} ({policy.te_recipe})",
        )
    replace_module(model, name, make_te_linear(name, linear, policy, handle))
    return PlanEntry(name, "linear", policy.name, rule, True, policy.describe(), [], backend=BACKEND_NAME)


class TEConverter:
    """The `te` backend: swaps the linear layers of `backend = "te"` policies for te.Linear modules."""

    name = BACKEND_NAME

    def unavailable_reason(self, recipe: Any, device: torch.device | str | None = None) -> str | None:
        """None when TE can run every TE policy of `recipe` here (or it has none); else the reason
        (`recipe_unavailable_reason`)."""
        return recipe_unavailable_reason(recipe, device)

    def convert(self, model: nn.Module, targets: list[Target], *, seed: int = 0) -> list[PlanEntry]:
        """Swap every target (linear modules with a TEPolicy) for a TE module; returns their PlanEntries.

        Refuses before any swap (see `check_te_linears`): TE unavailable here
        (BackendUnavailableError), a module TE cannot run under `unaligned = "error"` (ValueError).
        A non-linear target or one without a TEPolicy is a ValueError. `seed` is unused (TE's
        recipes round to nearest).
        """
        wrong = [target.name for target in targets if target.kind != "linear" or not is_te_policy(target.policy)]
        if wrong:
            raise ValueError(f'the te backend converts linear modules under a backend = "te" policy only, not {wrong}')
        if not targets:
            return []
        handle = check_te_linears([(target.name, target.module, target.policy) for target in targets])
        return [
            apply_te_policy(model, target.name, target.module, target.policy, target.rule, handle) for target in targets
        ]


# --------------------------------------------------------------------------------- state_dict
def te_state_dict_to_plain(state_dict: dict[str, Any], te_modules: Iterable[str]) -> dict[str, Any]:
    """A state_dict of a model with TE modules, for the same model without them (nn.Linear/QLinear).

    `te_modules` are the TE modules' qualified names (`te_module_names(model)` or the plan's
    modules with backend "te"). Drops each one's `_extra_state` (TE's scaling state) and an empty
    `bias` placeholder of a bias-free layer; weight and bias keep their keys and values.
    """
    prefixes = {f"{name}." if name else "" for name in te_modules}
    plain = {}
    for key, value in state_dict.items():
        prefix, _, leaf = key.rpartition(".")
        owner = f"{prefix}." if prefix else ""
        if owner in prefixes and (
            leaf == "_extra_state" or (leaf == "bias" and isinstance(value, torch.Tensor) and value.numel() == 0)
        ):
            continue
        plain[key] = value
    return plain


def plain_state_dict_to_te(state_dict: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """A state_dict of the plain model (no TE modules) for `model`, which has TE modules.

    Adds the TE-only entries (`_extra_state`, a bias placeholder) from `model`'s current state, so
    `model.load_state_dict(result)` is strict. Refuses (ValueError) a state_dict whose keys are not
    those of the plain model, listing the missing and unexpected keys.
    """
    current = model.state_dict()
    te_only = {
        key: value
        for key, value in current.items()
        if key not in te_state_dict_to_plain({key: value}, te_module_names(model))
    }
    expected = set(current) - set(te_only)
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise ValueError(
            "state_dict does not match the model without TE modules: "
            f"missing {missing[:10]}, unexpected {unexpected[:10]}"
        )
    return {**te_only, **state_dict}


__all__ = [
    "AMAX_COMPUTE_ALGOS",
    "BACKENDS",
    "BackendUnavailableError",
    "INSTALL_HINT",
    "TEConverter",
    "TEHandle",
    "TEPolicy",
    "TE_ALIGNMENT",
    "TE_RECIPES",
    "TE_RECIPE_CLASSES",
    "apply_te_policy",
    "build_te_recipe",
    "check_te_linears",
    "is_te_module",
    "is_te_policy",
    "load_transformer_engine",
    "make_te_linear",
    "parse_backend_policy",
    "plain_state_dict_to_te",
    "recipe_unavailable_reason",
    "require_te",
    "te_module_names",
    "te_recipe_names",
    "te_recipe_support",
    "te_state_dict_to_plain",
    "unaligned_dims",
    "unavailable_reason",
]
