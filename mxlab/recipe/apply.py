"""apply_recipe: give every reachable module of a model its recipe policy, through its backend's converter."""

from __future__ import annotations

import sys
import types
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from torch import nn

from mxlab.recipe.backends import Converter, Target
from mxlab.recipe.backends.mxlab import MXLabConverter
from mxlab.recipe.backends.te import TEConverter
from mxlab.recipe.fast_paths import disable_fast_paths
from mxlab.recipe.import_hooks import after_import
from mxlab.recipe.library import load_recipe
from mxlab.recipe.loss_scaling import quantized_products
from mxlab.recipe.plan import Plan, PlanEntry, reachable_modules, replace_module
from mxlab.recipe.schema import Recipe
from mxlab.recipe.sites import OP_NAMES, GemmSites, parameter_site


def converters_for(recipe: Recipe) -> dict[str, Converter]:
    """The converter of each backend for `recipe`, in the order apply_recipe runs them: every converter
    refuses before it changes a module, and mxlab's (which refuses nothing a valid recipe holds) runs
    last, so a refusal leaves the model as it was."""
    return {"te": TEConverter(), "mxlab": MXLabConverter(recipe.attention)}


def unavailable_reason(recipe: Recipe, device: Any = None) -> str | None:
    """None when every backend of `recipe` can run it here (on `device` when given); else the backends'
    reasons, joined (each converter's `unavailable_reason`)."""
    reasons = [converter.unavailable_reason(recipe, device) for converter in converters_for(recipe).values()]
    found = [reason for reason in reasons if reason]
    return "; ".join(found) if found else None


def _lazy_linears(model: nn.Module) -> list[str]:
    return [
        name or "the model"
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params()
    ]


def _sharded_modules(model: nn.Module) -> list[str]:
    """Names of the modules of `model` already sharded by FSDP (fully_shard, FullyShardedDataParallel) or holding
    DTensor parameters. A process that never imported torch.distributed.fsdp or torch.distributed.tensor holds
    no such module or parameter: the check then imports neither (seconds of imports)."""
    fsdp, tensor = sys.modules.get("torch.distributed.fsdp"), sys.modules.get("torch.distributed.tensor")
    sharded = (fsdp.FSDPModule, fsdp.FullyShardedDataParallel) if fsdp is not None else ()
    dtensor = tensor.DTensor if tensor is not None else ()
    return [
        name or "the model"
        for name, module in model.named_modules()
        if isinstance(module, sharded)
        or any(isinstance(parameter, dtensor) for parameter in module.parameters(recurse=False))
    ]


def site_candidates(model: nn.Module, swapped: set[str]) -> tuple[list[str], list[str]]:
    """(the GEMM sites known before a forward: parameters of two or more dims outside swapped modules and
    embeddings, named as mxlab.recipe.sites names them; the names a functional product can take,
    MODULE.OP for every module outside the swapped ones)."""
    parameters: list[str] = []
    products: list[str] = []
    for name, module in model.named_modules():
        if name in swapped or any(name.startswith(f"{outer}.") for outer in swapped if outer):
            continue
        products.extend(".".join(part for part in (name, op) if part) for op in OP_NAMES)
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            continue
        parameters.extend(
            parameter_site(name, parameter_name)
            for parameter_name, parameter in module.named_parameters(recurse=False)
            if parameter.dim() >= 2
        )
    return parameters, products


