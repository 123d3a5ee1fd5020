"""Triton kernels for MX quantization and fake quantization, bit-identical to mxlab.numerics.reference.

Every step is the integer algorithm of docs/numerics.md on float32 bit patterns: the block amax
is an integer max of `bits & 0x7FFFFFFF`, the scale exponent comes from the exponent and
fraction fields, elements are rounded by integer shift and remainder, and stochastic rounding
draws its 24 bits from the counter-based mixer. Nothing depends on the GPU's float
flush-to-zero behaviour, with two exceptions that are proven safe below (the fast paths).

`_mx_kernel` loads a 4-D tile of a 3-D view (A, L, B) of x: (RB, RS, CB, 32), rows
`(pid_l * RB + rb) * RS + rs` of L and columns `(pid_b * CB + cb) * 32 + c` of B, and emits

- LAYOUT_ROW:  blocks of 32 along B (reduce the tile's last axis);
- LAYOUT_COL:  blocks of 32 along L (RS == 32; reduce axis 1; the fused Hadamard column cast only);
- LAYOUT_TILE: (32, 32) tiles (RS == 32; reduce axes 1 and 3).

LAYOUT_COL without the transform and LAYOUT_BOTH (row and column blocks from one read of the input) run
in `_mx_column_tile_kernel`, one pass over a 2-D tile of 32 rows (the default on the hardware FP8 path),
or in `_mx_columns_kernel`, two passes over 32 rows (the default on the integer paths;
`TileConfig.column_passes` chooses).

Outputs are element codes (uint8, padded shape), scale bytes, and/or fake-quantized values in
the input dtype (unpadded shape), each contiguous in (A, L, B) order.

Random Hadamard transform (constexpr HADAMARD, LAYOUT_ROW and LAYOUT_COL of `_mx_kernel`): the loaded
tile first becomes mxlab.numerics.hadamard.random_hadamard of the zero-padded input with block 32 along the
blocked axis (the Hadamard blocks are the MX blocks): the sign of element k of each block is flipped where
bit 0 of the counter bits of (k, hadamard seed) is 1 (an XOR of the float32 sign bit, which is the
reference's exact multiply by -1), the butterfly runs in float32 in the reference's order (`_walsh_hadamard_rows`),
then one float32 multiply by float32(1/sqrt(32)). Everything after works on those float32 bits as on an
input. The transformed tensor has the padded shape, so values are float32 of the padded shape and the
stochastic-rounding counter is the element index in it. These launches compile with enable_fp_fusion=False
(no multiply-add contraction); Triton emits float32 add/sub/mul without .ftz, so subnormals behave as in
PyTorch.

The fast path (round to nearest even, every block of the tile with a scale in the range where
it is valid) rounds element-normal values by adding a rounding bias to the float32 bit
pattern, and element-subnormal values with one float32 addition of the power of two
2^(qe + 23), whose last bits then hold n. That addition is exact RNE of |x| to the quantum
2^qe; both operands and the sum are normal floats when qe >= -125, and an input that is a
float32 subnormal is below half the quantum, so it rounds to 0 whether or not the hardware
flushes it. Any other tile takes the exact integer path.

Paths per tile (`_tile_path`, one block-wide reduction): 2 when every block may take the fast path and none
holds a NaN/Inf, 1 when every block may take the fast path, 0 otherwise. Path 2 is the common one; with the
hardware FP8 conversion it needs no per-element select (`_hw_fp8_finite_elements`). Stochastic casts to
floating-point formats raise path 2 to 3 where no element is element-subnormal (`_stochastic_path`): such a
tile rounds by one addition to the float32 pattern (`_stochastic_normal_elements`). `_mx_kernel` and
`_mx_column_tile_kernel` quantize tiles off the common path row by row, loading the rows again
(`_quantize_tile`), and `_mx_columns_kernel` runs them in
a second loop of one row per step: a kernel's register count is that of its largest branch, so the rarely
taken paths no longer set it (the row cast on sm_90: 117 -> 48 registers, `mxlab bench sass`).

Hardware FP8 conversion (constexpr HW_FP8, chosen by `hardware_fp8_applies`: e4m3/e5m2, round to
nearest even, CUDA compute capability >= 9.0, never under TRITON_INTERPRET=1). On a fast-path tile an
element becomes scaled = float32(x) * 2^-S, converted by `.to(float8e4nv | float8e5, "rtne")`, which
Triton 3.6 lowers on sm_90+ to cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (on sm_89 it goes through an fp16
rounded toward zero, a double rounding, so sm_89 keeps the integer path). The code is the FP8 byte, the
value float32(fp8) * 2^S. This is the reference bit for bit, because `_fast_path_ok` gives
S + emin - mbits >= -125 and S + emax <= 126 (S in [-116, 113] for e4m3, [-109, 111] for e5m2), so:
- 2^-S and 2^S are normal floats; x * 2^-S is exact when the product is a normal float, and never
  overflows (|x| <= amax < 2^(S + emax + 1)). Exact scaled values rounded to nearest even on the FP8
  grid (quantum 2^(e - mbits) in binade e >= emin, 2^(emin - mbits) below: FP8 subnormals) are the
  reference's rounding at quantum 2^qe, divided by 2^S, ties included.
- A product below 2^-126 and a float32-subnormal input (|x| / 2^S < 2^(-126 - S) <= 2^(emin - mbits - 1)
  by the bound on S), however the multiply rounds or flushes them, lie below half the smallest FP8
  subnormal: zero on both sides.
- Saturation: the reference rounds, then clamps a code above the max to the max normal; satfinite
  returns the max normal for every value that rounds above it (where e4m3 has NaN, e5m2 Inf), and
  values below it round alike.
- Signed zero: the reference ORs x's sign into every FP code, so a negative x that rounds to zero gives
  0x80 and -0.0. So does the hardware: x * 2^-S keeps x's sign when it underflows (Triton emits mul.f32,
  without .ftz; a flush would keep the sign too), an IEEE conversion that rounds a negative value to
  zero returns -0, and -0 * 2^S = -0. Blocks with amax 0 run with S = 0 (codes 0x00/0x80, values +-0);
  NaN/Inf blocks are `special`: code 0 as on every path, values NaN through a NaN factor in place of 2^S.
- float32(fp8) is exact (Triton converts through fp16, which holds every e4m3/e5m2 value), and times 2^S
  it is n * 2^qe with qe >= -125 and magnitude <= 1.75 * 2^126: exact, normal or zero.
"""
from __future__ import annotations

import triton
import triton.language as tl

LAYOUT_ROW = 0
LAYOUT_COL = 1
LAYOUT_BOTH = 2
LAYOUT_TILE = 3

KIND_FP32 = 0  # pointer to int32 bit patterns
KIND_BF16 = 1  # pointer to int16 bit patterns
KIND_FP16 = 2  # pointer to int16 bit patterns

SCALE_FLOOR, SCALE_CEIL, SCALE_RCEIL, SCALE_EVEN = 0, 1, 2, 3
ROUND_NEAREST_EVEN, ROUND_NEAREST_AWAY, ROUND_TOWARD_ZERO, ROUND_STOCHASTIC = 0, 1, 2, 3

F32_NAN_BITS = tl.constexpr(0x7FC00000)
HADAMARD_NORM_BITS = tl.constexpr(0x3E3504F3)  # float32(1 / sqrt(32)), the factor mxlab.numerics.hadamard multiplies by


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _floor_log2(v):
    """floor(log2 v) for int32 v in [1, 2^24) (exact int-to-float conversion); -127 for v == 0."""
    return (v.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127


@triton.jit
def _mix32(z):
    """The 32-bit mixer of docs/numerics.md on uint32 values (multiplications wrap mod 2^32)."""
    z ^= z >> 16
    z *= 0x7FEB352D
    z ^= z >> 15
    z *= 0x846CA68B
    z ^= z >> 16
    return z


@triton.jit
def _random_bits24(linear_index, seed_key, WIDE_INDEX: tl.constexpr):
    """24 counter bits (int32) for each linear element index; seed_key = mix32(seed)."""
    if WIDE_INDEX:
        low = (linear_index & 0xFFFFFFFF).to(tl.uint32)
        high = (linear_index >> 32).to(tl.uint32)
    else:
        low = linear_index.to(tl.uint32)
        high = tl.zeros_like(low)
    hashed = _mix32(_mix32(low ^ seed_key.to(tl.uint32)) ^ high)
    return (hashed >> 8).to(tl.int32)


@triton.jit
def _load_bits(pointers, mask, IN_KIND: tl.constexpr, CONVERT_BF16: tl.constexpr = False):
    """float32 bit patterns (int32) of the input; 0 where masked. CONVERT_BF16 (CUDA only, never under
    TRITON_INTERPRET=1, whose numpy conversion flushes bfloat16 subnormals): widen bfloat16 with the GPU's
    cvt.f32.bf16, which is exact (ptxas emits the left shift by 16 itself) and unpacks the high half of a
    loaded register in fewer instructions than an integer sign extension and shift."""
    if IN_KIND == 0:
        bits = tl.load(pointers, mask=mask, other=0)
    elif IN_KIND == 1 and CONVERT_BF16:
        bits = tl.load(pointers, mask=mask, other=0).to(tl.bfloat16, bitcast=True).to(tl.float32).to(
            tl.int32, bitcast=True)
    elif IN_KIND == 1:
        bits = tl.load(pointers, mask=mask, other=0).to(tl.int32) << 16
    else:
        half = tl.load(pointers, mask=mask, other=0).to(tl.float16, bitcast=True)
        bits = half.to(tl.float32).to(tl.int32, bitcast=True)  # exact widening
    return bits


@triton.jit
def _load_magnitude_key(pointers, mask, IN_KIND: tl.constexpr):
    """An int32 that orders like |x| (0 where masked), for block maxima: the float32 magnitude bits, and for
    bfloat16 its 15 magnitude bits (`_magnitude_from_key` shifts them into place once per block, not per
    element)."""
    if IN_KIND == 1:
        key = tl.load(pointers, mask=mask, other=0).to(tl.int32) & 0x7FFF
    else:
        key = _load_bits(pointers, mask, IN_KIND) & 0x7FFFFFFF
    return key


@triton.jit
def _magnitude_from_key(key, IN_KIND: tl.constexpr):
    """float32 magnitude bits of a `_load_magnitude_key` value (0x7FFFFFFF stays: it marks "none")."""
    if IN_KIND == 1:
        magnitude = tl.where(key == 0x7FFFFFFF, key, key << 16)
    else:
        magnitude = key
    return magnitude


@triton.jit
def _rne_shift(value, shift):
    """value >> shift rounded to nearest even, for int32 value >= 0 and shift in [0, 30]."""
    quotient = value >> shift
    remainder = value & ((1 << shift) - 1)
    half = (1 << shift) >> 1
    up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1) & (shift > 0))
    return quotient + up.to(tl.int32)


