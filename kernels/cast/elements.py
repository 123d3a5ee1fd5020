"""Element quantization of the MX cast kernels: the exact integer steps, the fast paths (nearest even,
stochastic by one addition, the hardware FP8 conversion) and their per-tile choice (docs/numerics.md)."""

from __future__ import annotations

import triton
import triton.language as tl

from mxlab.kernels.cast.bits import (
    F32_NAN_BITS,
    KIND_BF16,
    KIND_FP16,
    PATH_FINITE,
    PATH_NORMAL_STOCHASTIC,
    ROUND_NEAREST_AWAY,
    ROUND_NEAREST_EVEN,
    ROUND_STOCHASTIC,
    ROUND_TOWARD_ZERO,
    _encode_f32,
    _f32_bits_to_output,
    _floor_log2,
    code_field,
)


# ----------------------------------------------------------------------------- elements
@triton.jit
def _quantize_exact(bits, s, r24, CODE: tl.constexpr):
    """(codes, float32 bits of the dequantized value) by the integer algorithm, for finite blocks (CODE: the
    kernel code, `mxlab.numerics.vocab.kernel_code`)."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    NMAX: tl.constexpr = code_field(CODE, "nmax")
    IS_INT: tl.constexpr = code_field(CODE, "is_int")
    ROUNDING: tl.constexpr = code_field(CODE, "rounding")
    negative = bits < 0
    magnitude = bits & 0x7FFFFFFF
    exponent = magnitude >> 23
    fraction = magnitude & 0x7FFFFF
    is_normal = exponent > 0
    significand = tl.where(is_normal, fraction | 0x800000, fraction)
    significand_exp = tl.where(is_normal, exponent - 150, -149)
    log2_floor = tl.where(is_normal, exponent - 127, _floor_log2(fraction) - 149)
    if IS_INT:
        quantum_exp = s - MBITS
    else:
        quantum_exp = tl.maximum(log2_floor, s + EMIN) - MBITS
    # shift >= 5 for every input and format (docs/numerics.md), so no left shift is needed
    shift = quantum_exp - significand_exp
    sh = tl.minimum(shift, 25)
    quotient = significand >> sh
    remainder = significand & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    if ROUNDING == ROUND_NEAREST_EVEN:
        up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    elif ROUNDING == ROUND_NEAREST_AWAY:
        up = remainder >= half
    elif ROUNDING == ROUND_TOWARD_ZERO:
        up = remainder < 0
    else:
        tl.static_assert(ROUNDING == ROUND_STOCHASTIC, "a rounding without integer steps")
        odd = 2 * r24 + 1  # u = odd / 2^25
        near = odd < (remainder << (25 - sh))
        far = odd <= ((significand - 1) >> tl.minimum(shift - 25, 31))
        up = tl.where(shift <= 25, near, far)
    n = quotient + up.to(tl.int32)
    if IS_INT:
        n_out = tl.minimum(n, NMAX)
        code = tl.where(negative, (0 - n_out) & 0xFF, n_out)
        value = _encode_f32(n_out, quantum_exp) | ((negative & (n_out > 0)).to(tl.int32) << 31)
    else:
        MAXCODE: tl.constexpr = code_field(CODE, "max_code")
        magnitude_code = ((quantum_exp - s + MBITS - EMIN) << MBITS) + n
        saturated = magnitude_code > MAXCODE
        code = tl.minimum(magnitude_code, MAXCODE) | (negative.to(tl.int32) << (code_field(CODE, "bits") - 1))
        n_out = tl.where(saturated, NMAX, n)
        e_out = tl.where(saturated, s + EMAX - MBITS, quantum_exp)
        value = _encode_f32(n_out, e_out) | (negative.to(tl.int32) << 31)
    return code, value


@triton.jit
def _quantize_fast(bits, s, CODE: tl.constexpr):
    """(codes, float32 value bits) with round to nearest even, for blocks where `_fast_path_ok` holds."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    MAXCODE: tl.constexpr = code_field(CODE, "max_code")
    NMAX: tl.constexpr = code_field(CODE, "nmax")
    BITS: tl.constexpr = code_field(CODE, "bits")
    IS_INT: tl.constexpr = code_field(CODE, "is_int")
    magnitude = bits & 0x7FFFFFFF
    magic = (s + EMIN - MBITS + 150) << 23  # bits of 2^(qe + 23), qe the quantum of the lowest binade
    magic_f = magic.to(tl.float32, bitcast=True)
    sum_f = magnitude.to(tl.float32, bitcast=True) + magic_f
    n_low = sum_f.to(tl.int32, bitcast=True) - magic
    value_low = (sum_f - magic_f).to(tl.int32, bitcast=True)
    max_bits = ((s + EMAX + 127) << 23) | ((NMAX << (23 - MBITS)) & 0x7FFFFF)
    if IS_INT:
        n_out = tl.minimum(n_low, NMAX)
        code = tl.where(bits < 0, (0 - n_out) & 0xFF, n_out)
        value = tl.minimum(value_low, max_bits) | ((bits < 0) & (n_out > 0)).to(tl.int32) << 31
    else:
        K: tl.constexpr = 23 - MBITS
        rounded = magnitude + ((1 << (K - 1)) - 1) + ((magnitude >> K) & 1)
        is_element_normal = magnitude >= ((s + EMIN + 127) << 23)
        code_normal = (rounded >> K) - ((s + EMIN + 126) << MBITS)
        code = tl.minimum(tl.where(is_element_normal, code_normal, n_low), MAXCODE)
        code = code | ((bits >> (32 - BITS)) & (1 << (BITS - 1)))
        value_normal = tl.minimum(rounded & ~((1 << K) - 1), max_bits)
        value = tl.where(is_element_normal, value_normal, value_low) | (bits & -2147483648)
    return code, value