def apply_recipe(
    model: nn.Module,
    recipe: Recipe | str | Path,
    *,
    seed: int = 0,
    example_inputs: Any = None,
    unsupported: str = "error",
) -> Plan:
    """Apply `recipe` (a Recipe, or a name or path for `load_recipe`) to `model` in place and return the Plan
    (one entry per reachable module, in model order).

    Every reachable linear module whose policy is not all high precision becomes a QLinear sharing
    the same Parameters (a QLinear whose policy is high precision gets precision None, i.e. plain
    nn.Linear); every JaggedAttention gets `policy` = AttentionPolicy or None. `seed` (the run seed)
    seeds stochastic rounding, per module (see `module_seed`). Never patches torch functions.
    Refuses (ValueError) a rule that matches no GEMM site, listing the reachable ones, and a model holding a
    lazy module (nn.LazyLinear) not yet materialised by a first forward, and a model already sharded by FSDP
    (`fully_shard` or FullyShardedDataParallel): apply the recipe first, then shard; and a model that is itself
    a linear or attention module (swaps replace submodules: wrap it in nn.Sequential).
    A recipe that quantizes anything turns on Inductor's `emulate_precision_casts` (process-wide; the plan says
    so), without which a compiled bfloat16 model does not keep eager mode's bits, and turns off the horizontal
    fusion of Inductor's CPU code, whose loop split fails on such a model (`_exact_inductor_casts`). A
    TransformerEncoderLayer whose linear layers are emulated is kept off PyTorch's fused fast path
    (mxlab.recipe.fast_paths), which would bypass them; the plan notes it. A linear module whose
    policy has backend = "te" becomes a Transformer Engine te.Linear (mxlab.recipe.backends.te, which
    refuses, before any swap, with BackendUnavailableError when TE cannot run here).

    GEMMs without a module to swap (F.linear or mm/matmul/bmm/addmm/einsum on a Parameter, products of two
    activations, F.scaled_dot_product_attention, nn.MultiheadAttention's) are GEMM sites, emulated during the
    model's forward by mxlab.recipe.sites.GemmSites and named there; a rule may name them, and is refused only
    when it matches neither a module, a parameter site nor a MODULE.OP name. `example_inputs` (as
    `Plan.coverage` takes them) measures the coverage at once. `unsupported`: "error" (a GEMM the emulation
    cannot take under a quantizing policy raises, naming it) or "high_precision" (it runs as written; the plan
    lists the reason).
    """
    if isinstance(recipe, (str, Path)):
        recipe = load_recipe(recipe)
    if not isinstance(recipe, Recipe):
        raise ValueError(f"apply_recipe needs a Recipe or a recipe name (see load_recipe), got {type(recipe).__name__}")
    lazy = _lazy_linears(model)
    if lazy:
        raise ValueError(
            f"recipe {recipe.name!r}: lazy module(s) {', '.join(lazy)} have no weights yet; run one forward "
            "(which materialises them as nn.Linear) before apply_recipe"
        )
    sharded = _sharded_modules(model)
    if sharded:
        raise ValueError(
            f"recipe {recipe.name!r}: module(s) {', '.join(sharded[:8])} are already sharded (FSDP2 fully_shard, "
            "FSDP1 or DTensor parameters), whose GEMMs would see shards; apply_recipe to the unsharded model "
            "first, then fully_shard it (FSDP2 and DDP are supported in that order)"
        )
    reachable = reachable_modules(model)
    if any(name == "" for name, _, _ in reachable):
        raise ValueError(
            f"recipe {recipe.name!r}: the model itself is a {type(model).__name__}, which apply_recipe cannot swap "
            "in place (it replaces submodules); wrap it, e.g. model = nn.Sequential(layer), then apply_recipe(model)"
        )
    names = [name for name, _, _ in reachable]
    parameters, products = site_candidates(model, set(names))
    for rule in recipe.rules:
        if not any(fnmatchcase(name, rule.match) for name in names + parameters + products):
            sites = names + parameters
            shown = ", ".join(sites[:40]) + (f", ... ({len(sites)} in all)" if len(sites) > 40 else "")
            raise ValueError(
                f"recipe {recipe.name!r}: rule match = {rule.match!r} matches no module or GEMM site of this model "
                f"(recipes name modules of one model; the shipped ones use the GEM model's names). "
                f"Reachable sites: {shown}; products of two activations are MODULE.OP (OP one of "
                f"{', '.join(OP_NAMES)})"
            )
    converters = converters_for(recipe)
    by_backend: dict[str, list[Target]] = {backend: [] for backend in converters}
    for name, module, kind in reachable:
        policy, rule = recipe.policy_for(name)
        backend = getattr(policy, "backend", "mxlab") if kind == "linear" else "mxlab"
        if backend not in converters:
            raise ValueError(
                f"recipe {recipe.name!r}: module {name!r} has policy {policy.name!r} of unknown backend "
                f"{backend!r}; backends: {', '.join(converters)}"
            )
        by_backend[backend].append(Target(name, module, kind, policy, rule))
    entries: dict[str, PlanEntry] = {}
    for backend, converter in converters.items():
        if by_backend[backend]:
            entries.update((entry.module, entry) for entry in converter.convert(model, by_backend[backend], seed=seed))
    for name, note in disable_fast_paths(model).items():
        entry = entries.get(name)
        if entry is not None:
            entry.note = "; ".join(text for text in (entry.note, note) if text)
    ordered = [entries[name] for name in names]
    sites = GemmSites(recipe, seed, {entry.module: entry for entry in ordered}, unsupported)
    sites.install(model)
    plan = Plan(
        recipe=recipe.name,
        seed=int(seed),
        entries=ordered,
        loss_scaling=recipe.loss_scaling.to_dict(),
        sites=sites,
        model=model,
        rules=tuple(rule.match for rule in recipe.rules),
        has_attention_table=recipe.attention is not None,
    )
    plan.inductor_casts_exact = _exact_inductor_casts(recipe)
    if example_inputs is not None:
        plan.coverage(example_inputs)
    return plan


