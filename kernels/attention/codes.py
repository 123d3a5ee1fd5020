"""Operand codes and seed keys of a jagged attention call: the packed constexpr of each of the twelve quantized
operands (format, scale mode, rounding, hardware FP8 switch), the seed key of each stochastic one, the cast-kernel
quantization of the operands quantized along the head dim alone, and why a policy cannot run in the kernels."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

import torch

from mxlab.kernels._mx_device import operand_code
from mxlab.kernels.cast import CastLaunch, hardware_fp8_applies
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.jagged_checks import ACTIVATIONS
from mxlab.numerics.seeding import SEED_SLOTS, seed_key
from mxlab.numerics.vocab import Rounding, code_field


@dataclass(frozen=True)
class _OperandCodes:
    """Packed operand codes of the 12 quantized operands (None: BF16 mode)."""

    q_d: int
    k_d: int
    p_n: int
    v_n: int
    do_d: int
    v_d: int
    p_m: int
    do_m: int
    ds_n: int
    k_n: int
    q_m: int
    ds_m: int


@dataclass(frozen=True)
class _SeedKeys:
    """mix32 of the per-call stochastic-rounding seed of each operand the attention kernels quantize, as signed
    int32 (0 where an operand does not round stochastically). The operands along the head dim have none: the
    cast kernels quantize them (`_HeadDimCasts`)."""

    p_n: int = 0
    v_n: int = 0
    p_m: int = 0
    do_m: int = 0
    ds_n: int = 0
    k_n: int = 0
    q_m: int = 0
    ds_m: int = 0


_NO_SEEDS = _SeedKeys()
_SEED_KEY_NAMES = frozenset(field.name for field in fields(_SeedKeys))


def _stochastic(code: int) -> bool:
    return code_field(code, "rounding") == Rounding.STOCHASTIC.kernel_id


def _hardware_fp8(code: int) -> bool:
    """Whether an operand code converts with the GPU's FP8 instructions (its HW_FP8 bit, see `operand_code`)."""
    return code_field(code, "hw_fp8")


# qmatmul's seed slot of each operand: fwd.a, fwd.b, grad_a.g, grad_a.b, grad_b.a, grad_b.g are Q, K, dS (along keys),
# K (along keys), Q (along queries), dS (along queries) for qk and P, V, dO, V (along the head dim), P (along
# queries), dO (along queries) for pv (docs/numerics.md, "Jagged attention").
_OPERAND_SLOTS = {
    "q_d": (0, "fwd.a"),
    "k_d": (0, "fwd.b"),
    "ds_n": (0, "grad_a.g"),
    "k_n": (0, "grad_a.b"),
    "q_m": (0, "grad_b.a"),
    "ds_m": (0, "grad_b.g"),
    "p_n": (1, "fwd.a"),
    "v_n": (1, "fwd.b"),
    "do_d": (1, "grad_a.g"),
    "v_d": (1, "grad_a.b"),
    "p_m": (1, "grad_b.a"),
    "do_m": (1, "grad_b.g"),
}


def _operand_quant(policy: Any, name: str) -> tuple[Any, str]:
    """The policy's OperandQuant of one of the 12 operands and its path in words (e.g. `qk.fwd.a`): the operand
    at that seed slot, where the gradient (`g`) is grad_a's a and grad_b's b."""
    product, slot = _OPERAND_SLOTS[name]
    gemm, side = slot.split(".")
    side = {"grad_a": "a", "grad_b": "b"}[gemm] if side == "g" else side
    where = f"{('qk', 'pv')[product]}.{gemm}.{side}"
    return getattr(getattr((policy.qk, policy.pv)[product], gemm), side), where


def rounds_stochastically(codes: _OperandCodes | None) -> bool:
    """Whether any operand of these codes rounds stochastically (False for BF16 mode)."""
    return codes is not None and any(_stochastic(code) for code in vars(codes).values())


def _seed_keys(seeds: Sequence[Sequence[int]] | None, codes: _OperandCodes | None) -> _SeedKeys:
    """The seed keys of one attention call from `seeds` = (qk seeds, pv seeds), each one seed per
    mxlab.numerics.seeding.SEED_SLOTS slot (a MatmulPrecision's `next_call_seeds()`). Refuses (ValueError)
    missing or short seeds when an operand rounds stochastically."""
    if not rounds_stochastically(codes):
        return _NO_SEEDS
    if seeds is None or len(seeds) != 2 or any(product is None or len(product) != len(SEED_SLOTS) for product in seeds):
        raise ValueError(
            "stochastic rounding in attention needs seeds=(qk seeds, pv seeds), each one seed per "
            f"SEED_SLOTS slot ({len(SEED_SLOTS)}); got {seeds!r}"
        )
    return _SeedKeys(
        **{
            name: seed_key(seeds[product][SEED_SLOTS[slot]]) if _stochastic(getattr(codes, name)) else 0
            for name, (product, slot) in _OPERAND_SLOTS.items()
            if name in _SEED_KEY_NAMES
        }
    )


@dataclass(frozen=True)
class _RowCast:
    """One operand's quantization along the head dim as `mxlab.kernels.cast.fake_quantize` takes it: format,
    scale mode, rounding, and its seed (None unless it rounds stochastically)."""

    fmt: Any
    scale_mode: str
    rounding: str
    seed: int | None