@triton.jit
def _quantize_fast_stochastic(bits, s, r24, CODE: tl.constexpr):
    """(codes, float32 value bits) with stochastic rounding, for blocks where `_fast_path_ok` holds.

    Integer only. With shift <= 24 the rule `(2r + 1) < rem << (25 - shift)` is `rem > r >> (24 - shift)`,
    so n = (significand + 2^shift - 1 - (r >> (24 - shift))) >> shift; element-normal values have
    shift = 23 - mbits. Values are rebuilt from n as float(n) * 2^qe by an exponent add (normal results).
    """
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    MAXCODE: tl.constexpr = code_field(CODE, "max_code")
    NMAX: tl.constexpr = code_field(CODE, "nmax")
    BITS: tl.constexpr = code_field(CODE, "bits")
    IS_INT: tl.constexpr = code_field(CODE, "is_int")
    magnitude = bits & 0x7FFFFFFF
    exponent = magnitude >> 23
    significand = (magnitude & 0x7FFFFF) | tl.where(exponent > 0, 0x800000, 0)
    lowest_quantum = s + EMIN - MBITS
    K: tl.constexpr = 23 - MBITS
    shift = tl.maximum(lowest_quantum + 150 - tl.maximum(exponent, 1), K)
    sh = tl.minimum(shift, 24)
    near = (significand + ((1 << sh) - 1) - (r24 >> (24 - sh))) >> sh
    far = ((2 * r24 + 1) <= ((significand - 1) >> tl.minimum(tl.maximum(shift - 25, 0), 31))).to(tl.int32)
    n = tl.where(shift <= 24, near, far)
    if IS_INT:
        n_out = tl.minimum(n, NMAX)
        code = tl.where(bits < 0, (0 - n_out) & 0xFF, n_out)
        value = n_out.to(tl.float32).to(tl.int32, bitcast=True) + (lowest_quantum << 23)
        value = tl.where(n_out == 0, 0, value) | ((bits < 0) & (n_out > 0)).to(tl.int32) << 31
    else:
        binade = tl.maximum(exponent - 127 - s - EMIN, 0)  # qe - lowest_quantum
        code = tl.minimum((binade << MBITS) + n, MAXCODE) | ((bits >> (32 - BITS)) & (1 << (BITS - 1)))
        max_bits = ((s + EMAX + 127) << 23) | ((NMAX << (23 - MBITS)) & 0x7FFFFF)
        value = n.to(tl.float32).to(tl.int32, bitcast=True) + ((lowest_quantum + binade) << 23)
        value = tl.where(n == 0, 0, tl.minimum(value, max_bits)) | (bits & -2147483648)
    return code, value


