"""GEMM sites without a module to swap: functional GEMMs inside a recipe-applied model, intercepted and emulated.

`GemmSites` is a `torch.overrides.TorchFunctionMode` that `apply_recipe` installs on the model: a forward pre-hook
of the model enters it and its forward hook (always called) leaves it, so it is active during the model's forward
only, nothing global is patched, and every other op passes through unchanged. Each non-swapped submodule pushes
its qualified name while it runs (a pre-hook and a forward hook); a swapped module (QLinear, nn.Linear, a
JaggedAttention) suspends the mode while it runs, since it emulates its own GEMMs.

A GEMM met in the mode is a site, named by the module that runs it:

- an operand that is a Parameter (or a view of one) of the running module names the site after the parameter:
  `blocks.0._uvqk`, `inter_arch.crossnet.W_kernels.0`, `self_attn.in_proj` (`in_proj_weight`), `self_attn.out_proj`
  (`out_proj.weight`): ops F.linear, mm, matmul (@), bmm, addmm, baddbmm, einsum;
- a product of two activations is `MODULE.OP` (`inter_arch.bmm`, `blocks.0.einsum`), the n-th of the same op
  in one forward of the module `MODULE.OP.n`;
- F.scaled_dot_product_attention is two sites, `MODULE.qk` and `MODULE.pv`, under the recipe's `[attention]`
  (mxlab.nn.functional.attention: JaggedAttention's one-pass P contract).

A site's policy is `recipe.policy_for(site)`; its GEMMs run through mxlab.nn.functional (qmatmul: forward,
grad of each operand). nn.MultiheadAttention's F.multi_head_attention_forward runs as a private copy whose
own torch-function check is off, so the GEMMs inside it reach the mode.
"""

from __future__ import annotations

import math
import sys
import types
import warnings
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from mxlab.nn import functional as QF
from mxlab.nn.precision import GemmQuant, MatmulPrecision
from mxlab.recipe.import_hooks import after_import
from mxlab.recipe.plan import PlanEntry, module_seed

T = torch.Tensor
GEMM_OPS = {
    F.linear: "linear",
    torch.mm: "mm",
    T.mm: "mm",
    torch.matmul: "matmul",
    T.matmul: "matmul",
    torch.bmm: "bmm",
    T.bmm: "bmm",
    torch.addmm: "addmm",
    T.addmm: "addmm",
    torch.baddbmm: "baddbmm",
    T.baddbmm: "baddbmm",
    torch.einsum: "einsum",
    F.scaled_dot_product_attention: "sdpa",
}
UNSUPPORTED_OPS = {
    torch.mv: "mv",
    T.mv: "mv",
    torch.addmv: "addmv",
    torch.tensordot: "tensordot",
    F.bilinear: "bilinear",
    torch.linalg.multi_dot: "multi_dot",
}
OP_NAMES = sorted(set(GEMM_OPS.values()) - {"sdpa"}) + ["qk", "pv"]
_mha_copy: Any = None


def _mha_forward() -> Any:
    """A copy of F.multi_head_attention_forward whose `has_torch_function` is False (torch itself is not touched),
    so that its F.linear, bmm and scaled_dot_product_attention calls reach the active mode."""
    global _mha_copy
    if _mha_copy is None:
        original = F.multi_head_attention_forward
        scope = dict(original.__globals__, has_torch_function=lambda *args: False)
        _mha_copy = types.FunctionType(original.__code__, scope, original.__name__, original.__defaults__)
        _mha_copy.__kwdefaults__ = original.__kwdefaults__
    return _mha_copy


def parameter_site(module_name: str, parameter: str) -> str:
    """A parameter's site name: `X.weight` -> X, `X.foo_weight` -> X.foo, anything else its qualified name."""
    if parameter == "weight" or parameter.endswith(".weight"):
        parameter = parameter[: -len("weight")].rstrip(".")
    elif parameter.endswith("_weight"):
        parameter = parameter[: -len("_weight")]
    return ".".join(part for part in (module_name, parameter) if part)


