"""MX element formats (OCP Microscaling Formats v1.0) and the E8M0 scale.

Each element format is described by its bit layout; codes are stored one per byte
(uint8). FP8 codes are the bit patterns of torch.float8_e4m3fn / float8_e5m2, FP6 and
FP4 codes sit in the low bits, and INT8 is the two's complement byte of n, whose value
is n * 2^-6 (MXINT8: n in [-127, 127]; -128 is never produced).

Decoding is exhaustive-table based (at most 256 codes per format), so it is exact by
construction and serves as the ground truth for the encoder in mxlab.numerics.reference.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache

import torch

E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_EXP_MIN = -127
SCALE_EXP_MAX = 127


def float32_fraction_bits(value: float) -> int:
    """The 23-bit fraction field of a positive float32 normal value (an int)."""
    return struct.unpack("<I", struct.pack("<f", value))[0] & 0x7FFFFF


@dataclass(frozen=True)
class ElementFormat:
    """Bit layout and range of one MX element format.

    `emin` is the exponent of the smallest normal; the quantum of the subnormal range is
    2^(emin - mbits). For INT8, mbits = 6 and emin = emax = 0 (values n * 2^-6).
    """

    name: str
    bits: int
    ebits: int
    mbits: int
    bias: int
    emax: int
    max_code: int  # largest magnitude code that is a finite value
    has_inf: bool
    has_nan: bool
    is_int: bool = False

    @property
    def emin(self) -> int:
        return 0 if self.is_int else 1 - self.bias

    @property
    def max_normal(self) -> float:
        return decode_magnitude(self, self.max_code)

    @property
    def min_normal(self) -> float:
        return 2.0**-self.mbits if self.is_int else 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)


FORMATS: dict[str, ElementFormat] = {
    "e4m3": ElementFormat("e4m3", 8, 4, 3, 7, 8, 0x7E, has_inf=False, has_nan=True),
    "e5m2": ElementFormat("e5m2", 8, 5, 2, 15, 15, 0x7B, has_inf=True, has_nan=True),
    "e3m2": ElementFormat("e3m2", 6, 3, 2, 3, 4, 0x1F, has_inf=False, has_nan=False),
    "e2m3": ElementFormat("e2m3", 6, 2, 3, 1, 2, 0x1F, has_inf=False, has_nan=False),
    "e2m1": ElementFormat("e2m1", 4, 2, 1, 1, 2, 0x7, has_inf=False, has_nan=False),
    "int8": ElementFormat("int8", 8, 0, 6, 0, 0, 127, has_inf=False, has_nan=False, is_int=True),
}


def get_format(name: str) -> ElementFormat:
    """Return the element format called `name`; a ValueError lists the accepted names."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown MX element format {name!r}; accepted: {', '.join(FORMATS)}") from None


def decode_magnitude(fmt: ElementFormat, code: int) -> float:
    """Value of a non-negative magnitude code (sign bit clear) as a Python float; NaN/Inf where the format says."""
    if fmt.is_int:
        return code * 2.0**-fmt.mbits
    exponent_field = code >> fmt.mbits
    fraction = code & ((1 << fmt.mbits) - 1)
    if fmt.name == "e4m3" and code == 0x7F:
        return float("nan")
    if fmt.name == "e5m2" and exponent_field == 0x1F:
        return float("inf") if fraction == 0 else float("nan")
    if exponent_field == 0:
        return fraction * 2.0 ** (fmt.emin - fmt.mbits)
    return (1 + fraction / (1 << fmt.mbits)) * 2.0 ** (exponent_field - fmt.bias)


def decode_code(fmt: ElementFormat, code: int) -> float:
    """Value of one element code (any of the 2^bits codes) as a Python float."""
    if fmt.is_int:
        signed = code - 256 if code >= 128 else code
        return signed * 2.0**-fmt.mbits
    magnitude = decode_magnitude(fmt, code & (fmt.sign_bit - 1))
    return -magnitude if code & fmt.sign_bit else magnitude


@cache
def _decode_table_cpu(name: str) -> torch.Tensor:
    fmt = FORMATS[name]
    table = torch.full((256,), float("nan"), dtype=torch.float32)
    for code in range(1 << fmt.bits):
        table[code] = decode_code(fmt, code)
    return table


def decode_table(fmt: ElementFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """Float32 table of 256 entries: the value of every code (codes past 2^bits are NaN)."""
    return _decode_table_cpu(fmt.name).to(device)


def decode_codes(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Element values (float32) of a uint8 code tensor; refuses non-uint8 input."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8, got {codes.dtype}")
    return decode_table(fmt, codes.device)[codes.long()]


def decode_scales(scales: torch.Tensor) -> torch.Tensor:
    """Float32 value 2^(byte - 127) of each E8M0 byte; 0xFF decodes to NaN."""
    if scales.dtype != torch.uint8:
        raise ValueError(f"E8M0 scales must be uint8, got {scales.dtype}")
    exponent = scales.to(torch.int32) - E8M0_BIAS
    values = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)
    return torch.where(scales == E8M0_NAN, torch.full_like(values, float("nan")), values)


def format_table() -> str:
    """A plain-text table of every element format and of E8M0 (used by `mxlab formats`)."""
    header = (
        f"{'format':7} {'bits':>4} {'emax':>5} {'max normal':>12} {'min normal':>12} {'min subnormal':>14}  inf/nan"
    )
    rows = [header, "-" * len(header)]
    for fmt in FORMATS.values():
        special = f"{'inf' if fmt.has_inf else '-'}/{'nan' if fmt.has_nan else '-'}"
        rows.append(
            f"{fmt.name:7} {fmt.bits:>4} {fmt.emax:>5} {fmt.max_normal:>12.6g} {fmt.min_normal:>12.6g} "
            f"{fmt.min_subnormal:>14.6g}  {special}"
        )
    rows.append(
        f"{'e8m0':7} {8:>4} {SCALE_EXP_MAX:>5} {2.0**SCALE_EXP_MAX:>12.6g} {2.0**SCALE_EXP_MIN:>12.6g} "
        f"{'-':>14}  -/nan (scale byte 0xFF; one per 32-element block)"
    )
    return "\n".join(rows)