@triton.jit
def _encode_f32(n, e):
    """float32 bits of n * 2^e (int32 n in [0, 2^24)), correctly rounded in the subnormal range, Inf past max."""
    p = tl.maximum(_floor_log2(n), 0)
    value_exp = e + p
    normal = ((value_exp + 127) << 23) | ((n << (23 - p)) & 0x7FFFFF)
    k = e + 149  # n * 2^e = (n * 2^k) * 2^-149
    subnormal = tl.where(k >= 0, n << tl.minimum(tl.maximum(k, 0), 31), _rne_shift(n, tl.minimum(tl.maximum(-k, 0), 30)))
    bits = tl.where(value_exp >= -126, normal, subnormal)
    bits = tl.where(value_exp > 127, 0x7F800000, bits)
    return tl.where(n == 0, 0, bits)


@triton.jit
def _f32_bits_to_output(bits, OUT_KIND: tl.constexpr):
    """float32 bits rounded (nearest even) to the output dtype's bit pattern (int32/int16)."""
    if OUT_KIND == 0:
        out = bits
    elif OUT_KIND == 1:
        is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out = tl.where(is_nan, 0x7FC0, rounded & 0xFFFF).to(tl.int16)
    else:
        magnitude = bits & 0x7FFFFFFF
        exponent = magnitude >> 23
        significand = (magnitude & 0x7FFFFF) | 0x800000
        normal = (magnitude - 0x38000000 + 0xFFF + ((magnitude >> 13) & 1)) >> 13
        subnormal = _rne_shift(significand, tl.minimum(tl.maximum(126 - exponent, 0), 30))
        half = tl.where(magnitude >= 0x38800000, normal, subnormal)
        half = tl.where(magnitude >= 0x477FF000, 0x7C00, half)
        half = tl.where(magnitude > 0x7F800000, 0x7E00, half)
        out = (half | ((bits >> 16) & 0x8000)).to(tl.int16)
    return out


# ----------------------------------------------------------------------------- random Hadamard transform
@triton.jit
def _walsh_hadamard_rows(v):
    """Unnormalized Walsh-Hadamard transform of each row of a float32 (M, 32) tile, in mxlab.numerics.hadamard's order.

    Stage h = 1, 2, 4, 8, 16 replaces the elements i and i + h (bit h of i clear) by (a + c, a - c). Each
    stage pairs the last bit of the current arrangement, then rotates the arrangement's index bits right by
    one (join of the sums and differences, transposed to (2, 16)), so stage h sees bit h of the original
    index last, and after five stages the original order is back.
    """
    M: tl.constexpr = v.shape[0]
    for _ in tl.static_range(5):
        a, c = tl.split(tl.reshape(v, (M, 16, 2)))
        v = tl.reshape(tl.permute(tl.join(a + c, a - c), (0, 2, 1)), (M, 32))
    return v


@triton.jit
def _random_hadamard_bits(bits, hadamard_key, AXIS: tl.constexpr):
    """float32 bits of random_hadamard(x, 32, seed) of a 4-D tile of float32 bits along AXIS (3: the tile's
    last axis, 1: its row axis); hadamard_key = mix32(seed). See the module docstring."""
    flip = (_random_bits24(tl.arange(0, 32), hadamard_key, False) & 1) << 31  # sign bit where the sign is -1
    S0: tl.constexpr = bits.shape[0]
    S1: tl.constexpr = bits.shape[1]
    S2: tl.constexpr = bits.shape[2]
    S3: tl.constexpr = bits.shape[3]
    norm = tl.full((1, 1, 1, 1), HADAMARD_NORM_BITS, tl.int32).to(tl.float32, bitcast=True)
    if AXIS == 3:
        signed = (bits ^ flip[None, None, None, :]).to(tl.float32, bitcast=True)
        rows = _walsh_hadamard_rows(tl.reshape(signed, (S0 * S1 * S2, 32)))
        transformed = tl.reshape(rows, (S0, S1, S2, S3))
    else:
        tl.static_assert(AXIS == 1, "the Hadamard axis of the tile is 1 or 3")
        signed = (bits ^ flip[None, :, None, None]).to(tl.float32, bitcast=True)
        rows = _walsh_hadamard_rows(tl.reshape(tl.permute(signed, (0, 2, 3, 1)), (S0 * S2 * S3, 32)))
        transformed = tl.permute(tl.reshape(rows, (S0, S2, S3, S1)), (0, 3, 1, 2))
    return (transformed * norm).to(tl.int32, bitcast=True)


# ----------------------------------------------------------------------------- scales
@triton.jit
def _scale_exponent(amax, MBITS: tl.constexpr, EMAX: tl.constexpr, MMAX: tl.constexpr, SCALE_MODE: tl.constexpr):
    """(S, special) for block amax bit patterns: the clamped unbiased scale exponent, and NaN/Inf blocks."""
    exponent = amax >> 23
    fraction = amax & 0x7FFFFF
    if EMAX >= 1 or SCALE_MODE == 0:
        # A float32-subnormal (or zero) amax has floor(log2 amax) <= -127, so S <= -127 - EMAX + 1 <= -127 with
        # EMAX >= 1 (and S <= -127 - EMAX with floor scales): the clamp below gives -127 whatever its fraction.
        log2_floor = exponent - 127
        m = fraction
    else:
        p = tl.maximum(_floor_log2(fraction), 0)
        is_normal = exponent > 0
        log2_floor = tl.where(is_normal, exponent - 127, p - 149)
        m = tl.where(is_normal, fraction, (fraction << (23 - p)) & 0x7FFFFF)
    s = log2_floor - EMAX
    if SCALE_MODE == 1:
        s += (m != 0).to(tl.int32)
    elif SCALE_MODE == 2:
        s += (m > MMAX).to(tl.int32)
    elif SCALE_MODE == 3:
        keep = m >> (23 - MBITS)
        rest = m & ((1 << (23 - MBITS)) - 1)
        half = 1 << (22 - MBITS)
        up = (rest > half) | ((rest == half) & ((keep & 1) == 1))
        s += (keep + up.to(tl.int32)) >> MBITS
    s = tl.minimum(tl.maximum(s, -127), 127)
    if EMAX == 0 and SCALE_MODE != 0:
        s = tl.where(amax == 0, -127, s)  # otherwise already -127 (above)
    return s, amax >= 0x7F800000


@triton.jit
def _fast_path_ok(s, inert, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr):
    """Per block: the fast path is exact for this scale (inert blocks, all-zero or NaN/Inf, always are)."""
    qe = s + EMIN - MBITS
    ok = (qe >= -125) & (qe <= 104) & (s + EMAX <= 126)
    return ok | inert


@triton.jit
def _tile_path(s, special, inert, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr):
    """The path of a whole tile (one reduction): 0 exact integer steps; 1 fast path (`_fast_path_ok` for every
    block); 2 fast path and no NaN/Inf block (the hardware FP8 path then needs no per-element select)."""
    ok = _fast_path_ok(s, inert, MBITS, EMIN, EMAX)
    return tl.min(ok.to(tl.int32) + (ok & ~special).to(tl.int32))


@triton.jit
def _amax_range_path(tile_max, tile_min, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                     MMAX: tl.constexpr, SCALE_MODE: tl.constexpr):
    """`_tile_path` (0 or 2) for blocks whose amax lies in [tile_min, tile_max] (tile_min: the smallest nonzero
    magnitude, 0x7FFFFFFF if none): the set of amax values the fast path accepts is an interval, and where
    tile_max is below Inf no block is NaN/Inf."""
    s_hi, special_hi = _scale_exponent(tile_max, MBITS, EMAX, MMAX, SCALE_MODE)
    s_lo, special_lo = _scale_exponent(tile_min, MBITS, EMAX, MMAX, SCALE_MODE)
    ok = (_fast_path_ok(s_hi, tile_max == 0, MBITS, EMIN, EMAX) & ~special_hi
          & _fast_path_ok(s_lo, tile_min == 0x7FFFFFFF, MBITS, EMIN, EMAX))
    return ok.to(tl.int32) * 2


# ----------------------------------------------------------------------------- elements
@triton.jit
def _quantize_exact(bits, s, r24, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                    MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr,
                    ROUNDING: tl.constexpr):
    """(codes, float32 bits of the dequantized value) by the integer algorithm, for finite blocks."""
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
    if ROUNDING == 0:
        up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    elif ROUNDING == 1:
        up = remainder >= half
    elif ROUNDING == 2:
        up = remainder < 0
    else:
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
        magnitude_code = ((quantum_exp - s + MBITS - EMIN) << MBITS) + n
        saturated = magnitude_code > MAXCODE
        code = tl.minimum(magnitude_code, MAXCODE) | (negative.to(tl.int32) << (BITS - 1))
        n_out = tl.where(saturated, NMAX, n)
        e_out = tl.where(saturated, s + EMAX - MBITS, quantum_exp)
        value = _encode_f32(n_out, e_out) | (negative.to(tl.int32) << 31)
    return code, value