@triton.jit
def _stochastic_normal_elements(bits, s, r24, OUT_KIND: tl.constexpr, CODE: tl.constexpr):
    """(codes, values as bits of the output dtype) of `_quantize_fast_stochastic` for floating-point formats,
    where every element of the tile is zero or element-normal (|x| >= 2^(S + emin)) and no block is NaN/Inf (tile
    path 3 of `_stochastic_path`).

    Such an element has shift = 23 - mbits = K, and the low K bits of its float32 pattern are those of its
    significand, so adding the bias 2^K - 1 - (r >> (24 - K)) to the pattern carries into bit K exactly where
    `_quantize_fast_stochastic` rounds up; clearing the low K bits leaves the value n * 2^qe (a carry out of the
    fraction increments the exponent field: the next binade's first value). A zero stays zero (bias < 2^K).
    Saturation is the same min with the largest value; the code of a normal value is its exponent and top
    fraction bits less the scale's offset, 0 for zero. No per-element shift or int-to-float conversion."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    MAXCODE: tl.constexpr = code_field(CODE, "max_code")
    NMAX: tl.constexpr = code_field(CODE, "nmax")
    BITS: tl.constexpr = code_field(CODE, "bits")
    K: tl.constexpr = 23 - MBITS
    magnitude = bits & 0x7FFFFFFF
    rounded = magnitude + (((1 << K) - 1) - (r24 >> (24 - K)))
    max_bits = ((s + EMAX + 127) << 23) | ((NMAX << K) & 0x7FFFFF)
    value = tl.minimum(rounded & ~((1 << K) - 1), max_bits)
    code = tl.minimum(tl.maximum((value >> K) - ((s + EMIN + 126) << MBITS), 0), MAXCODE)
    code = code | ((bits >> (32 - BITS)) & (1 << (BITS - 1)))
    value = value | (bits & -2147483648)
    if OUT_KIND == KIND_BF16:
        out = (value >> 16).to(tl.int16)  # exact: at most 8 significant bits, normal or zero
    else:
        out = _f32_bits_to_output(value, OUT_KIND)
    return code, out


@triton.jit
def _element_units(bits, s):
    """Bits of |x| * 2^-S (float32 x as `bits`, S broadcast): exact unless below 2^-126, where every rounding
    of the element steps gives zero (docs/numerics.md, "Rounding in the element's units")."""
    return (bits.to(tl.float32, bitcast=True) * ((127 - s) << 23).to(tl.float32, bitcast=True)).to(
        tl.int32, bitcast=True
    ) & 0x7FFFFFFF


@triton.jit
def _from_element_units(element, s, special, bits):
    """float32 bits of element * 2^S (exact, or the infinity the reference gives) with the sign of x (`bits`);
    NaN in `special` blocks."""
    power = tl.where(s > -127, (127 + s) << 23, 1 << 22)  # 2^S (2^-127 is a float32 subnormal)
    value = (element.to(tl.float32, bitcast=True) * power.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True)
    return tl.where(special, F32_NAN_BITS, value | (bits & -2147483648))


@triton.jit
def _nearest_scaled(bits, s, special, CODE: tl.constexpr):
    """float32 bits of the values of float32 `bits` rounded to nearest even for a floating-point element format,
    exact at every block scale S (broadcast), in the element's own units: y = |x| * 2^-S, an element-normal y
    rounded on its float32 bit pattern, an element-subnormal one by adding and subtracting 2^(emin - mbits + 23)
    (float32 addition rounds to nearest even at that step), times 2^S; NaN in `special` blocks. Why it gives the
    integer steps' bits: docs/numerics.md, "Rounding in the element's units". No per-block range test."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    MMAX: tl.constexpr = code_field(CODE, "mmax")
    K: tl.constexpr = 23 - MBITS  # fraction bits an element-normal value drops
    MIN_NORMAL: tl.constexpr = (EMIN + 127) << 23  # 2^emin
    MAGIC: tl.constexpr = 2.0 ** (EMIN - MBITS + 23)  # its float32 ulp is the element-subnormal step 2^(emin - mbits)
    MAX_BITS: tl.constexpr = ((EMAX + 127) << 23) | MMAX  # the largest element value
    y = _element_units(bits, s)
    normal = (y + ((1 << (K - 1)) - 1) + ((y >> K) & 1)) & -(1 << K)
    subnormal = ((y.to(tl.float32, bitcast=True) + MAGIC) - MAGIC).to(tl.int32, bitcast=True)
    element = tl.minimum(tl.where(y >= MIN_NORMAL, normal, subnormal), MAX_BITS)
    return _from_element_units(element, s, special, bits)


