"""A slow, independent oracle for MX quantization, written from the OCP MX v1.0 definitions.

It shares no code with mxlab.numerics.reference: scales come from exact rational arithmetic and the
element value is chosen among all representable values of the format by brute force.
"""

from __future__ import annotations

import math
from fractions import Fraction

from mxlab.numerics.formats import ElementFormat, decode_code


def finite_grid(fmt: ElementFormat) -> list[Fraction]:
    """All finite non-negative element values, sorted."""
    values = set()
    for code in range(1 << fmt.bits):
        value = decode_code(fmt, code)
        if math.isfinite(value) and value >= 0:
            values.add(Fraction(value))
    return sorted(values)


def oracle_scale_exponent(amax: float, fmt: ElementFormat, scale_mode: str) -> int:
    """Unbiased E8M0 exponent for a finite block amax."""
    if amax == 0:
        return -127
    a = Fraction(amax)
    floor_log2 = math.floor(math.log2(amax))
    while Fraction(2) ** floor_log2 > a:
        floor_log2 -= 1
    while Fraction(2) ** (floor_log2 + 1) <= a:
        floor_log2 += 1
    if scale_mode == "floor":
        s = floor_log2 - fmt.emax
    elif scale_mode == "ceil":
        s = (floor_log2 if a == Fraction(2) ** floor_log2 else floor_log2 + 1) - fmt.emax
    elif scale_mode == "rceil":
        s = floor_log2 - fmt.emax - 2
        while a / Fraction(2) ** s > Fraction(fmt.max_normal):
            s += 1
    elif scale_mode == "even":
        significand = a / Fraction(2) ** floor_log2  # in [1, 2)
        step = Fraction(1, 2**fmt.mbits)
        units = significand / step
        low = math.floor(units)
        rest = units - low
        rounded = low + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and low % 2 == 1) else 0)
        s = floor_log2 + (1 if rounded * step >= 2 else 0) - fmt.emax
    else:
        raise ValueError(scale_mode)
    return max(-127, min(127, s))


def oracle_round(value: float, scale_exp: int, fmt: ElementFormat, rounding: str) -> float:
    """The dequantized value of one element under a nearest or toward-zero rounding mode."""
    grid = finite_grid(fmt)
    scale = Fraction(2) ** scale_exp
    magnitude = abs(Fraction(value)) / scale
    if magnitude >= grid[-1]:
        chosen = grid[-1]
    else:
        upper_index = next(i for i, g in enumerate(grid) if g >= magnitude)
        upper = grid[upper_index]
        lower = grid[upper_index - 1] if upper != magnitude else upper
        if rounding == "toward_zero":
            chosen = lower
        else:
            if magnitude - lower != upper - magnitude:
                chosen = lower if magnitude - lower < upper - magnitude else upper
            elif rounding == "nearest_away":
                chosen = upper
            else:  # ties to the even neighbour: the one whose last significand bit is 0
                steps = [g / _quantum(g, fmt) for g in (lower, upper)]
                chosen = lower if steps[0] % 2 == 0 else upper
    result = float(chosen * scale)
    if fmt.is_int and chosen == 0:
        return 0.0
    return -result if math.copysign(1.0, value) < 0 else result


def _quantum(value: Fraction, fmt: ElementFormat) -> Fraction:
    if fmt.is_int or value == 0:
        return Fraction(1, 2**fmt.mbits) if fmt.is_int else Fraction(1)
    exponent = max(math.floor(math.log2(value)), fmt.emin)
    return Fraction(2) ** (exponent - fmt.mbits)