@triton.jit
def _quantize_fast(bits, s, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                   MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr):
    """(codes, float32 value bits) with round to nearest even, for blocks where `_fast_path_ok` holds."""
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
def _quantize_fast_stochastic(bits, s, r24, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                              MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr):
    """(codes, float32 value bits) with stochastic rounding, for blocks where `_fast_path_ok` holds.

    Integer only. With shift <= 24 the rule `(2r + 1) < rem << (25 - shift)` is `rem > r >> (24 - shift)`,
    so n = (significand + 2^shift - 1 - (r >> (24 - shift))) >> shift; element-normal values have
    shift = 23 - mbits. Values are rebuilt from n as float(n) * 2^qe by an exponent add (normal results).
    """
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
def _stochastic_normal_elements(bits, s, r24, OUT_KIND: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                                EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr):
    """(codes, values as bits of the output dtype) of `_quantize_fast_stochastic` for floating-point formats,
    where every element of the tile is zero or element-normal (|x| >= 2^(S + emin)) and no block is NaN/Inf (tile
    path 3 of `_stochastic_path`).

    Such an element has shift = 23 - mbits = K, and the low K bits of its float32 pattern are those of its
    significand, so adding the bias 2^K - 1 - (r >> (24 - K)) to the pattern carries into bit K exactly where
    `_quantize_fast_stochastic` rounds up; clearing the low K bits leaves the value n * 2^qe (a carry out of the
    fraction increments the exponent field: the next binade's first value). A zero stays zero (bias < 2^K).
    Saturation is the same min with the largest value; the code of a normal value is its exponent and top
    fraction bits less the scale's offset, 0 for zero. No per-element shift or int-to-float conversion."""
    K: tl.constexpr = 23 - MBITS
    magnitude = bits & 0x7FFFFFFF
    rounded = magnitude + (((1 << K) - 1) - (r24 >> (24 - K)))
    max_bits = ((s + EMAX + 127) << 23) | ((NMAX << K) & 0x7FFFFF)
    value = tl.minimum(rounded & ~((1 << K) - 1), max_bits)
    code = tl.minimum(tl.maximum((value >> K) - ((s + EMIN + 126) << MBITS), 0), MAXCODE)
    code = code | ((bits >> (32 - BITS)) & (1 << (BITS - 1)))
    value = value | (bits & -2147483648)
    if OUT_KIND == 1:
        out = (value >> 16).to(tl.int16)  # exact: at most 8 significant bits, normal or zero
    else:
        out = _f32_bits_to_output(value, OUT_KIND)
    return code, out


@triton.jit
def _stochastic_path(bits, s, inert, path, EMIN: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr):
    """The tile's path for `_emit`: 3 for a stochastic cast to a floating-point format on path 2 where no element
    is nonzero and below 2^(S + emin) of its block (an element-subnormal value, whose rounding shift depends on
    its exponent; `_stochastic_normal_elements`), else `path`. One compare per element, one tile reduction."""
    if ROUNDING == 3 and not IS_INT:
        lowest_normal = (tl.where(inert, 0, s) + EMIN + 127) << 23  # bits of 2^(S + emin)
        tiny = ((bits & 0x7FFFFFFF) - 1).to(tl.uint32, bitcast=True) < (lowest_normal - 1).to(tl.uint32, bitcast=True)
        return tl.where((path == 2) & (tl.max(tiny.to(tl.int32)) == 0), 3, path)
    else:
        return path


