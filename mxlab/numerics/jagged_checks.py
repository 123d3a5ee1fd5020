"""Input checks of jagged attention, shared by its two paths (the PyTorch reference in mxlab.nn.attention and
the Triton kernels in mxlab.kernels.attention): packed (tokens, heads, head_dim) tensors and offsets; no Triton."""

from __future__ import annotations

import torch

ACTIVATIONS = ("softmax", "silu")


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: str) -> None:
    """Refuses (ValueError) an unknown activation and q, k, v that are not (tokens, heads, head_dim)
    with k and v of one shape and q sharing their heads and head_dim. No host synchronization."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown attention activation {activation!r}; accepted: {', '.join(ACTIVATIONS)}")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"q, k, v must be (tokens, heads, head_dim); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or q.shape[1:] != k.shape[1:]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree on heads/head_dim or k != v"
        )


def check_offsets_layout(name: str, offsets: torch.Tensor) -> None:
    """Refuses (ValueError) offsets that are not a 1-D int64 tensor of batch + 1 entries. No sync."""
    if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(
            f"{name} must be a 1-D int64 tensor of batch+1 offsets; "
            f"got dtype {offsets.dtype}, shape {tuple(offsets.shape)}"
        )


def check_offsets_values(name: str, offsets: torch.Tensor, total: int) -> bool:
    """Refuses (ValueError) offsets that do not start at 0, end at `total` and never decrease;
    returns True. Reads values from the device (host synchronization)."""
    if int(offsets[0]) != 0 or int(offsets[-1]) != total:
        raise ValueError(
            f"{name} must start at 0 and end at the number of tokens "
            f"({total}); got {int(offsets[0])}..{int(offsets[-1])}"
        )
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing")
    return True