def _exact_inductor_casts(recipe: Recipe) -> bool:
    """Turn on `torch._inductor.config.emulate_precision_casts`, and turn off horizontal fusion in Inductor's C++
    (CPU) code (`cpp.max_horizontal_fusion_size = 1`), when `recipe` quantizes anything; returns whether it did.
    With PyTorch's default (off), Inductor keeps a producer fused into a quantizer (a bfloat16 model's GELU) in
    float32 and skips the rounding eager mode applies, so the quantizer reads other values and a compiled
    bfloat16 model leaves eager mode's bits. Horizontally fused casts of two operands of different row counts
    fail an assertion of the C++ backend's loop split (torch 2.13: a layer under bfloat16 autocast with rows
    not a multiple of 32) (docs/applying.md, "torch.compile"). Process-wide, as the settings are; in a process
    that has not imported Inductor's config, they are set as that config is first imported (nothing compiles
    before that), so applying a recipe does not import Inductor and Dynamo (seconds)."""
    if recipe.attention is None and all(policy.high_precision for policy in recipe.policies.values()):
        return False
    after_import("torch._inductor.config", _exact_inductor_settings)
    return True


def _exact_inductor_settings(config: types.ModuleType) -> None:
    config.emulate_precision_casts = True
    config.cpp.max_horizontal_fusion_size = 1


def rounding_state(model: nn.Module) -> dict[str, int]:
    """The call counters of every quantized product (keyed as mxlab.recipe.loss_scaling.quantized_products),
    which with the module seeds fix the stochastic-rounding bits; save it with a checkpoint to resume them."""
    return {name: int(precision.calls) for name, precision in quantized_products(model).items()}


def load_rounding_state(model: nn.Module, state: dict[str, int]) -> None:
    """Restore the counters saved by `rounding_state`; refuses a state that misses a product of the model."""
    products = quantized_products(model)
    missing = sorted(set(products) - set(state))
    if missing:
        raise ValueError(f"rounding state has no counter for {missing}; it was saved from another plan")
    for name, precision in products.items():
        precision.calls = int(state[name])


__all__ = ["apply_recipe", "converters_for", "load_rounding_state", "replace_module", "rounding_state"]
