"""Recipes: which precision every GEMM of a model gets, by module name.

The package, one job per module:

- `schema`: parse and validate a recipe table (`parse_recipe` -> `Recipe`, its policies, rules,
  attention and loss-scaling tables), describe it, derive single-layer recipes;
- `library`: the one place recipes are found (`load_recipe`, `available_recipes`, `find_recipe`:
  a path, or a name in the caller's folders, $MXLAB_RECIPES, then the shipped recipes);
- `plan`: what a recipe reaches in a model, the `Plan` it returns, `replace_module`;
- `apply`: `apply_recipe(model, recipe, seed=)`, which hands each module to its backend's converter, and
  `unavailable_reason(recipe, device)`, which asks every backend whether it can run the recipe here;
- `backends/`: the converters (`mxlab`: mxlab's emulation; `te`: Transformer Engine), one interface;
- `loss_scaling`: the loss scalers of a recipe's `[loss_scaling]` table (`plan.loss_scaler(model)` makes one);
- `fast_paths`: keeps PyTorch's fused fast paths (TransformerEncoderLayer) from bypassing emulated layers;
- `diagnostics`: per-GEMM numerics records on sampled steps, bounded in memory.

This module re-exports the public API, so `from mxlab.recipe import load_recipe, apply_recipe` works.
"""

from __future__ import annotations

from mxlab.recipe.apply import apply_recipe, load_rounding_state, rounding_state, unavailable_reason
from mxlab.recipe.library import available_recipes, find_recipe, load_recipe, recipe_dirs
from mxlab.recipe.loss_scaling import LossScaler, make_loss_scaler
from mxlab.recipe.plan import Plan, PlanEntry, module_seed, quantizable_modules, reachable_modules, replace_module
from mxlab.recipe.schema import (
    AttentionPolicy,
    AttentionRecipe,
    LinearPolicy,
    Recipe,
    Rule,
    describe_gemm,
    describe_recipe,
    parse_recipe,
    single_layer_recipe,
)

__all__ = [
    "AttentionPolicy",
    "AttentionRecipe",
    "LinearPolicy",
    "LossScaler",
    "Plan",
    "PlanEntry",
    "Recipe",
    "Rule",
    "apply_recipe",
    "available_recipes",
    "describe_gemm",
    "describe_recipe",
    "find_recipe",
    "load_recipe",
    "load_rounding_state",
    "make_loss_scaler",
    "module_seed",
    "parse_recipe",
    "quantizable_modules",
    "reachable_modules",
    "recipe_dirs",
    "replace_module",
    "rounding_state",
    "single_layer_recipe",
    "unavailable_reason",
]
