"""PyTorch's fused fast paths, kept from bypassing emulated layers.

`nn.TransformerEncoderLayer` in eval() under no_grad runs one fused kernel (`torch._transformer_encoder_layer_fwd`)
that never calls its `linear1` / `linear2`, so a recipe applied to them would silently not run. PyTorch skips that
path for a layer with a forward hook attached, and `nn.TransformerEncoder` skips its nested-tensor path when
`use_nested_tensor` is False: both per module, nothing global is switched. (`nn.MultiheadAttention`'s fast path
multiplies only its own projections, which no recipe reaches.)
"""

from __future__ import annotations

from torch import nn

from mxlab.nn.linear import QLinear

_MARK = "_mxlab_fast_path_off"


def _keep_slow_path(module: nn.Module, args: tuple) -> None:
    """A forward pre-hook that changes nothing: its presence keeps PyTorch off the fused path."""
    return None


def _emulated(module: nn.Module) -> bool:
    return isinstance(module, QLinear) and module.precision is not None


def disable_fast_paths(model: nn.Module) -> dict[str, str]:
    """Keep every TransformerEncoderLayer holding an emulated linear layer (and its TransformerEncoder) off
    PyTorch's fused path; returns a note for each emulated linear layer it protects, keyed by qualified name."""
    notes: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.TransformerEncoder):
            if any(_emulated(m) for m in module.modules()):
                module.use_nested_tensor = False
        if not isinstance(module, nn.TransformerEncoderLayer):
            continue
        linears = [child for child in ("linear1", "linear2") if _emulated(getattr(module, child, None))]
        if not linears:
            continue
        if not getattr(module, _MARK, False):
            module.register_forward_pre_hook(_keep_slow_path)
            setattr(module, _MARK, True)
        for child in linears:
            notes[f"{name}.{child}" if name else child] = (
                f"PyTorch fast path of {name or 'the model'} disabled (it would bypass this layer)"
            )
    return notes


__all__ = ["disable_fast_paths"]