def _swapped_precision(precision: MatmulPrecision) -> MatmulPrecision:
    """The precision of W @ x for a policy written for x @ W: fwd (W, x); grad of W is the wgrad (g, x), grad of x
    the dgrad (W, g), each GEMM's operands in the order qmatmul takes them."""

    def flip(gemm: GemmQuant) -> GemmQuant:
        return GemmQuant(gemm.b, gemm.a, gemm.hadamard)

    return MatmulPrecision(
        flip(precision.fwd),
        flip(precision.grad_b),
        flip(precision.grad_a),
        labels=("fwd", "wgrad", "dgrad"),
        name=precision.name,
        seed=precision.seed,
    )


def _flops(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> int:
    if op == "linear":
        return 2 * a.numel() * b.shape[0]
    contracted = a.shape[-1] if a.dim() else 1
    return 2 * (out.numel() if out is not None else 0) * contracted


class GemmSites(TorchFunctionMode):
    """The GEMM sites of one recipe-applied model (see the module docstring). `unsupported` = "error" (default)
    raises on a GEMM the emulation cannot take under a quantizing policy; "high_precision" runs it as written and
    records the reason."""

    def __init__(self, recipe: Any, seed: int, swapped: dict[str, PlanEntry], unsupported: str = "error") -> None:
        super().__init__()
        if unsupported not in ("error", "high_precision"):
            raise ValueError(f"unsupported must be 'error' or 'high_precision', got {unsupported!r}")
        self.recipe, self.seed, self.swapped, self.unsupported = recipe, int(seed), swapped, unsupported
        self.frames: list[tuple[str, nn.Module, dict[str, int]]] = []
        self.entries: dict[str, PlanEntry] = {}
        self.precisions: dict[tuple[str, str], MatmulPrecision | None] = {}
        self.counting: dict[str, list] | None = None
        self.active = False
        self._suspended: list[bool] = []
        self.handles: list[Any] = []

    # ------------------------------------------------------------------ hooks
    def install(self, model: nn.Module) -> None:
        """Register the hooks on `model` and its submodules (once)."""
        previous = getattr(model, "_mxlab_sites", None)
        if previous is not None:  # a recipe applied again: its hooks replace the last one's
            for handle in previous.handles:
                handle.remove()
        model._mxlab_sites = self
        self.handles = [
            model.register_forward_pre_hook(self._enter_model),
            model.register_forward_hook(self._leave_model, always_call=True),
        ]
        # The submodules' forward hooks are plain ones: an always-called hook's id lands in the module's
        # `_forward_hooks_always_called`, on which torch.compile guards, so every instance of a block (each layer)
        # would compile its frames anew. The model's own always-called hook resets the name and suspension stacks
        # when its forward raises.
        for name, module in model.named_modules():
            if name in self.swapped:
                self.handles.append(module.register_forward_pre_hook(self._suspend))
                self.handles.append(module.register_forward_hook(partial(self._resume, name)))
            elif not any(name.startswith(f"{outer}.") for outer in self.swapped if outer):
                self.handles.append(module.register_forward_pre_hook(partial(self._push, name)))
                self.handles.append(module.register_forward_hook(self._pop))

    def _enter_model(self, module: nn.Module, args: tuple) -> None:
        if not self.active:
            self.frames.clear()
            self._suspended.clear()
            self.__enter__()
            self.active = True

    def _leave_model(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.frames.clear()
        self._suspended.clear()
        if self.active:
            self.__exit__(None, None, None)
            self.active = False

    def _push(self, name: str, module: nn.Module, args: tuple) -> None:
        self.frames.append((name, module, {}))

    def _pop(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.frames:
            self.frames.pop()

    def _suspend(self, module: nn.Module, args: tuple) -> None:
        self._suspended.append(self.active)
        if self.active:
            self.__exit__(None, None, None)
            self.active = False

    def _resume(self, name: str, module: nn.Module, args: tuple, output: Any) -> None:
        if self.counting is not None and args:
            self._count_module(name, module, args)
        if self._suspended and self._suspended.pop():
            self.__enter__()
            self.active = True

    def _count_module(self, name: str, module: nn.Module, args: tuple) -> None:
        entry = self.swapped[name]
        if entry.kind == "linear":
            flops = 2 * args[0].numel() * module.weight.shape[0]
        else:  # JaggedAttention: q (total_q, H, D), k, v, q_offsets, k_offsets
            q, q_offsets, k_offsets = args[0], args[3], args[4]
            pairs = int((q_offsets.diff() * k_offsets.diff()).sum())
            flops = 4 * pairs * q.shape[1] * q.shape[2]
        self._count(name, flops, entry.quantized)

    def _count(self, site: str, flops: int, quantized: bool) -> None:
        if self.counting is not None:
            record = self.counting.setdefault(site, [0, quantized])
            record[0] += int(flops)

    # ------------------------------------------------------------------ dispatch
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        op = GEMM_OPS.get(func)
        if op is not None:
            if _called_by_inductor():
                return func(*args, **kwargs)
            return self._gemm(func, op, args, kwargs)
        if func is F.multi_head_attention_forward:
            with self:
                return _mha_forward()(*args, **kwargs)
        if func in UNSUPPORTED_OPS:
            name = self._product_site(UNSUPPORTED_OPS[func])
            return self._fallback(name, UNSUPPORTED_OPS[func], "an op the emulation does not take", func, args, kwargs)
        return func(*args, **kwargs)

    def _frame(self) -> tuple[str, nn.Module | None, dict[str, int]]:
        return self.frames[-1] if self.frames else ("", None, {})

    def _product_site(self, op: str) -> str:
        name, _, counts = self._frame()
        index = counts.get(op, 0)
        counts[op] = index + 1
        return ".".join(part for part in (name, op if index == 0 else f"{op}.{index}") if part)

    def _parameter_site(self, tensor: Any) -> str | None:
        name, module, _ = self._frame()
        if module is None or not isinstance(tensor, torch.Tensor):
            return None
        base = tensor._base
        for parameter_name, parameter in module.named_parameters():
            if tensor is parameter or (base is not None and base is parameter):
                return parameter_site(name, parameter_name)
        return None

    def _resolve(self, site: str, op: str, kind: str, swapped: bool) -> MatmulPrecision | None:
        key = (site, "left" if swapped else "right")
        if key in self.precisions:
            return self.precisions[key]
        policy, rule = self.recipe.policy_for(site)
        reason = ""
        precision = None
        if getattr(policy, "backend", "mxlab") != "mxlab":
            reason = f"backend {policy.backend} policies apply to nn.Linear modules only"
        elif policy.high_precision:
            reason = f"rule {rule}" if rule != "default" else "the default policy"
        else:
            precision = policy.to_precision(site, module_seed(self.seed, site))
            precision = _swapped_precision(precision) if swapped else precision
        gemms = policy.describe() if precision is not None else {}
        self.entries.setdefault(
            site, PlanEntry(site, kind, policy.name, rule, precision is not None, gemms, [], op=op, reason=reason)
        )
        self.precisions[key] = precision
        return precision

    def _fallback(self, site: str, op: str, reason: str, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run `func` as written, recording why; refuses (UnsupportedGemm) when `unsupported` is "error" and the
        site's policy would quantize it."""
        policy, rule = self.recipe.policy_for(site)
        quantizing = not getattr(policy, "high_precision", True)
        if quantizing and self.unsupported == "error":
            raise QF.UnsupportedGemm(
                f"GEMM site {site!r} ({op}): {reason}; the emulation cannot take it. Pass "
                "apply_recipe(..., unsupported='high_precision') to run it as written (the plan lists it), or give "
                "it a high-precision policy by a rule"
            )
        entry = self.entries.setdefault(site, PlanEntry(site, "product", policy.name, rule, False, {}, [], op=op))
        entry.quantized, entry.reason = False, reason if quantizing else entry.reason or f"rule {rule}"
        if quantizing:
            warnings.warn(f"GEMM site {site!r} ({op}) runs in high precision: {reason}", stacklevel=3)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and args and isinstance(args[-1], torch.Tensor):
            self._count(site, 2 * out.numel() * args[-1].shape[0], False)
        return out

    def _gemm(self, func: Any, op: str, args: tuple, kwargs: dict) -> Any:
        if op == "sdpa":
            return self._attention(func, args, kwargs)
        if op == "einsum":
            equation, operands = args[0], args[1:]
            if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
                operands = tuple(operands[0])
            if len(operands) != 2:
                site = self._product_site(op)
                return self._fallback(site, op, "an einsum of other than two operands", func, args, kwargs)
            a, b = operands
        elif op in ("addmm", "baddbmm"):
            a, b = args[1], args[2]
        else:
            a, b = args[0], args[1]
        right, left = self._parameter_site(b), self._parameter_site(a)
        site = right or left or self._product_site(op)
        kind = "gemm" if right or left else "product"
        swapped = right is None and left is not None
        precision = self._resolve(site, op, kind, swapped and op != "linear")
        if precision is None:
            out = func(*args, **kwargs)
            self._count(site, _einsum_flops(equation, a, b) if op == "einsum" else _flops(op, a, b, out), False)
            return out
        try:
            if op == "linear":
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                from mxlab.nn.linear import qlinear

                out = _outside_the_graph(qlinear, a, b, bias, precision)
            elif op == "einsum":
                out = _outside_the_graph(QF.einsum, equation, a, b, precision)
            elif op in ("addmm", "baddbmm"):
                scalars = {key: kwargs[key] for key in ("beta", "alpha") if key in kwargs}
                out = _outside_the_graph(QF.addmm, args[0], a, b, precision, **scalars)
            else:
                out = _outside_the_graph(QF.product, a, b, precision)
        except QF.UnsupportedGemm as error:
            self.precisions.pop((site, "left" if swapped else "right"), None)
            self.entries.pop(site, None)
            return self._fallback(site, op, str(error), func, args, kwargs)
        self._count(site, _einsum_flops(equation, a, b) if op == "einsum" else _flops(op, a, b, out), True)
        return out

    def _attention(self, func: Any, args: tuple, kwargs: dict) -> Any:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        call = dict(zip(names, args)) | kwargs
        q, k, v = call["query"], call["key"], call["value"]
        index = self._product_site("sdpa")
        suffix = index.rsplit("sdpa", 1)[1]
        prefix = index[: -len("sdpa" + suffix)]
        sites = {product: f"{prefix}{product}{suffix}" for product in ("qk", "pv")}
        precisions = {}
        for product, site in sites.items():
            precisions[product] = self._attention_precision(site, product)
        n = q.numel() // q.shape[-1] * k.shape[-2]  # (query, key) pairs
        flops = {"qk": 2 * n * q.shape[-1], "pv": 2 * n * v.shape[-1]}
        if all(p is None for p in precisions.values()):
            for product, site in sites.items():
                self._count(site, flops[product], False)
            return func(*args, **kwargs)
        reason = ""
        if call.get("dropout_p", 0.0):
            reason = f"dropout_p = {call['dropout_p']} inside attention"
        elif call.get("enable_gqa", False) or k.shape[:-2] != q.shape[:-2]:
            reason = "grouped-query or broadcast attention (q, k, v batch dims differ)"
        if reason:
            for site in sites.values():
                self.entries.pop(site, None)
                self.precisions.pop((site, "attention"), None)
            return self._fallback(sites["qk"], "sdpa", reason, func, args, kwargs)
        out = _outside_the_graph(
            QF.attention,
            q,
            k,
            v,
            call.get("attn_mask"),
            bool(call.get("is_causal", False)),
            call.get("scale"),
            **precisions,
        )
        for product, site in sites.items():
            self._count(site, flops[product], precisions[product] is not None)
        return out

    def _attention_precision(self, site: str, product: str) -> MatmulPrecision | None:
        key = (site, "attention")
        if key in self.precisions:
            return self.precisions[key]
        policy, rule = self.recipe.policy_for(site)
        attention = self.recipe.attention
        precision, reason = None, ""
        if attention is None:
            reason = "the recipe has no [attention] table"
        elif getattr(policy, "high_precision", False):
            reason = f"rule {rule}" if rule != "default" else "the default policy"
        else:
            precision = attention.product_precision(product, site, module_seed(self.seed, site))
            reason = "" if precision is not None else f"[attention] {product} is high precision"
        gemms = {product: attention.describe()[product]} if precision is not None else {}
        self.entries.setdefault(
            site,
            PlanEntry(site, "attention", policy.name, rule, precision is not None, gemms, [], op="sdpa", reason=reason),
        )
        self.precisions[key] = precision
        return precision

    # ------------------------------------------------------------------ coverage
    def measure(self, model: nn.Module, example_inputs: Any) -> dict[str, list]:
        """{site: [forward GEMM FLOPs, under MX]} of one forward of `example_inputs` (a tuple of positional
        arguments, a dict of keywords, or one argument), under no_grad; buffers and rounding counters restored."""
        from mxlab.recipe.loss_scaling import quantized_products

        buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
        products = list(quantized_products(model).values()) + [p for p in self.precisions.values() if p is not None]
        calls = [product.calls for product in products]
        self.counting = {}
        try:
            with torch.no_grad():
                if isinstance(example_inputs, dict):
                    model(**example_inputs)
                elif isinstance(example_inputs, tuple):
                    model(*example_inputs)
                else:
                    model(example_inputs)
            return self.counting
        finally:
            self.counting, counted = None, self.counting
            for product, count in zip(products, calls):
                product.calls = count
            with torch.no_grad():
                for name, buffer in model.named_buffers():
                    if name in buffers:
                        buffer.copy_(buffers[name])
            del counted


# When a frame inside the mode runs eagerly under torch.compile (a graph break inside a loop, say), Dynamo compiles
# each `__torch_function__` call as a frame of its own, and its recompiles guard the arguments but not `func`: a graph
# compiled for `mul` was seen to run for a later `add` of the same shapes. This frame is therefore never compiled on
# its own (it runs as written); Dynamo still inlines it where it traces the caller.


def _skip_mode_frame() -> None:
    from torch._dynamo.eval_frame import skip_code

    skip_code(GemmSites.__torch_function__.__code__)


after_import("torch._dynamo", lambda module: _skip_mode_frame())  # importing this module does not import Dynamo


def _called_by_inductor() -> bool:
    """Whether the op this mode is dispatching was called by Inductor's code: a compiled graph run while the mode is
    active (a model compiled whole enters it in an eager pre-hook, and Dynamo runs compiled code under the modes
    active at the call) calls its GEMMs as `extern_kernels.mm(a, b, out=buf)` and the like. Those GEMMs are the
    traced model's, already emulated where Dynamo traced them through this mode: emulating them again would
    quantize twice and leave `out` unwritten."""
    caller = sys._getframe(2)  # 0: this function, 1: __torch_function__, 2: the op's caller
    return str(caller.f_globals.get("__name__", "")).startswith("torch._inductor.")


@torch._disable_dynamo  # torch.compiler.disable, importing torch._dynamo at the first call
def _outside_the_graph(function: Any, *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)` run eagerly under torch.compile (a graph break per GEMM site, eager mode's bits):
    Dynamo cannot yet trace qmatmul's autograd.Function inside a TorchFunctionMode."""
    return function(*args, **kwargs)


def _einsum_flops(equation: str, a: torch.Tensor, b: torch.Tensor) -> int:
    """2 x the product of every index size of a two-operand einsum."""
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    size = {c: a.shape[i] for i, c in enumerate(inputs[0])} | {c: b.shape[i] for i, c in enumerate(inputs[1])}
    return 2 * math.prod(size.values())


__all__ = ["GEMM_OPS", "GemmSites", "OP_NAMES", "UNSUPPORTED_OPS", "parameter_site"]
