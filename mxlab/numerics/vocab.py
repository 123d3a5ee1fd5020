"""The closed vocabularies of the MX numerics as str-valued enums, and the packed kernel code: the one place
where the Triton kernels (the casts in mxlab.kernels.cast, the register tiles of mxlab.kernels._mx_device)
read the id of a scale mode, rounding, layout or element format.

Members are strings (`ScaleMode.RCEIL == "rceil"`), so string arguments and TOML recipes keep working;
`ScaleMode("rceil")` looks one up and an unknown value raises ValueError naming it and the accepted ones.

A kernel code packs one operand's numerics into one int (a kernel constexpr; `kernel_code`); the fields, by
first bit and width (`CODE_FIELDS`):

    bits  0-3   scale mode id (16 modes)        bits 17-20  emax
    bits  4-7   rounding id (16 roundings)      bit  21     is_int
    bit   8     hw_fp8 (the GPU's FP8 cvt)      bits 22-25  element bits
    bits  9-11  mbits                           bits 26-33  max code (largest finite magnitude code)
    bits 12-16  emin + 16                       bits 34-40  mmax >> 16 (max normal's 23-bit fraction, top 7 bits)

`code_field(code, name)` reads a field back, and the derived "mmax" and "nmax" (the max normal in units of
its quantum); the kernels call it at compile time (`triton.constexpr_function`).
"""

from __future__ import annotations

import functools
from enum import Enum

from mxlab.numerics.formats import FORMATS, ElementFormat, float32_fraction_bits


class Vocabulary(str, Enum):
    """A str-valued enum whose members carry `kernel_id`; subclasses name their vocabulary (`what`) for the
    ValueError that an unknown value raises."""

    kernel_id: int

    def __new__(cls, value: str, kernel_id: int):
        member = str.__new__(cls, value)
        member._value_ = value
        member.kernel_id = kernel_id
        return member

    def __init_subclass__(cls, what: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        cls._what = what

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def check(cls, value: object) -> None:
        """Refuses (ValueError naming it and the accepted ones) a value that is no member's; cheap for members."""
        try:
            if value in cls._value2member_map_:
                return
        except TypeError:  # unhashable
            pass
        cls(value)

    @classmethod
    def _missing_(cls, value: object):
        raise ValueError(f"unknown {cls._what} {value!r}; accepted: {', '.join(cls)}")


class ScaleMode(Vocabulary, what="scale_mode"):
    """How a block's E8M0 exponent rounds log2(amax / max normal) (docs/numerics.md)."""

    FLOOR = "floor", 0
    CEIL = "ceil", 1
    RCEIL = "rceil", 2
    EVEN = "even", 3


class Rounding(Vocabulary, what="rounding"):
    """How an element rounds to its format."""

    NEAREST_EVEN = "nearest_even", 0
    NEAREST_AWAY = "nearest_away", 1
    TOWARD_ZERO = "toward_zero", 2
    STOCHASTIC = "stochastic", 3


class Layout(Vocabulary, what="layout"):
    """Where a cast's blocks run in the (A, L, B) view of x: along B (row), along L (column), both from one
    read, or (32, 32) tiles."""

    ROW = "row", 0
    COLUMN = "column", 1
    BOTH = "both", 2
    TILE = "tile", 3


# name -> (first bit, width, offset added before packing)
CODE_FIELDS = {
    "scale_mode": (0, 4, 0),
    "rounding": (4, 4, 0),
    "hw_fp8": (8, 1, 0),
    "mbits": (9, 3, 0),
    "emin": (12, 5, 16),
    "emax": (17, 4, 0),
    "is_int": (21, 1, 0),
    "bits": (22, 4, 0),
    "max_code": (26, 8, 0),
    "mmax_top": (34, 7, 0),
}


def pack_code(**fields: int) -> int:
    """The kernel code of these CODE_FIELDS values (absent ones 0); refuses a value that does not fit."""
    code = 0
    for name, value in fields.items():
        first, width, offset = CODE_FIELDS[name]
        stored = int(value) + offset
        if not 0 <= stored < 1 << width:
            raise ValueError(f"{name} = {value} does not fit the kernel code's {width}-bit field")
        code |= stored << first
    return code


def code_field(code: int, name: str):
    """A field of a kernel code (CODE_FIELDS, or "mmax", "nmax"); is_int and hw_fp8 as bools. Calls no other
    function: Triton compiles it as a constexpr function (`mxlab.kernels.cast.bits.code_field`)."""
    if name == "mmax" or name == "nmax":
        first, width, _ = CODE_FIELDS["mmax_top"]
        mmax = ((code >> first) & ((1 << width) - 1)) << 16
        if name == "mmax":
            return mmax
        first, width, _ = CODE_FIELDS["mbits"]
        mbits = (code >> first) & ((1 << width) - 1)
        return (mmax >> (23 - mbits)) | (1 << mbits)
    first, width, offset = CODE_FIELDS[name]
    value = ((code >> first) & ((1 << width) - 1)) - offset
    return bool(value) if name == "is_int" or name == "hw_fp8" else value


@functools.cache
def format_code(fmt: ElementFormat) -> int:
    """The format fields of a kernel code; refuses a format that does not fit them."""
    mmax = float32_fraction_bits(fmt.max_normal)
    code = pack_code(
        mbits=fmt.mbits,
        emin=fmt.emin,
        emax=fmt.emax,
        is_int=fmt.is_int,
        bits=fmt.bits,
        max_code=fmt.max_code,
        mmax_top=mmax >> 16,
    )
    nmax = fmt.max_normal / 2.0 ** (fmt.emax - fmt.mbits)
    if mmax & 0xFFFF or code_field(code, "nmax") != nmax:
        raise ValueError(f"format {fmt.name} does not fit the kernel code")
    return code


class Element(Vocabulary, what="MX element format"):
    """The MX element formats (mxlab.numerics.formats.FORMATS); a member's kernel id is its packed format
    fields (`format_code`), `.format` its ElementFormat."""

    E4M3 = "e4m3", format_code(FORMATS["e4m3"])
    E5M2 = "e5m2", format_code(FORMATS["e5m2"])
    E3M2 = "e3m2", format_code(FORMATS["e3m2"])
    E2M3 = "e2m3", format_code(FORMATS["e2m3"])
    E2M1 = "e2m1", format_code(FORMATS["e2m1"])
    INT8 = "int8", format_code(FORMATS["int8"])

    @property
    def format(self) -> ElementFormat:
        return FORMATS[self.value]


@functools.lru_cache(maxsize=512)
def kernel_code(fmt: ElementFormat, scale_mode: str, rounding: str, hw_fp8: bool = False) -> int:
    """The kernel code of a format, scale mode and rounding (`hw_fp8`: convert with the GPU's FP8 instructions;
    the caller decides where that applies). Refuses unknown modes and formats that do not fit."""
    fields = pack_code(scale_mode=ScaleMode(scale_mode).kernel_id, rounding=Rounding(rounding).kernel_id, hw_fp8=hw_fp8)
    return fields | format_code(fmt)
