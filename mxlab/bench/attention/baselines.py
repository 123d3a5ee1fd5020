"""The baselines of `mxlab bench attention` on one shape: FlexAttention with a document mask over the packed
tokens, and padded SDPA with a key mask."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from mxlab.bench.attention.shapes import padded, padding_slots


def flex_document_mask(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lengths: torch.Tensor,
    q_offsets: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    causal: bool,
    compiled_flex: Callable[..., torch.Tensor],
) -> Callable[[], torch.Tensor]:
    """The forward of FlexAttention over the packed tokens as one batch entry, a document mask keeping each
    query to its own sequence's keys (and, causal, the earlier ones). Builds the block mask now."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = q.device
    total = int(offsets[-1])
    q_doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), q_lengths)
    k_doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    k_pos = torch.arange(total, device=device) - offsets[:-1][k_doc]
    q_pos = torch.arange(q.shape[0], device=device) - q_offsets[:-1][q_doc]

    def document_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        same = q_doc[q_idx] == k_doc[kv_idx]
        if causal:
            same = same & (k_pos[kv_idx] <= q_pos[q_idx])
        return same

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block_mask = create_block_mask(document_mask, None, None, q.shape[0], total, device=device, _compile=True)

    def flex() -> torch.Tensor:
        out = compiled_flex(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=block_mask
        )
        return out[0].transpose(0, 1)

    return flex


def padded_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lengths: torch.Tensor, lengths: torch.Tensor, causal: bool
) -> Callable[[], torch.Tensor]:
    """The forward of SDPA on zero-padded (batch, heads, width, head_dim) copies, with the key mask as an additive
    BF16 bias (SDPA picks its cuDNN kernel for it), unpadded back to the packed queries."""
    import torch.nn.functional as F

    device = q.device
    q_width, max_length, batch = int(q_lengths.max()), int(lengths.max()), lengths.numel()
    q_slots, k_slots = padding_slots(q_lengths, q_width), padding_slots(lengths, max_length)
    key_mask = (torch.arange(max_length, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    if causal:
        key_mask = key_mask & torch.ones(q_width, max_length, dtype=torch.bool, device=device).tril()[None, None]
    bias = torch.zeros(key_mask.shape, device=device, dtype=q.dtype).masked_fill(~key_mask, float("-inf"))

    def step() -> torch.Tensor:
        qp = padded(q, q_slots, batch, q_width)
        kp, vp = padded(k, k_slots, batch, max_length), padded(v, k_slots, batch, max_length)
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias)
        return out.transpose(1, 2).reshape(batch * q_width, *out.shape[1:2], out.shape[-1]).index_select(0, q_slots)

    return step