@triton.jit
def _stochastic_scaled(bits, s, special, r24, CODE: tl.constexpr):
    """float32 bits of the stochastically rounded values of float32 `bits` for a floating-point element format,
    exact at every block scale S (broadcast), in the element's own units: y = |x| * 2^-S, rounded on its float32
    bit pattern, times 2^S; NaN in `special` blocks (MMAX: the largest value's 23-bit fraction). Why it gives the
    integer steps' bits: docs/numerics.md, "Rounding in the element's units". No per-block range
    test, no int-to-float conversion, no codes. The attention's register tiles use it (`mxlab.kernels._mx_device`)."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMIN: tl.constexpr = code_field(CODE, "emin")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    MMAX: tl.constexpr = code_field(CODE, "mmax")
    K: tl.constexpr = 23 - MBITS  # fraction bits an element-normal value drops
    LOWEST: tl.constexpr = EMIN + 127  # biased exponent of 2^emin, the smallest element-normal binade
    QUANTUM: tl.constexpr = (EMIN - MBITS + 127) << 23  # 2^(emin - mbits): the element-subnormal step
    MAX_BITS: tl.constexpr = ((EMAX + 127) << 23) | MMAX  # the largest element value
    y = _element_units(bits, s)
    exponent = y >> 23
    shift = K + tl.maximum(
        LOWEST - exponent, 0
    )  # log2 of the step in units of y's last bit (y < 2^-126: any shift >= 25)
    sh = tl.minimum(shift, 23)
    near = (y + ((1 << sh) - 1 - (r24 >> (24 - sh)))) & -(1 << sh)  # shift <= 23: the bias carries where it rounds up
    significand = (y & 0x7FFFFF) | 0x800000  # y < 2^-126 (exponent 0) has shift >= 133: rounds to 0 whatever this is
    up = (2 * r24 + 1) <= (
        ((significand << 1) - 1) >> tl.minimum(tl.maximum(shift - 24, 0), 31)
    )  # shift >= 24: 0 or one step
    element = tl.minimum(tl.where(shift <= 23, near, tl.where(up, QUANTUM, 0)), MAX_BITS)
    return _from_element_units(element, s, special, bits)


@triton.jit
def _stochastic_path(bits, s, inert, path, CODE: tl.constexpr):
    """The tile's path for `_emit`: PATH_NORMAL_STOCHASTIC for a stochastic cast to a floating-point format on
    PATH_FINITE where no element is nonzero and below 2^(S + emin) of its block (an element-subnormal value,
    whose rounding shift depends on its exponent; `_stochastic_normal_elements`), else `path`. One compare per
    element, one tile reduction."""
    if code_field(CODE, "rounding") == ROUND_STOCHASTIC and not code_field(CODE, "is_int"):
        lowest_normal = (tl.where(inert, 0, s) + code_field(CODE, "emin") + 127) << 23  # bits of 2^(S + emin)
        tiny = ((bits & 0x7FFFFFFF) - 1).to(tl.uint32, bitcast=True) < (lowest_normal - 1).to(tl.uint32, bitcast=True)
        return tl.where((path == PATH_FINITE) & (tl.max(tiny.to(tl.int32)) == 0), PATH_NORMAL_STOCHASTIC, path)
    else:
        return path


@triton.jit
def _quantize_hw_fp8(bits, s, special, CODE: tl.constexpr):
    """(codes, float32 value bits) of e4m3/e5m2 with round to nearest even through the GPU's saturating FP8
    conversion (sm_90+): exact at every scale S (docs/numerics.md: "The cast kernels" inside `_fast_path_ok`'s range,
    where the cast kernels call it; "Jagged attention" outside it, where the attention's tiles call it too).
    Values of `special` blocks are NaN (their per-block dequantization factor is NaN); their codes are not set."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    BITS: tl.constexpr = code_field(CODE, "bits")
    IS_INT: tl.constexpr = code_field(CODE, "is_int")
    tl.static_assert(BITS == 8 and not IS_INT and (MBITS == 2 or MBITS == 3), "hardware FP8 path: e4m3 or e5m2 only")
    x = bits.to(tl.float32, bitcast=True)
    scaled = x * ((127 - s) << 23).to(tl.float32, bitcast=True)  # x * 2^-S, exact where it matters
    if MBITS == 3:
        element = scaled.to(tl.float8e4nv, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e4m3x2.f32
    else:
        element = scaled.to(tl.float8e5, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e5m2x2.f32
    power = tl.where(s > -127, (127 + s) << 23, 1 << 22)  # 2^S (2^-127 is a float32 subnormal)
    factor = tl.where(special, F32_NAN_BITS, power).to(tl.float32, bitcast=True)  # NaN if special
    value = element.to(tl.float32) * factor  # exact: n * 2^qe with qe >= -143 (mul.f32 keeps subnormals)
    return element.to(tl.uint8, bitcast=True).to(tl.int32), value.to(tl.int32, bitcast=True)


@triton.jit
def _hw_fp8_finite_elements(bits, s, OUT_KIND: tl.constexpr, CODE: tl.constexpr):
    """(uint8 codes, values as bits of the output dtype) of `_quantize_hw_fp8` for tiles without NaN/Inf blocks
    (tile path 2): no per-element select, the FP8 bytes are the codes as converted (pairs stay packed), and the
    value float32(fp8) * 2^S is converted to bfloat16/float16 by the GPU's round-to-nearest-even conversion,
    which is `_f32_bits_to_output` on finite values (exact for bfloat16: at most 4 significant bits, normal or
    zero). All-zero blocks run with their clamped S = -127: x * 2^127 is +-0, and +-0 * 2^-127 (factor bits 0,
    +0.0) is the reference's signed zero."""
    x = bits.to(tl.float32, bitcast=True)
    scaled = x * ((127 - s) << 23).to(tl.float32, bitcast=True)  # x * 2^-S
    if code_field(CODE, "mbits") == 3:
        element = scaled.to(tl.float8e4nv, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e4m3x2.f32
    else:
        element = scaled.to(tl.float8e5, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e5m2x2.f32
    value = element.to(tl.float32) * ((127 + s) << 23).to(tl.float32, bitcast=True)
    if OUT_KIND == KIND_BF16:
        out = (value.to(tl.int32, bitcast=True) >> 16).to(tl.int16)  # exact: at most 4 significant bits
    elif OUT_KIND == KIND_FP16:
        out = value.to(tl.float16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True)
    else:
        out = value.to(tl.int32, bitcast=True)
    return element.to(tl.uint8, bitcast=True), out


@triton.jit
def _fast_elements(bits, s, special, inert, r24, OUT_KIND: tl.constexpr, CODE: tl.constexpr):
    """(codes, values as bits of the output dtype) on the fast path (rounding nearest_even or stochastic); the
    code's hw_fp8 (nearest_even, e4m3/e5m2, sm_90+) converts with the GPU's FP8 instructions instead."""
    NEAREST_EVEN: tl.constexpr = code_field(CODE, "rounding") == ROUND_NEAREST_EVEN
    if NEAREST_EVEN and code_field(CODE, "hw_fp8"):
        code, value = _quantize_hw_fp8(bits, tl.where(inert, 0, s), special, CODE)
    else:
        if NEAREST_EVEN:
            code, value = _quantize_fast(bits, tl.where(inert, 0, s), CODE)
        else:
            code, value = _quantize_fast_stochastic(bits, tl.where(inert, 0, s), r24, CODE)
        value = tl.where(special, F32_NAN_BITS, value)
    if OUT_KIND == KIND_BF16:
        out = (value >> 16).to(tl.int16)  # exact: at most 8 significant bits, normal or zero
    else:
        out = _f32_bits_to_output(value, OUT_KIND)
    return tl.where(special, 0, code), out


@triton.jit
def _exact_elements(bits, s, special, r24, OUT_KIND: tl.constexpr, CODE: tl.constexpr):
    """(codes, values as bits of the output dtype) by the exact integer path, any block."""
    code, value = _quantize_exact(bits, s, r24, CODE)
    out = _f32_bits_to_output(tl.where(special, F32_NAN_BITS, value), OUT_KIND)
    return tl.where(special, 0, code), out