@triton.jit
def _quantize_hw_fp8(bits, s, special, MBITS: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr):
    """(codes, float32 value bits) of e4m3/e5m2 with round to nearest even through the GPU's saturating FP8
    conversion (sm_90+), for blocks where `_fast_path_ok` holds; the module docstring says why it is exact.
    Values of `special` blocks are NaN (their per-block dequantization factor is NaN); their codes are not set."""
    tl.static_assert(BITS == 8 and not IS_INT and (MBITS == 2 or MBITS == 3), "hardware FP8 path: e4m3 or e5m2 only")
    x = bits.to(tl.float32, bitcast=True)
    scaled = x * ((127 - s) << 23).to(tl.float32, bitcast=True)  # x * 2^-S, exact where it matters
    if MBITS == 3:
        element = scaled.to(tl.float8e4nv, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e4m3x2.f32
    else:
        element = scaled.to(tl.float8e5, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e5m2x2.f32
    factor = tl.where(special, F32_NAN_BITS, (127 + s) << 23).to(tl.float32, bitcast=True)  # 2^S, NaN if special
    value = element.to(tl.float32) * factor  # exact, normal or zero
    return element.to(tl.uint8, bitcast=True).to(tl.int32), value.to(tl.int32, bitcast=True)


@triton.jit
def _hw_fp8_finite_elements(bits, s, OUT_KIND: tl.constexpr, MBITS: tl.constexpr):
    """(uint8 codes, values as bits of the output dtype) of `_quantize_hw_fp8` for tiles without NaN/Inf blocks
    (tile path 2): no per-element select, the FP8 bytes are the codes as converted (pairs stay packed), and the
    value float32(fp8) * 2^S is converted to bfloat16/float16 by the GPU's round-to-nearest-even conversion,
    which is `_f32_bits_to_output` on finite values (exact for bfloat16: at most 4 significant bits, normal or
    zero). All-zero blocks run with their clamped S = -127: x * 2^127 is +-0, and +-0 * 2^-127 (factor bits 0,
    +0.0) is the reference's signed zero."""
    x = bits.to(tl.float32, bitcast=True)
    scaled = x * ((127 - s) << 23).to(tl.float32, bitcast=True)  # x * 2^-S
    if MBITS == 3:
        element = scaled.to(tl.float8e4nv, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e4m3x2.f32
    else:
        element = scaled.to(tl.float8e5, fp_downcast_rounding="rtne")  # cvt.rn.satfinite.e5m2x2.f32
    value = element.to(tl.float32) * ((127 + s) << 23).to(tl.float32, bitcast=True)
    if OUT_KIND == 1:
        out = (value.to(tl.int32, bitcast=True) >> 16).to(tl.int16)  # exact: at most 4 significant bits
    elif OUT_KIND == 2:
        out = value.to(tl.float16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True)
    else:
        out = value.to(tl.int32, bitcast=True)
    return element.to(tl.uint8, bitcast=True), out


@triton.jit
def _fast_elements(bits, s, special, inert, r24, OUT_KIND: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                   EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr,
                   IS_INT: tl.constexpr, ROUNDING: tl.constexpr, HW_FP8: tl.constexpr):
    """(codes, values as bits of the output dtype) on the fast path (ROUNDING nearest_even or stochastic);
    HW_FP8 (nearest_even, e4m3/e5m2, sm_90+) converts with the GPU's FP8 instructions instead of integer steps."""
    if ROUNDING == 0 and HW_FP8:
        code, value = _quantize_hw_fp8(bits, tl.where(inert, 0, s), special, MBITS, BITS, IS_INT)
    else:
        if ROUNDING == 0:
            code, value = _quantize_fast(bits, tl.where(inert, 0, s), MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT)
        else:
            code, value = _quantize_fast_stochastic(bits, tl.where(inert, 0, s), r24, MBITS, EMIN, EMAX, MAXCODE,
                                                    NMAX, BITS, IS_INT)
        value = tl.where(special, F32_NAN_BITS, value)
    if OUT_KIND == 1:
        out = (value >> 16).to(tl.int16)  # exact: at most 8 significant bits, normal or zero
    else:
        out = _f32_bits_to_output(value, OUT_KIND)
    return tl.where(special, 0, code), out


@triton.jit
def _exact_elements(bits, s, special, r24, OUT_KIND: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                    EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr,
                    IS_INT: tl.constexpr, ROUNDING: tl.constexpr):
    """(codes, values as bits of the output dtype) by the exact integer path, any block."""
    code, value = _quantize_exact(bits, s, r24, MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING)
    out = _f32_bits_to_output(tl.where(special, F32_NAN_BITS, value), OUT_KIND)
    return tl.where(special, 0, code), out


@triton.jit
def _store(code, out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
           WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr):
    if WANT_CODES:
        tl.store(codes_ptr + out_offsets, code.to(tl.uint8), mask=out_mask)
    if WANT_VALUES:
        tl.store(values_ptr + values_offsets, out, mask=values_mask)


@triton.jit
def _emit(bits, s, special, inert, path, r24, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
          WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr, OUT_KIND: tl.constexpr,
          MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr,
          NMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr, ROUNDING: tl.constexpr,
          FAST: tl.constexpr, HW_FP8: tl.constexpr, PROBE: tl.constexpr):
    """Quantize a tile (s, special, inert broadcast against bits; path: `_tile_path` of the tile, raised to 3 by
    `_stochastic_path` where it applies) and store its
    codes and/or values. Each branch stores its own results, so no tile-sized value is merged across the branch
    (which would keep both paths' registers live)."""
    if PROBE:  # benchmark probe: same loads, reductions and stores, no element arithmetic
        probe_bits = bits + r24
        code = (probe_bits >> 24) + s
        out = _f32_bits_to_output(probe_bits, 0) if OUT_KIND == 0 else (probe_bits >> 16).to(tl.int16)
        _store(code, out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
               WANT_CODES, WANT_VALUES)
    elif FAST and (ROUNDING == 0 or ROUNDING == 3):
        if HW_FP8 and ROUNDING == 0:
            if path == 2:
                fp8_code, fp8_out = _hw_fp8_finite_elements(bits, s, OUT_KIND, MBITS)  # names of their own: other types
                _store(fp8_code, fp8_out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
                       WANT_CODES, WANT_VALUES)
            else:
                _emit_fast_or_exact(bits, s, special, inert, path, r24, out_offsets, out_mask, codes_ptr, values_ptr,
                                    values_offsets, values_mask, WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX,
                                    MAXCODE, NMAX, BITS, IS_INT, ROUNDING, HW_FP8)
        elif ROUNDING == 3 and not IS_INT:
            if path == 3:
                sr_code, sr_out = _stochastic_normal_elements(bits, tl.where(inert, 0, s), r24, OUT_KIND, MBITS, EMIN,
                                                              EMAX, MAXCODE, NMAX, BITS)
                _store(sr_code, sr_out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
                       WANT_CODES, WANT_VALUES)
            else:
                _emit_fast_or_exact(bits, s, special, inert, path, r24, out_offsets, out_mask, codes_ptr, values_ptr,
                                    values_offsets, values_mask, WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX,
                                    MAXCODE, NMAX, BITS, IS_INT, ROUNDING, HW_FP8)
        else:
            _emit_fast_or_exact(bits, s, special, inert, path, r24, out_offsets, out_mask, codes_ptr, values_ptr,
                                values_offsets, values_mask, WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX,
                                MAXCODE, NMAX, BITS, IS_INT, ROUNDING, HW_FP8)
    else:
        _emit_exact(bits, s, special, r24, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
                    WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING)


@triton.jit
def _emit_fast_or_exact(bits, s, special, inert, path, r24, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets,
                        values_mask, WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr, OUT_KIND: tl.constexpr,
                        MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr,
                        NMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr, ROUNDING: tl.constexpr,
                        HW_FP8: tl.constexpr):
    """`_emit` of a tile on the fast path (path > 0: `_fast_elements`) or off it (`_emit_exact`)."""
    if path > 0:
        code, out = _fast_elements(bits, s, special, inert, r24, OUT_KIND, MBITS, EMIN, EMAX, MAXCODE, NMAX,
                                   BITS, IS_INT, ROUNDING, HW_FP8)
        _store(code, out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
               WANT_CODES, WANT_VALUES)
    else:
        _emit_exact(bits, s, special, r24, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
                    WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING)


@triton.jit
def _emit_exact(bits, s, special, r24, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask,
                WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr, OUT_KIND: tl.constexpr, MBITS: tl.constexpr,
                EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr, BITS: tl.constexpr,
                IS_INT: tl.constexpr, ROUNDING: tl.constexpr):
    """`_emit` of a tile on the exact integer path."""
    code, out = _exact_elements(bits, s, special, r24, OUT_KIND, MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT,
                                ROUNDING)
    _store(code, out, out_offsets, out_mask, codes_ptr, values_ptr, values_offsets, values_mask, WANT_CODES, WANT_VALUES)


# ----------------------------------------------------------------------------- the kernel
@triton.jit
def _program_ids(WIDE_INDEX: tl.constexpr):
    """(pid_l, pid_b, pid_a) of a cast launch's grid, int64 when WIDE_INDEX (offsets beyond int32)."""
    pid_l = tl.program_id(0)
    pid_b = tl.program_id(1)
    pid_a = tl.program_id(2)
    if WIDE_INDEX:
        pid_l = pid_l.to(tl.int64)
        pid_b = pid_b.to(tl.int64)
        pid_a = pid_a.to(tl.int64)
    return pid_l, pid_b, pid_a


@triton.jit
def _mx_kernel(
    x_ptr, row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_scales_ptr, col_values_ptr,
    L, B, LP, BP, stride_a, stride_l, stride_b, seed_key, hadamard_key,
    IN_KIND: tl.constexpr, OUT_KIND: tl.constexpr, LAYOUT: tl.constexpr,
    WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr,
    MMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, FAST: tl.constexpr, HW_FP8: tl.constexpr, WIDE_INDEX: tl.constexpr,
    PROBE: tl.constexpr, RB: tl.constexpr, RS: tl.constexpr, CB: tl.constexpr, HADAMARD: tl.constexpr = False,
):
    """Quantize one (RB, RS, CB, 32) tile of the (A, L, B) view of x; see the module docstring.

    L, B: the view's sizes; LP, BP: the padded sizes of the codes (multiples of 32 along blocked
    dims). Codes and scales cover the padded shape, values the unpadded one. HADAMARD (LAYOUT_ROW or
    LAYOUT_COL, OUT_KIND float32): quantize the random Hadamard transform of the tile along the blocked
    axis (hadamard_key = mix32(Hadamard seed)); values then cover the padded shape too.
    """
    pid_l, pid_b, pid_a = _program_ids(WIDE_INDEX)
    rb = tl.arange(0, RB)[:, None, None, None]
    rs = tl.arange(0, RS)[None, :, None, None]
    cb = tl.arange(0, CB)[None, None, :, None]
    ce = tl.arange(0, 32)[None, None, None, :]
    row = (pid_l * RB + rb) * RS + rs
    col = (pid_b * CB + cb) * 32 + ce
    in_mask = (row < L) & (col < B)
    bits = _load_bits(x_ptr + pid_a * stride_a + row * stride_l + col * stride_b, in_mask, IN_KIND, HW_FP8)
    if HADAMARD:  # the transformed tensor has the padded shape: its values and counters are the codes' places
        tl.static_assert(OUT_KIND == 0, "the Hadamard transform writes float32 values")
        if LAYOUT == 0:
            bits = _random_hadamard_bits(bits, hadamard_key, 3)
            values_offsets = (pid_a * L + row) * BP + col
            values_mask = (row < L) & (col < BP)
        else:
            tl.static_assert(LAYOUT == 1, "the Hadamard transform runs with LAYOUT_ROW or LAYOUT_COL")
            bits = _random_hadamard_bits(bits, hadamard_key, 1)
            values_offsets = (pid_a * LP + row) * B + col
            values_mask = (row < LP) & (col < B)
    else:
        values_offsets = (pid_a * L + row) * B + col
        values_mask = in_mask
    magnitude = bits & 0x7FFFFFFF
    if ROUNDING == 3:
        r24 = _random_bits24(values_offsets, seed_key, WIDE_INDEX)
    else:
        r24 = 0

    tl.static_assert(LAYOUT != 2, "LAYOUT_BOTH runs in _mx_columns_kernel")
    if LAYOUT == 0:
        amax = tl.max(magnitude, axis=3)
        s, special = _scale_exponent(amax, MBITS, EMAX, MMAX, SCALE_MODE)
        inert = special | (amax == 0)
        path = _tile_path(s, special, inert, MBITS, EMIN, EMAX)
        nbp = BP // 32
        srow = (pid_l * RB + tl.arange(0, RB)[:, None, None]) * RS + tl.arange(0, RS)[None, :, None]
        sblk = pid_b * CB + tl.arange(0, CB)[None, None, :]
        tl.store(row_scales_ptr + (pid_a * L + srow) * nbp + sblk, (s + 127 + special.to(tl.int32) * (128 - s)).to(tl.uint8),
                 mask=(srow < L) & (sblk < nbp))
        _quantize_tile(bits, s[:, :, :, None], special[:, :, :, None], inert[:, :, :, None], path, r24,
                       (pid_a * L + row) * BP + col, (row < L) & (col < BP), row_codes_ptr, row_values_ptr,
                       values_offsets, values_mask, x_ptr, pid_l * (RB * RS), col, pid_a, L, B, L, BP,
                       stride_a, stride_l, stride_b, seed_key, IN_KIND, OUT_KIND, WANT_CODES, WANT_VALUES,
                       MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX, BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8,
                       WIDE_INDEX, PROBE, HADAMARD, RB * RS, True)
    if LAYOUT == 1:
        tl.static_assert(HADAMARD, "LAYOUT_COL without the Hadamard transform runs in _mx_column_tile_kernel")
        amax = tl.max(magnitude, axis=1)
        s, special = _scale_exponent(amax, MBITS, EMAX, MMAX, SCALE_MODE)
        inert = special | (amax == 0)
        path = _tile_path(s, special, inert, MBITS, EMIN, EMAX)
        sblk = pid_l * RB + tl.arange(0, RB)[:, None, None]
        scol = (pid_b * CB + tl.arange(0, CB)[None, :, None]) * 32 + tl.arange(0, 32)[None, None, :]
        tl.store(col_scales_ptr + (pid_a * (LP // 32) + sblk) * B + scol,
                 (s + 127 + special.to(tl.int32) * (128 - s)).to(tl.uint8), mask=(sblk < LP // 32) & (scol < B))
        _quantize_tile(bits, s[:, None, :, :], special[:, None, :, :], inert[:, None, :, :], path, r24,
                       (pid_a * LP + row) * B + col, (row < LP) & (col < B), col_codes_ptr, col_values_ptr,
                       values_offsets, values_mask, x_ptr, pid_l * (RB * RS), col, pid_a, L, B, LP, B,
                       stride_a, stride_l, stride_b, seed_key, IN_KIND, OUT_KIND, WANT_CODES, WANT_VALUES,
                       MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX, BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8,
                       WIDE_INDEX, PROBE, HADAMARD, RB * RS, False)
    if LAYOUT == 3:
        amax = tl.max(tl.max(magnitude, axis=3), axis=1)
        s, special = _scale_exponent(amax, MBITS, EMAX, MMAX, SCALE_MODE)
        inert = special | (amax == 0)
        path = _tile_path(s, special, inert, MBITS, EMIN, EMAX)
        sblk = pid_l * RB + tl.arange(0, RB)[:, None]
        sbcol = pid_b * CB + tl.arange(0, CB)[None, :]
        tl.store(row_scales_ptr + (pid_a * (LP // 32) + sblk) * (BP // 32) + sbcol,
                 (s + 127 + special.to(tl.int32) * (128 - s)).to(tl.uint8),
                 mask=(sblk < LP // 32) & (sbcol < BP // 32))
        _quantize_tile(bits, s[:, None, :, None], special[:, None, :, None], inert[:, None, :, None], path, r24,
                       (pid_a * LP + row) * BP + col, (row < LP) & (col < BP), row_codes_ptr, row_values_ptr,
                       values_offsets, values_mask, x_ptr, pid_l * (RB * RS), col, pid_a, L, B, LP, BP,
                       stride_a, stride_l, stride_b, seed_key, IN_KIND, OUT_KIND, WANT_CODES, WANT_VALUES,
                       MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX, BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8,
                       WIDE_INDEX, PROBE, HADAMARD, RB * RS, False)


@triton.jit
def _quantize_tile(bits, s, special, inert, path, r24, code_offsets, code_mask, codes_ptr, values_ptr, values_offsets,
                   values_mask, x_ptr, first_row, col, pid_a, L, B, code_rows, code_cols, stride_a, stride_l, stride_b,
                   seed_key, IN_KIND: tl.constexpr, OUT_KIND: tl.constexpr, WANT_CODES: tl.constexpr,
                   WANT_VALUES: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                   MAXCODE: tl.constexpr, NMAX: tl.constexpr, MMAX: tl.constexpr, BITS: tl.constexpr,
                   IS_INT: tl.constexpr, SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, FAST: tl.constexpr,
                   HW_FP8: tl.constexpr, WIDE_INDEX: tl.constexpr, PROBE: tl.constexpr, HADAMARD: tl.constexpr,
                   TILE_ROWS: tl.constexpr, ROW_BLOCKS: tl.constexpr):
    """`_emit` for a tile of `_mx_kernel` (rows first_row + [0, TILE_ROWS)), except that a tile off the common
    path (fast path, no NaN/Inf block) is quantized row by row from memory again, so the rarely taken paths do
    not hold tile-sized values in registers: a kernel's register count is that of its largest branch, and it
    bounds how many tiles are in flight. Rows re-derive their scales when ROW_BLOCKS (blocks along the row),
    else take the tile's (s etc. broadcast along the rows). Not with HADAMARD (memory holds x, not its
    transform) or PROBE, nor for roundings without a fast path."""
    if FAST and not HADAMARD and not PROBE and (ROUNDING == 0 or ROUNDING == 3):
        COMMON: tl.constexpr = 3 if ROUNDING == 3 and not IS_INT else 2
        path = _stochastic_path(bits, s, inert, path, EMIN, ROUNDING, IS_INT)
        if path == COMMON:
            _emit(bits, s, special, inert, COMMON, r24, code_offsets, code_mask, codes_ptr, values_ptr, values_offsets,
                  values_mask, WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT,
                  ROUNDING, FAST, HW_FP8, PROBE)
        else:
            for tile_row in range(TILE_ROWS):
                _row_refetched(x_ptr, codes_ptr, values_ptr, tl.zeros((1, 1, 1, 1), tl.int32) + (first_row + tile_row),
                               col, pid_a, L, B, code_rows, code_cols, stride_a, stride_l, stride_b, seed_key, s,
                               special, inert, path, IN_KIND, OUT_KIND, WANT_CODES, WANT_VALUES, MBITS, EMIN, EMAX,
                               MAXCODE, NMAX, MMAX, BITS, IS_INT, SCALE_MODE, ROUNDING, HW_FP8, WIDE_INDEX, ROW_BLOCKS)
    else:
        _emit(bits, s, special, inert, path, r24, code_offsets, code_mask, codes_ptr, values_ptr, values_offsets,
              values_mask, WANT_CODES, WANT_VALUES, OUT_KIND, MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT,
              ROUNDING, FAST, HW_FP8, PROBE)


@triton.jit
def _row_refetched(x_ptr, codes_ptr, values_ptr, row, col, pid_a, L, B, code_rows, code_cols, stride_a, stride_l,
                   stride_b, seed_key, tile_s, tile_special, tile_inert, tile_path, IN_KIND: tl.constexpr,
                   OUT_KIND: tl.constexpr, WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr, MBITS: tl.constexpr,
                   EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr,
                   MMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr, SCALE_MODE: tl.constexpr,
                   ROUNDING: tl.constexpr, HW_FP8: tl.constexpr, WIDE_INDEX: tl.constexpr, ROW_BLOCKS: tl.constexpr):
    """Codes/values of one row (row: shape (1, 1, 1, 1)) of a tile, loaded again, for `_quantize_tile`: with
    ROW_BLOCKS the row's scales and path are derived again from the row (the same steps, so the same values as
    the tile's, already stored), else the tile's are used."""
    in_mask = (row < L) & (col < B)
    bits = _load_bits(x_ptr + pid_a * stride_a + row * stride_l + col * stride_b, in_mask, IN_KIND, HW_FP8)
    values_offsets = (pid_a * L + row) * B + col
    if ROUNDING == 3:
        r24 = _random_bits24(values_offsets, seed_key, WIDE_INDEX)
    else:
        r24 = 0
    code_offsets = (pid_a * code_rows + row) * code_cols + col
    code_mask = (row < code_rows) & (col < code_cols)
    if ROW_BLOCKS:
        amax = tl.max(bits & 0x7FFFFFFF, axis=3)
        s, special = _scale_exponent(amax, MBITS, EMAX, MMAX, SCALE_MODE)
        inert = special | (amax == 0)
        path = _stochastic_path(bits, s[:, :, :, None], inert[:, :, :, None], _tile_path(s, special, inert, MBITS, EMIN, EMAX),
                                EMIN, ROUNDING, IS_INT)
        _emit(bits, s[:, :, :, None], special[:, :, :, None], inert[:, :, :, None], path, r24, code_offsets, code_mask,
              codes_ptr, values_ptr, values_offsets, in_mask, WANT_CODES, WANT_VALUES, OUT_KIND,
              MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING, True, HW_FP8, False)
    else:
        _emit(bits, tile_s, tile_special, tile_inert, _stochastic_path(bits, tile_s, tile_inert, tile_path, EMIN, ROUNDING, IS_INT),
              r24, code_offsets, code_mask, codes_ptr, values_ptr,
              values_offsets, in_mask, WANT_CODES, WANT_VALUES, OUT_KIND,
              MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING, True, HW_FP8, False)


@triton.jit
def _mx_column_tile_kernel(
    x_ptr, row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_scales_ptr, col_values_ptr,
    L, B, LP, BP, stride_a, stride_l, stride_b, seed_key,
    IN_KIND: tl.constexpr, OUT_KIND: tl.constexpr, LAYOUT: tl.constexpr,
    WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr,
    MMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, FAST: tl.constexpr, HW_FP8: tl.constexpr, WIDE_INDEX: tl.constexpr,
    PROBE: tl.constexpr, CB: tl.constexpr,
):
    """LAYOUT_COL (and LAYOUT_BOTH) in one pass: a 2-D tile of 32 rows x CB * 32 columns is loaded once, reduced
    along its rows (the column blocks' amax; for LAYOUT_BOTH also along each row's 32-column blocks) and quantized
    from registers; tiles off the common path are quantized row by row from memory again (`_quantize_tile`). The
    tile is 2-D on purpose: in a prototype of this kernel on the H200 (e4m3 column cast, 2 warps), the same tile
    loaded as a 3-D (32, CB, 32) block took 1.8x as long."""
    tl.static_assert(LAYOUT == 1 or LAYOUT == 2, "_mx_column_tile_kernel runs LAYOUT_COL and LAYOUT_BOTH")
    pid_l, pid_b, pid_a = _program_ids(WIDE_INDEX)
    row = pid_l * 32 + tl.arange(0, 32)[:, None]
    col = pid_b * (CB * 32) + tl.arange(0, CB * 32)[None, :]
    in_mask = (row < L) & (col < B)
    bits = _load_bits(x_ptr + pid_a * stride_a + row * stride_l + col * stride_b, in_mask, IN_KIND, HW_FP8)
    values_offsets = (pid_a * L + row) * B + col
    if ROUNDING == 3:
        r24 = _random_bits24(values_offsets, seed_key, WIDE_INDEX)
    else:
        r24 = 0
    amax = tl.max(bits & 0x7FFFFFFF, axis=0)
    s, special = _scale_exponent(amax, MBITS, EMAX, MMAX, SCALE_MODE)
    inert = special | (amax == 0)
    path = _tile_path(s, special, inert, MBITS, EMIN, EMAX)
    scol = pid_b * (CB * 32) + tl.arange(0, CB * 32)
    tl.store(col_scales_ptr + (pid_a * (LP // 32) + pid_l) * B + scol,
             (s + 127 + special.to(tl.int32) * (128 - s)).to(tl.uint8), mask=scol < B)
    _quantize_tile(bits, s[None, :], special[None, :], inert[None, :], path, r24, (pid_a * LP + row) * B + col,
                   (row < LP) & (col < B), col_codes_ptr, col_values_ptr, values_offsets, in_mask, x_ptr, pid_l * 32,
                   col, pid_a, L, B, LP, B, stride_a, stride_l, stride_b, seed_key, IN_KIND, OUT_KIND, WANT_CODES,
                   WANT_VALUES, MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX, BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8,
                   WIDE_INDEX, PROBE, False, 32, False)
    if LAYOUT == 2:
        row_amax = tl.max(tl.reshape(bits & 0x7FFFFFFF, (32, CB, 32)), axis=2)
        s_row, special_row = _scale_exponent(row_amax, MBITS, EMAX, MMAX, SCALE_MODE)
        inert_row = special_row | (row_amax == 0)
        path_row = _tile_path(s_row, special_row, inert_row, MBITS, EMIN, EMAX)
        nbp = BP // 32
        srow = pid_l * 32 + tl.arange(0, 32)[:, None]
        sblk = pid_b * CB + tl.arange(0, CB)[None, :]
        tl.store(row_scales_ptr + (pid_a * L + srow) * nbp + sblk,
                 (s_row + 127 + special_row.to(tl.int32) * (128 - s_row)).to(tl.uint8), mask=(srow < L) & (sblk < nbp))
        col4 = (pid_b * CB + tl.arange(0, CB)[None, None, :, None]) * 32 + tl.arange(0, 32)[None, None, None, :]
        _quantize_tile(bits, _spread_blocks(s_row, CB), _spread_blocks(special_row, CB), _spread_blocks(inert_row, CB),
                       path_row, r24, (pid_a * L + row) * BP + col, (row < L) & (col < BP), row_codes_ptr,
                       row_values_ptr, values_offsets, in_mask, x_ptr, pid_l * 32, col4, pid_a, L, B, L, BP, stride_a,
                       stride_l, stride_b, seed_key, IN_KIND, OUT_KIND, WANT_CODES, WANT_VALUES, MBITS, EMIN, EMAX,
                       MAXCODE, NMAX, MMAX, BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8, WIDE_INDEX, PROBE, False,
                       32, True)


@triton.jit
def _spread_blocks(per_block, CB: tl.constexpr):
    """(32, CB) per-block values as (32, CB * 32): each repeated over its block's 32 columns."""
    return tl.reshape(tl.broadcast_to(per_block[:, :, None], (32, CB, 32)), (32, CB * 32))


@triton.jit
def _mx_columns_kernel(
    x_ptr, row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_scales_ptr, col_values_ptr,
    L, B, LP, BP, stride_a, stride_l, stride_b, seed_key,
    IN_KIND: tl.constexpr, OUT_KIND: tl.constexpr, LAYOUT: tl.constexpr,
    WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr, NMAX: tl.constexpr,
    MMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, FAST: tl.constexpr, HW_FP8: tl.constexpr, WIDE_INDEX: tl.constexpr,
    PROBE: tl.constexpr, CB: tl.constexpr, ROWS_IN_FLIGHT: tl.constexpr = 8,
):
    """LAYOUT_COL / LAYOUT_BOTH for one 32-row block and CB * 32 columns, in two passes over the rows.

    Pass 1 keeps a running per-column max (every reduction stays inside a thread); pass 2 reads the
    rows again (from cache) and quantizes them with the column scales (and, for LAYOUT_BOTH, with
    the scales of their own 32-element row blocks). The row blocks may take the fast path when the
    tile's largest magnitude and its smallest nonzero magnitude both allow it: every row block's
    amax lies between the two, and the set of amax values the fast path accepts is an interval.
    """
    pid_l, pid_b, pid_a = _program_ids(WIDE_INDEX)
    cb = tl.arange(0, CB)[:, None]
    col = (pid_b * CB + cb) * 32 + tl.arange(0, 32)[None, :]
    col_in = col < B
    base = x_ptr + pid_a * stride_a + col * stride_b
    first_row = pid_l * 32

    column_amax = tl.zeros((CB, 32), dtype=tl.int32)
    smallest = tl.full((CB, 32), 0x7FFFFFFF, dtype=tl.int32)
    for r0 in range(0, 32, ROWS_IN_FLIGHT):  # loads in one basic block, so they are in flight together
        for r1 in tl.static_range(ROWS_IN_FLIGHT):
            row = first_row + r0 + r1
            key = _load_magnitude_key(base + row * stride_l, col_in & (row < L), IN_KIND)
            column_amax = tl.maximum(column_amax, key)
            if LAYOUT == 2:
                smallest = tl.minimum(smallest, tl.where(key == 0, 0x7FFFFFFF, key))
    column_amax = _magnitude_from_key(column_amax, IN_KIND)
    s_col, special_col = _scale_exponent(column_amax, MBITS, EMAX, MMAX, SCALE_MODE)
    inert_col = special_col | (column_amax == 0)
    path_col = _tile_path(s_col, special_col, inert_col, MBITS, EMIN, EMAX)
    tl.store(col_scales_ptr + (pid_a * (LP // 32) + pid_l) * B + col,
             (s_col + 127 + special_col.to(tl.int32) * (128 - s_col)).to(tl.uint8), mask=col_in)
    if LAYOUT == 2:
        tile_max = tl.max(tl.max(column_amax, axis=1), axis=0)
        tile_min = _magnitude_from_key(tl.min(tl.min(smallest, axis=1), axis=0), IN_KIND)
        path_rows = _amax_range_path(tile_max, tile_min, MBITS, EMIN, EMAX, MMAX, SCALE_MODE)
    else:
        path_rows = path_col

    if path_col == 2 and path_rows == 2:  # the common tile: fast path, no NaN/Inf (a constant 2 if not FAST)
        for r0 in range(0, 32, 2):  # both rows loaded before either is quantized
            row = first_row + r0
            bits_even = _load_bits(base + row * stride_l, col_in & (row < L), IN_KIND, HW_FP8)
            bits_odd = _load_bits(base + (row + 1) * stride_l, col_in & (row + 1 < L), IN_KIND, HW_FP8)
            _columns_row(bits_even, row, col, col_in, s_col, special_col, inert_col, 2, 2, pid_a, pid_b,
                         row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_values_ptr, L, B, LP, BP,
                         seed_key, OUT_KIND, LAYOUT, WANT_CODES, WANT_VALUES, MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX,
                         BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8, WIDE_INDEX, PROBE, CB)
            _columns_row(bits_odd, row + 1, col, col_in, s_col, special_col, inert_col, 2, 2, pid_a, pid_b,
                         row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_values_ptr, L, B, LP, BP,
                         seed_key, OUT_KIND, LAYOUT, WANT_CODES, WANT_VALUES, MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX,
                         BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8, WIDE_INDEX, PROBE, CB)
    else:  # one row at a time, so the rarely taken paths need fewer registers than the loop above
        for row_in_block in range(0, 32):
            row = first_row + row_in_block
            bits = _load_bits(base + row * stride_l, col_in & (row < L), IN_KIND, HW_FP8)
            _columns_row(bits, row, col, col_in, s_col, special_col, inert_col, path_col, path_rows, pid_a, pid_b,
                         row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_values_ptr, L, B, LP, BP,
                         seed_key, OUT_KIND, LAYOUT, WANT_CODES, WANT_VALUES, MBITS, EMIN, EMAX, MAXCODE, NMAX, MMAX,
                         BITS, IS_INT, SCALE_MODE, ROUNDING, FAST, HW_FP8, WIDE_INDEX, PROBE, CB)


@triton.jit
def _columns_row(bits, row, col, col_in, s_col, special_col, inert_col, path_col, path_rows, pid_a, pid_b,
                 row_codes_ptr, row_scales_ptr, row_values_ptr, col_codes_ptr, col_values_ptr, L, B, LP, BP, seed_key,
                 OUT_KIND: tl.constexpr, LAYOUT: tl.constexpr, WANT_CODES: tl.constexpr, WANT_VALUES: tl.constexpr,
                 MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAXCODE: tl.constexpr,
                 NMAX: tl.constexpr, MMAX: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr,
                 SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, FAST: tl.constexpr, HW_FP8: tl.constexpr, WIDE_INDEX: tl.constexpr,
                 PROBE: tl.constexpr, CB: tl.constexpr):
    """Pass 2 of `_mx_columns_kernel` for one row: column-wise codes/values, and row-wise ones for LAYOUT_BOTH."""
    if ROUNDING == 3:
        r24 = _random_bits24((pid_a * L + row) * B + col, seed_key, WIDE_INDEX)
    else:
        r24 = 0
    values_offsets = (pid_a * L + row) * B + col
    values_mask = col_in & (row < L)
    _emit(bits, s_col, special_col, inert_col, _stochastic_path(bits, s_col, inert_col, path_col, EMIN, ROUNDING, IS_INT),
          r24, (pid_a * LP + row) * B + col, col_in, col_codes_ptr,
          col_values_ptr, values_offsets, values_mask, WANT_CODES, WANT_VALUES, OUT_KIND,
          MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING, FAST, HW_FP8, PROBE)
    if LAYOUT == 2:
        nbp = BP // 32
        block_index = pid_b * CB + tl.arange(0, CB)
        row_amax = tl.max(bits & 0x7FFFFFFF, axis=1)
        s_row, special_row = _scale_exponent(row_amax, MBITS, EMAX, MMAX, SCALE_MODE)
        tl.store(row_scales_ptr + (pid_a * L + row) * nbp + block_index,
                 (s_row + 127 + special_row.to(tl.int32) * (128 - s_row)).to(tl.uint8),
                 mask=(block_index < nbp) & (row < L))
        inert_row = (special_row | (row_amax == 0))[:, None]
        _emit(bits, s_row[:, None], special_row[:, None], inert_row,
              _stochastic_path(bits, s_row[:, None], inert_row, path_rows, EMIN, ROUNDING, IS_INT), r24,
              (pid_a * L + row) * BP + col, (col < BP) & (row < L), row_codes_ptr, row_values_ptr,
              values_offsets, values_mask, WANT_CODES, WANT_VALUES, OUT_KIND,
              MBITS, EMIN, EMAX, MAXCODE, NMAX, BITS, IS_INT, ROUNDING, FAST, HW_FP8, PROBE)


# ----------------------------------------------------------------------------- launchers
import functools  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from mxlab.numerics.formats import ElementFormat  # noqa: E402
from mxlab.numerics.reference import float32_fraction_bits  # noqa: E402

BLOCK = 32
SCALE_MODE_IDS = {"floor": SCALE_FLOOR, "ceil": SCALE_CEIL, "rceil": SCALE_RCEIL, "even": SCALE_EVEN}
ROUNDING_IDS = {
    "nearest_even": ROUND_NEAREST_EVEN,
    "nearest_away": ROUND_NEAREST_AWAY,
    "toward_zero": ROUND_TOWARD_ZERO,
    "stochastic": ROUND_STOCHASTIC,
}
DTYPE_KINDS = {torch.float32: KIND_FP32, torch.bfloat16: KIND_BF16, torch.float16: KIND_FP16}
_BITS_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
_MAX_GRID_YZ = 65535
HARDWARE_FP8_FORMATS = ("e4m3", "e5m2")
# sm_89 is left out: Triton 3.6 lowers float32 -> FP8 there through an fp16 rounded toward zero (double rounding)
HARDWARE_FP8_MIN_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class TileConfig:
    """Elements per program and warps: a tile is (rows, columns) of the (L, B) view.

    `column_passes` (column-wise and both-at-once casts without the Hadamard transform): 1 runs
    `_mx_column_tile_kernel` (32 rows x col_blocks * 32 columns held in registers as one 2-D tile: one load of
    every element, the column reduction across threads); 2 runs `_mx_columns_kernel` on the same tile (a max
    pass then a quantize pass over the rows, rows re-read from cache). `rows_in_flight` (column_passes=2): rows the first pass loads
    before it reduces them (a power of two up to 32). Every choice gives the same bits; `mxlab bench sass`
    shows their static costs, `mxlab bench quant` their speed.
    """

    rows: int = 16
    col_blocks: int = 8
    num_warps: int = 4
    column_passes: int = 2
    rows_in_flight: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.rows_in_flight, int) and self.rows_in_flight > 32:
            raise ValueError(f"TileConfig.rows_in_flight = {self.rows_in_flight!r}; accepted: 1, 2, 4, 8, 16, 32")
        for name in ("rows", "col_blocks", "num_warps", "rows_in_flight"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"TileConfig.{name} = {value!r}; accepted: a power of two >= 1")
        if self.column_passes not in (1, 2):
            raise ValueError(f"TileConfig.column_passes = {self.column_passes!r}; accepted: 1, 2")


ROW_TILE = TileConfig(rows=16, col_blocks=8, num_warps=4)  # _mx_kernel, LAYOUT_ROW
# _mx_kernel, LAYOUT_ROW with stochastic rounding (more arithmetic per element; one warp, so the tile-wide path-3
# decision needs no CTA barrier): H200 `bench quant --sweep-tiles` at 7d3595b, 16384x8192 BF16 e4m3 fake-quantize,
# fraction of copy: 4x8x1 0.582, 4x4x1 0.583, 2x8x1 0.564, 8x8x2 0.511, 8x4x2 0.527, 16x8x4 (ROW_TILE) 0.404
STOCHASTIC_ROW_TILE = TileConfig(rows=4, col_blocks=8, num_warps=1)
# Column-wise and both-at-once casts on the hardware FP8 path: _mx_column_tile_kernel, 32 x 128 tiles, 1 warp (H200
# `bench quant --sweep-tiles` at 18afe49, e4m3 cast of 16384x8192 BF16, fraction of copy: column cast 0.810, both cast
# 0.701; 2 warps 0.601 / 0.550; 32 x 256 with 2 warps 0.631 / 0.668; _mx_columns_kernel at 32 x 512, 4 warps: 0.632 / 0.590)
COL_TILE = TileConfig(rows=32, col_blocks=4, num_warps=1, column_passes=1)
# On the integer paths (other formats and roundings, GPUs before sm_90, the interpreter): _mx_columns_kernel, 32 x 512,
# two passes, whose rows need fewer registers than a one-pass tile of that arithmetic (H200, e4m3 integer fast path:
# with COL_TILE column cast 0.270, both cast 0.118 of copy at 7f18837; with this tile 0.530 / 0.419 at 05aa70e)
INTEGER_COL_TILE = TileConfig(rows=32, col_blocks=16, num_warps=4)
SQUARE_TILE = TileConfig(rows=32, col_blocks=4, num_warps=4)  # _mx_kernel, LAYOUT_TILE
HADAMARD_COL_TILE = TileConfig(rows=32, col_blocks=4, num_warps=4)  # _mx_kernel, LAYOUT_COL with HADAMARD
HADAMARD_BLOCK = 32  # the transform's block: the MX block, so one tile holds whole Hadamard blocks
HADAMARD_COMPILE_OPTIONS = dict(enable_fp_fusion=False)  # no multiply-add contraction: float32 rounds as in PyTorch


def _default_tile(layout: int, hadamard: bool, stochastic: bool = False, hardware_fp8: bool = False) -> TileConfig:
    """The launch shape of a call (hardware_fp8: its fast path converts with the GPU's FP8 instructions)."""
    if layout == LAYOUT_ROW:
        return STOCHASTIC_ROW_TILE if stochastic and not hadamard else ROW_TILE
    if layout == LAYOUT_TILE:
        return SQUARE_TILE
    if hadamard:
        return HADAMARD_COL_TILE
    return COL_TILE if hardware_fp8 else INTEGER_COL_TILE


def _mix32_host(z: int) -> int:
    mask = 0xFFFFFFFF
    z ^= z >> 16
    z = (z * 0x7FEB352D) & mask
    z ^= z >> 15
    z = (z * 0x846CA68B) & mask
    return z ^ (z >> 16)


@functools.lru_cache(maxsize=None)
def _format_constants(fmt: ElementFormat) -> dict:  # cached: callers only unpack it
    nmax = fmt.max_normal / 2.0 ** (fmt.emax - fmt.mbits)
    if nmax != int(nmax):
        raise ValueError(f"format {fmt.name}: max normal {fmt.max_normal} is not an integer multiple of its top quantum")
    return dict(
        MBITS=fmt.mbits, EMIN=fmt.emin, EMAX=fmt.emax, MAXCODE=fmt.max_code, NMAX=int(nmax),
        MMAX=float32_fraction_bits(fmt.max_normal), BITS=fmt.bits, IS_INT=fmt.is_int,
    )


def _cdiv(size: int, step: int) -> int:
    """ceil(size / step) on the host (triton.cdiv is a JIT function: about 2 us per call there)."""
    return -(-size // step)


def _ceil_to_block(size: int) -> int:
    return _cdiv(size, BLOCK) * BLOCK


def _pow2_at_most(value: int, cap: int) -> int:
    return max(1, min(cap, 1 << max(0, math.ceil(math.log2(max(value, 1))))))


@dataclass(frozen=True)
class _View:
    """x as an (A, L, B) view whose blocks run along B (LAYOUT_ROW) or L (the others)."""

    x3: torch.Tensor
    layout: int
    lp: int  # padded L (codes)
    bp: int  # padded B (codes)
    padded_shape: tuple[int, ...]
    scale_shape: tuple[int, ...]


@functools.lru_cache(maxsize=4096)
def _view_geometry(shape: tuple[int, ...], block: int | tuple[int, int], axis: int, pad: bool,
                   layout: int | None) -> tuple[tuple[int, int, int], int, int, int, tuple[int, ...], tuple[int, ...]]:
    """(the (A, L, B) shape, layout, lp, bp, padded shape, scale shape) of `_make_view` for a tensor of `shape`
    (cached: a function of the shape and the options alone). Refuses (ValueError) a blocked dim that is not a
    multiple of 32 without pad."""
    rank = len(shape)
    axis %= rank
    if block == (BLOCK, BLOCK):
        dims = (rank - 2, rank - 1)
        shape3 = (math.prod(shape[:-2]), shape[-2], shape[-1])
        layout = LAYOUT_TILE
    elif axis == rank - 1 and layout != LAYOUT_BOTH:
        dims = (axis,)
        shape3 = (1, math.prod(shape[:-1]), shape[-1])
        layout = LAYOUT_ROW
    else:
        dims = (axis,) if layout != LAYOUT_BOTH else (0, 1)
        shape3 = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))
        layout = LAYOUT_COL if layout is None else layout
    for dim in dims:
        if shape[dim] % BLOCK and not pad:
            raise ValueError(
                f"dimension {dim} of x has size {shape[dim]}, not a multiple of the block size {BLOCK}; pass pad=True"
            )
    padded_shape = tuple(_ceil_to_block(size) if dim in dims else size for dim, size in enumerate(shape))
    scale_shape = tuple(size // BLOCK if dim in dims else size for dim, size in enumerate(padded_shape))
    _, length, width = shape3
    lp = _ceil_to_block(length) if layout != LAYOUT_ROW else length
    bp = _ceil_to_block(width) if layout in (LAYOUT_ROW, LAYOUT_TILE, LAYOUT_BOTH) else width
    return shape3, layout, lp, bp, padded_shape, scale_shape


def _make_view(x: torch.Tensor, block: int | tuple[int, int], axis: int, pad: bool, layout: int | None = None) -> _View:
    shape3, layout, lp, bp, padded_shape, scale_shape = _view_geometry(tuple(x.shape), block, axis, pad, layout)
    return _View(x.reshape(shape3), layout, lp, bp, padded_shape, scale_shape)


def unsupported_reason(x: torch.Tensor, block: int | tuple[int, int], axis: int, hadamard: int | None = None) -> str | None:
    """Why the Triton kernels cannot run this call (None when they can).

    They need a float32/bfloat16/float16 tensor on a CUDA device (or any device under
    TRITON_INTERPRET=1) with a grid that fits the launch limits. `hadamard`: the block of a random
    Hadamard transform applied first (None: none); the kernels fuse only block 32 with 1-D MX blocks.
    """
    if hadamard is not None and (hadamard != HADAMARD_BLOCK or block != BLOCK):
        return f"Hadamard block {hadamard} with MX block {block} (the kernels fuse Hadamard block 32 with MX block 32)"
    if x.dtype not in DTYPE_KINDS:
        return f"dtype {x.dtype} (the kernels take float32, bfloat16, float16)"
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"device {x.device} (the kernels run on CUDA, or anywhere under TRITON_INTERPRET=1)"
    if x.numel() == 0:
        return "an empty tensor"
    (count, _, _), layout, _, bp, _, _ = _view_geometry(tuple(x.shape), block, axis, True, None)
    tile = _default_tile(layout, hadamard is not None, hardware_fp8=True)  # the launch with the most programs
    if count > _MAX_GRID_YZ or _cdiv(bp, tile.col_blocks * BLOCK) > _MAX_GRID_YZ:
        return f"shape {tuple(x.shape)} needs a grid beyond the launch limit"
    return None


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def hardware_fp8_applies(device: torch.device | str, fmt: ElementFormat, rounding: str) -> bool:
    """Whether the fast path of a call on `device` converts elements with the GPU's FP8 instructions.

    True for e4m3/e5m2 with round to nearest even on a CUDA device of compute capability >= 9.0,
    unless TRITON_INTERPRET=1 (whose numpy FP8 emulation is not the hardware's). Every other call
    (other formats and roundings, older GPUs, the interpreter, CPU tensors) keeps the integer path.
    """
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if fmt.name not in HARDWARE_FP8_FORMATS or rounding != "nearest_even":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_capability(index) >= HARDWARE_FP8_MIN_CAPABILITY


def _launch(view: _View, fmt: ElementFormat, scale_mode: str, rounding: str, seed: int | None,
            want_codes: bool, want_values: bool, fast: bool = True, tile: TileConfig | None = None,
            probe: bool = False, hw_fp8: bool = True, hadamard_seed: int | None = None) -> dict:
    """Run the kernel on a view; returns the output tensors by name, and under "kernel" what the launch
    returned (the compiled kernel on a GPU, whose .asm shows the instructions). `hadamard_seed` (LAYOUT_ROW
    or LAYOUT_COL only): quantize the random Hadamard transform (block 32) of x along the blocked axis;
    the values are then float32 of the padded shape."""
    x3 = view.x3
    count, length, width = x3.shape
    layout = view.layout
    device = x3.device
    hadamard = hadamard_seed is not None
    if hadamard and layout not in (LAYOUT_ROW, LAYOUT_COL):
        raise ValueError(f"the fused Hadamard transform runs with 1-D blocks along one axis, not layout {layout}")
    hardware_path = fast and hw_fp8 and hardware_fp8_applies(device, fmt, rounding)
    tile = tile or _default_tile(layout, hadamard, rounding == "stochastic", hardware_path)
    col_blocks = _pow2_at_most(_cdiv(view.bp, BLOCK), tile.col_blocks)
    if layout == LAYOUT_ROW:
        rb, rs = _pow2_at_most(length, tile.rows), 1
    else:
        rb, rs = 1, BLOCK
    spans = [(size - 1) * abs(stride) for size, stride in zip(x3.shape, x3.stride())]
    wide = max(sum(spans) + 1, count * view.lp * view.bp) >= 2**31 - 1
    empty = torch.empty(0, dtype=torch.uint8, device=device)
    outputs: dict[str, object] = {}

    def codes_and_scales(codes_shape, scale_shape):
        codes = torch.empty(codes_shape, dtype=torch.uint8, device=device) if want_codes else empty
        return codes, torch.empty(scale_shape, dtype=torch.uint8, device=device)

    def values():
        if not want_values:
            return empty, empty
        if hadamard:  # the transformed tensor: float32, padded shape
            out = torch.empty((count, view.lp, view.bp), dtype=torch.float32, device=device)
        else:
            out = torch.empty((count, length, width), dtype=x3.dtype, device=device)
        return out, out.view(_BITS_DTYPES[out.dtype])

    row_codes = row_scales = row_values = row_bits = empty
    col_codes = col_scales = col_values = col_bits = empty
    if layout in (LAYOUT_ROW, LAYOUT_BOTH):
        row_codes, row_scales = codes_and_scales((count, length, view.bp), (count, length, view.bp // BLOCK))
        row_values, row_bits = values()
    if layout in (LAYOUT_COL, LAYOUT_BOTH):
        col_codes, col_scales = codes_and_scales((count, view.lp, width), (count, view.lp // BLOCK, width))
        col_values, col_bits = values()
    if layout == LAYOUT_TILE:
        row_codes, row_scales = codes_and_scales((count, view.lp, view.bp), (count, view.lp // BLOCK, view.bp // BLOCK))
        row_values, row_bits = values()
    grid = (_cdiv(view.lp, rb * rs), _cdiv(view.bp, col_blocks * BLOCK), count)
    seed_key = _mix32_host(seed & 0xFFFFFFFF) if rounding == "stochastic" else 0
    arguments = (
        x3.view(_BITS_DTYPES[x3.dtype]), row_codes, row_scales, row_bits, col_codes, col_scales, col_bits,
        length, width, view.lp, view.bp, x3.stride(0), x3.stride(1), x3.stride(2), seed_key,
    )
    options = dict(
        IN_KIND=DTYPE_KINDS[x3.dtype], OUT_KIND=KIND_FP32 if hadamard else DTYPE_KINDS[x3.dtype], LAYOUT=layout,
        WANT_CODES=want_codes, WANT_VALUES=want_values, **_format_constants(fmt),
        SCALE_MODE=SCALE_MODE_IDS[scale_mode], ROUNDING=ROUNDING_IDS[rounding], FAST=fast,
        HW_FP8=hardware_path and not probe,
        WIDE_INDEX=wide, PROBE=probe, CB=col_blocks, num_warps=tile.num_warps,
    )
    if layout in (LAYOUT_COL, LAYOUT_BOTH) and not hadamard and tile.column_passes == 2:
        kernel = _mx_columns_kernel[grid](*arguments, ROWS_IN_FLIGHT=tile.rows_in_flight, **options)
    elif layout in (LAYOUT_COL, LAYOUT_BOTH) and not hadamard:
        kernel = _mx_column_tile_kernel[grid](*arguments, **options)
    elif hadamard:
        hadamard_key = _mix32_host(hadamard_seed & 0xFFFFFFFF)
        kernel = _mx_kernel[grid](*arguments, hadamard_key, RB=rb, RS=rs, HADAMARD=True, **HADAMARD_COMPILE_OPTIONS,
                                  **options)
    else:
        kernel = _mx_kernel[grid](*arguments, 0, RB=rb, RS=rs, **options)
    outputs.update(row_codes=row_codes, row_scales=row_scales, row_values=row_values,
                   col_codes=col_codes, col_scales=col_scales, col_values=col_values, kernel=kernel)
    return outputs


def _check_call(x: torch.Tensor, scale_mode: str, rounding: str, seed: int | None) -> None:
    if x.dtype not in DTYPE_KINDS:
        raise ValueError(f"unsupported dtype {x.dtype}; accepted: float32, bfloat16, float16")
    if rounding not in ROUNDING_IDS:
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(ROUNDING_IDS)}")
    if scale_mode not in SCALE_MODE_IDS:
        raise ValueError(f"unknown scale_mode {scale_mode!r}; accepted: {', '.join(SCALE_MODE_IDS)}")
    if rounding == "stochastic" and not isinstance(seed, int):
        raise ValueError(f"rounding='stochastic' needs an integer seed, got seed={seed!r}")


def quantize(x: torch.Tensor, fmt: ElementFormat, *, block: int | tuple[int, int] = 32, axis: int = -1,
             scale_mode: str = "floor", rounding: str = "nearest_even", seed: int | None = None, pad: bool = False,
             fast: bool = True, tile: TileConfig | None = None, hw_fp8: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) as mxlab.numerics.reference computes them: codes uint8 of the padded shape, scale bytes
    uint8 of the padded shape with the blocked dims divided by 32.

    Refuses (ValueError) an unsupported dtype, an unknown rounding, stochastic rounding without a
    seed, and a blocked dim that is not a multiple of 32 unless pad=True. `fast=False` forces the
    exact integer path everywhere (for tests); `hw_fp8=False` keeps the integer fast path where the
    hardware FP8 conversion would run (`hardware_fp8_applies`; for tests and benchmarks); `tile`
    overrides the launch shape (for benchmarks). Every choice gives the same bits.
    """
    _check_call(x, scale_mode, rounding, seed)
    view = _make_view(x, block, axis, pad)
    out = _launch(view, fmt, scale_mode, rounding, seed, want_codes=True, want_values=False, fast=fast, tile=tile,
                  hw_fp8=hw_fp8)
    prefix = "col" if view.layout == LAYOUT_COL else "row"
    return out[f"{prefix}_codes"].reshape(view.padded_shape), out[f"{prefix}_scales"].reshape(view.scale_shape)


def fake_quantize(x: torch.Tensor, fmt: ElementFormat, *, block: int | tuple[int, int] = 32, axis: int = -1,
                  scale_mode: str = "floor", rounding: str = "nearest_even", seed: int | None = None,
                  pad: bool = False, fast: bool = True, tile: TileConfig | None = None,
                  hw_fp8: bool = True) -> torch.Tensor:
    """dequantize(quantize(x)) in x's dtype and shape, one read and one write. Refuses what `quantize` refuses;
    `fast`, `hw_fp8`, `tile` as in `quantize`."""
    _check_call(x, scale_mode, rounding, seed)
    view = _make_view(x, block, axis, pad)
    out = _launch(view, fmt, scale_mode, rounding, seed, want_codes=False, want_values=True, fast=fast, tile=tile,
                  hw_fp8=hw_fp8)
    prefix = "col" if view.layout == LAYOUT_COL else "row"
    return out[f"{prefix}_values"].reshape(x.shape)


def _hadamard_launch(x: torch.Tensor, fmt: ElementFormat, axis: int, hadamard_seed: int, scale_mode: str,
                     rounding: str, seed: int | None, pad: bool, want_codes: bool, fast: bool,
                     tile: TileConfig | None, hw_fp8: bool) -> tuple[_View, dict, str]:
    _check_call(x, scale_mode, rounding, seed)
    if isinstance(hadamard_seed, bool) or not isinstance(hadamard_seed, int):
        raise ValueError(f"hadamard_seed must be an integer, got {hadamard_seed!r}")
    view = _make_view(x, BLOCK, axis, pad)
    out = _launch(view, fmt, scale_mode, rounding, seed, want_codes=want_codes, want_values=not want_codes,
                  fast=fast, tile=tile, hw_fp8=hw_fp8, hadamard_seed=hadamard_seed)
    return view, out, "col" if view.layout == LAYOUT_COL else "row"


def hadamard_quantize(x: torch.Tensor, fmt: ElementFormat, *, axis: int = -1, hadamard_seed: int,
                      scale_mode: str = "floor", rounding: str = "nearest_even", seed: int | None = None,
                      pad: bool = False, fast: bool = True, tile: TileConfig | None = None,
                      hw_fp8: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of mxlab.numerics.hadamard.random_hadamard(x zero-padded along `axis` to a multiple of 32, 32,
    axis, hadamard_seed) quantized along `axis` with 1-D blocks of 32, from one read of x: shapes as `quantize`.

    Refuses what `quantize` refuses, and a hadamard_seed that is not an integer. Stochastic rounding counts
    elements of the transformed (padded) tensor. `fast`, `hw_fp8`, `tile` as in `quantize`.
    """
    view, out, prefix = _hadamard_launch(x, fmt, axis, hadamard_seed, scale_mode, rounding, seed, pad, True, fast,
                                         tile, hw_fp8)
    return out[f"{prefix}_codes"].reshape(view.padded_shape), out[f"{prefix}_scales"].reshape(view.scale_shape)


def hadamard_fake_quantize(x: torch.Tensor, fmt: ElementFormat, *, axis: int = -1, hadamard_seed: int,
                           scale_mode: str = "floor", rounding: str = "nearest_even", seed: int | None = None,
                           pad: bool = False, fast: bool = True, tile: TileConfig | None = None,
                           hw_fp8: bool = True) -> torch.Tensor:
    """float32 fake_quantize(random_hadamard(x.float() zero-padded along `axis` to a multiple of 32, 32, axis,
    hadamard_seed), fmt, axis=axis) in one read and one write; the shape is x's, padded along `axis` when
    pad=True. Refuses what `hadamard_quantize` refuses."""
    view, out, prefix = _hadamard_launch(x, fmt, axis, hadamard_seed, scale_mode, rounding, seed, pad, False, fast,
                                         tile, hw_fp8)
    return out[f"{prefix}_values"].reshape(view.padded_shape)


def _rowcol(x: torch.Tensor, fmt: ElementFormat, scale_mode: str, rounding: str, seed: int | None, pad: bool,
            want_codes: bool, want_values: bool, fast: bool, tile: TileConfig | None,
            hw_fp8: bool) -> tuple[_View, dict]:
    _check_call(x, scale_mode, rounding, seed)
    if x.dim() != 2:
        raise ValueError(f"row-and-column quantization takes a 2-D tensor, got shape {tuple(x.shape)}")
    view = _make_view(x, 32, 0, pad, layout=LAYOUT_BOTH)
    return view, _launch(view, fmt, scale_mode, rounding, seed, want_codes, want_values, fast=fast, tile=tile,
                         hw_fp8=hw_fp8)


def quantize_rowcol(x: torch.Tensor, fmt: ElementFormat, *, scale_mode: str = "floor", rounding: str = "nearest_even",
                    seed: int | None = None, pad: bool = False, fast: bool = True, tile: TileConfig | None = None,
                    hw_fp8: bool = True):
    """((row codes, row scales), (column codes, column scales)) of a 2-D x from one read.

    The row-wise pair equals quantize(x, axis=-1), the column-wise pair quantize(x, axis=0), both
    from x itself (padded shapes as `quantize`). Refuses a tensor that is not 2-D.
    """
    view, out = _rowcol(x, fmt, scale_mode, rounding, seed, pad, True, False, fast, tile, hw_fp8)
    rows, cols = x.shape
    row_pair = (out["row_codes"].reshape(rows, view.bp), out["row_scales"].reshape(rows, view.bp // BLOCK))
    col_pair = (out["col_codes"].reshape(view.lp, cols), out["col_scales"].reshape(view.lp // BLOCK, cols))
    return row_pair, col_pair


def fake_quantize_rowcol(x: torch.Tensor, fmt: ElementFormat, *, scale_mode: str = "floor",
                         rounding: str = "nearest_even", seed: int | None = None, pad: bool = False,
                         fast: bool = True, tile: TileConfig | None = None,
                         hw_fp8: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(along_last, along_first): fake_quantize(x, axis=-1) and fake_quantize(x, axis=0) of a 2-D x, one read."""
    _, out = _rowcol(x, fmt, scale_mode, rounding, seed, pad, False, True, fast, tile, hw_fp8)
    return out["row_values"].reshape(x.shape), out["col_values"].reshape(x.shape)
