"""The public entry points of jagged attention in Triton: input checks, then the autograd function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mxlab.kernels.attention.autograd import _JaggedAttentionFunction
from mxlab.kernels.attention.codes import _codes, _head_dim_casts, _seed_keys, _stochastic, unsupported_reason
from mxlab.kernels.attention.tiles import TileSizes, _cached_on_offsets, default_tiles, mx_tiles_problem
from mxlab.numerics.jagged_checks import check_attention_inputs, check_offsets_layout, check_offsets_values


@dataclass(frozen=True)
class AttentionLaunch:
    """Launch options of jagged attention besides its numerics (private: tests and benchmarks set them).

    `tiles`: the kernels' tile sizes (None: `default_tiles`); `hw_fp8=False` takes the software steps (in the
    element's units) where the hardware FP8 conversion would run. Neither changes the semantics; `hw_fp8` never
    changes the bits, `tiles` only the order of float32 accumulation.
    """

    tiles: TileSizes | None = None
    hw_fp8: bool = True

    def __post_init__(self) -> None:
        if self.tiles is not None and not isinstance(self.tiles, TileSizes):
            raise ValueError(f"AttentionLaunch.tiles = {self.tiles!r}; accepted: None or a TileSizes")


DEFAULT_LAUNCH = AttentionLaunch()


def _check_offsets(name: str, offsets: torch.Tensor, total: int, device: torch.device) -> None:
    check_offsets_layout(name, offsets)
    if offsets.device != device:
        raise ValueError(f"{name} is on {offsets.device}, the tensors on {device}; put them on one device")
    # The value checks synchronize with the device: done once per offsets tensor and version.
    _cached_on_offsets(offsets, ("checked", total), None, lambda: check_offsets_values(name, offsets, total))


def check_jagged_offsets(
    q_offsets: torch.Tensor, k_offsets: torch.Tensor, total_q: int, total_k: int, device: torch.device, causal: bool
) -> None:
    """Refuses (ValueError) offsets that are not int64 batch+1 runs on `device` from 0 to the token
    counts, of different batch sizes, or (causal) not equal. The value checks read the device (a host
    sync), so they run once per offsets tensor and version (cached on the tensors)."""
    _check_offsets("q_offsets", q_offsets, total_q, device)
    _check_offsets("k_offsets", k_offsets, total_k, device)
    if q_offsets.numel() != k_offsets.numel():
        raise ValueError(
            f"q_offsets ({q_offsets.numel()}) and k_offsets ({k_offsets.numel()}) describe different batch sizes"
        )
    if causal and not (
        q_offsets is k_offsets
        or _cached_on_offsets(q_offsets, ("equal",), k_offsets, lambda: torch.equal(q_offsets, k_offsets))
    ):
        raise ValueError("causal attention needs as many queries as keys in every example")


def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    k_offsets: torch.Tensor,
    *,
    causal: bool = False,
    activation: str = "softmax",
    policy: Any = None,
    seeds: Sequence[Sequence[int]] | None = None,
    _launch: AttentionLaunch = DEFAULT_LAUNCH,
) -> torch.Tensor:
    """Attention over packed jagged sequences in Triton; returns (total_q, heads, head_dim) in q's dtype.

    Differentiable with respect to q, k, v. ``policy`` is None (BF16 mode) or an attention policy
    with ``qk`` and ``pv`` MatmulPrecisions (MX mode, see the package docstring). ``seeds`` (needed when an
    operand rounds stochastically): (qk seeds, pv seeds), each one seed per
    mxlab.numerics.seeding.SEED_SLOTS slot, as the products' ``next_call_seeds()`` give them; the kernel
    never advances a policy's call counter (mxlab.nn.attention.JaggedAttention does). Refuses
    (ValueError) what `unsupported_reason` names, mismatched shapes, devices or offsets,
    ``causal=True`` when an example has a different number of queries and keys, and missing seeds.
    """
    check_attention_inputs(q, k, v, activation)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    reason = unsupported_reason(q, policy, activation)
    if reason is not None:
        raise ValueError(reason)
    check_jagged_offsets(q_offsets, k_offsets, q.shape[0], k.shape[0], q.device, causal)
    return jagged_attention_checked(
        q, k, v, q_offsets, k_offsets, causal=causal, activation=activation, policy=policy, seeds=seeds, _launch=_launch
    )


def jagged_attention_checked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    k_offsets: torch.Tensor,
    *,
    causal: bool,
    activation: str,
    policy: Any,
    seeds: Sequence[Sequence[int]] | None = None,
    _launch: AttentionLaunch = DEFAULT_LAUNCH,
) -> torch.Tensor:
    """`jagged_attention` for inputs a caller has already validated (shapes, dtypes, offsets,
    activation, and `unsupported_reason` is None): skips the offset checks, which cost host syncs.
    mxlab.nn.attention.JaggedAttention validates once and calls this. Refuses missing seeds and tile sizes that
    MX mode cannot take (`tiles.mx_tiles_problem`)."""
    codes = _codes(policy, q.device if _launch.hw_fp8 else None)
    tiles = _launch.tiles if _launch.tiles is not None else default_tiles(codes is not None, q.device)
    problem = None if codes is None else mx_tiles_problem(tiles, activation == "softmax")
    if problem is not None:
        raise ValueError(problem)
    seed_keys = _seed_keys(seeds, codes)
    scores_stochastic = codes is not None and any(
        _stochastic(code) for code in (codes.p_n, codes.p_m, codes.ds_n, codes.ds_m)
    )
    if scores_stochastic and q.shape[0] * q.shape[1] >= 1 << 32:
        raise ValueError(
            f"stochastic rounding of P or dS counts query rows x heads in 32 bits; got {q.shape[0]} x {q.shape[1]}"
        )
    casts = _head_dim_casts(policy, seeds, _launch.hw_fp8)
    return _JaggedAttentionFunction.apply(
        q, k, v, q_offsets, k_offsets, causal, activation == "silu", codes, seed_keys, casts, tiles
    )