@dataclass(frozen=True)
class _HeadDimCasts:
    """The operands' quantization along the head dim (Q, K, V, dO), which the cast kernels' row fake-quantize
    computes (`launch._head_dim_quantized`), and the cast launch options."""

    q_d: _RowCast
    k_d: _RowCast
    v_d: _RowCast
    do_d: _RowCast
    launch: CastLaunch


def _head_dim_casts(policy: Any, seeds: Sequence[Sequence[int]] | None, hw_fp8: bool) -> _HeadDimCasts | None:
    """The head-dim-only operands of a policy that `_codes` accepts; None for policy None. `seeds` as
    `_seed_keys` takes them (checked there); `hw_fp8=False` keeps the cast kernels' integer steps."""
    if policy is None:
        return None

    def row_cast(name: str) -> _RowCast:
        quant, _ = _operand_quant(policy, name)
        product, slot = _OPERAND_SLOTS[name]
        seed = seeds[product][SEED_SLOTS[slot]] if quant.rounding == "stochastic" else None
        return _RowCast(FORMATS[quant.fmt], quant.scale_mode, quant.rounding, seed)

    return _HeadDimCasts(row_cast("q_d"), row_cast("k_d"), row_cast("v_d"), row_cast("do_d"), CastLaunch(hw_fp8=hw_fp8))


def _operand(quant: Any, where: str, device: torch.device | None) -> int:
    if quant.fmt not in FORMATS:
        raise ValueError(
            f"{where}: operand format {quant.fmt!r} is not an MX format; the kernel quantizes every operand in MX mode"
        )
    if quant.block != 32:
        raise ValueError(f"{where}: block {quant.block!r} is not supported by the kernel; accepted: 32")
    hw_fp8 = device is not None and hardware_fp8_applies(device, FORMATS[quant.fmt], quant.rounding)
    return operand_code(quant.fmt, quant.scale_mode, quant.rounding, hw_fp8=hw_fp8)


def _codes(policy: Any, device: torch.device | None = None) -> _OperandCodes | None:
    """Operand codes of an attention policy; None for policy None. ValueError if unsupported.
    With `device`, operands convert with the hardware FP8 instructions where
    `mxlab.kernels.cast.hardware_fp8_applies` holds for it (None: the software steps everywhere). Cached by the
    policy's GEMM specs (frozen), so a call pays one lookup."""
    if policy is None:
        return None
    qk, pv = getattr(policy, "qk", None), getattr(policy, "pv", None)
    if qk is None or pv is None:
        raise ValueError(
            "the kernel needs both attention products quantized (policy.qk and policy.pv set) or policy None"
        )
    products = tuple((p.fwd, p.grad_a, p.grad_b, getattr(p, "grad_scale", None) is not None) for p in (qk, pv))
    return _codes_of(products, device, os.environ.get("TRITON_INTERPRET") == "1")


@functools.lru_cache(maxsize=256)
def _codes_of(products: tuple, device: torch.device | None, interpreted: bool) -> _OperandCodes:
    """`_codes` of the policy whose qk and pv products are (fwd, grad_a, grad_b, grad_scale set); `interpreted`
    (TRITON_INTERPRET=1, which `hardware_fp8_applies` reads) is part of the cache key."""
    for name, (fwd, grad_a, grad_b, scaled) in zip(("qk", "pv"), products):
        if scaled:
            raise ValueError(
                f"policy.{name}.grad_scale is set; per-layer gradient scaling is not supported by the kernel"
            )
        for gemm_name, gemm in (("fwd", fwd), ("grad_a", grad_a), ("grad_b", grad_b)):
            if gemm.hadamard is not None:
                raise ValueError(f"policy.{name}.{gemm_name} uses a Hadamard transform; not supported by the kernel")
    policy = SimpleNamespace(
        **{
            name: SimpleNamespace(fwd=fwd, grad_a=grad_a, grad_b=grad_b)
            for name, (fwd, grad_a, grad_b, _) in zip(("qk", "pv"), products)
        }
    )
    return _OperandCodes(**{name: _operand(*_operand_quant(policy, name), device) for name in _OPERAND_SLOTS})


def unsupported_reason(q: torch.Tensor, policy: Any, activation: str = "softmax") -> str | None:
    """Why `jagged_attention` cannot run these inputs (a sentence), or None when it can."""
    if activation not in ACTIVATIONS:
        return f"unknown attention activation {activation!r}; accepted: {', '.join(ACTIVATIONS)}"
    accepted = (torch.bfloat16, torch.float16) if policy is None else (torch.bfloat16, torch.float16, torch.float32)
    if q.dtype not in accepted:
        which = "without" if policy is None else "with"
        return f"dtype {q.dtype} is not supported {which} a policy; accepted: {', '.join(map(str, accepted))}"
    head_dim = q.shape[-1] if q.dim() == 3 else 0
    minimum = 32 if policy is not None else 16
    if head_dim < minimum or head_dim > 256 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not supported; accepted: powers of two from {minimum} to 256"
    try:
        _codes(policy)
    except ValueError as error:
        return str(error)
    return None
