"""Device helpers of the MX cast kernels: constants, float32 bit manipulation, counter-based random bits,
the fused random Hadamard transform, and block scales (docs/numerics.md: "The cast kernels")."""

from __future__ import annotations

import triton
import triton.language as tl

from mxlab.numerics import vocab
from mxlab.numerics.vocab import Layout, Rounding, ScaleMode

# The kernel ids of mxlab.numerics.vocab as constexprs, which device code compares with (a global that @jit code
# reads must be a constexpr); CODE, the packed kernel code of `vocab.kernel_code`, is read by `code_field`.
LAYOUT_ROW = tl.constexpr(Layout.ROW.kernel_id)
LAYOUT_COL = tl.constexpr(Layout.COLUMN.kernel_id)
LAYOUT_BOTH = tl.constexpr(Layout.BOTH.kernel_id)
LAYOUT_TILE = tl.constexpr(Layout.TILE.kernel_id)
SCALE_FLOOR = tl.constexpr(ScaleMode.FLOOR.kernel_id)
SCALE_CEIL = tl.constexpr(ScaleMode.CEIL.kernel_id)
SCALE_RCEIL = tl.constexpr(ScaleMode.RCEIL.kernel_id)
SCALE_EVEN = tl.constexpr(ScaleMode.EVEN.kernel_id)
ROUND_NEAREST_EVEN = tl.constexpr(Rounding.NEAREST_EVEN.kernel_id)
ROUND_NEAREST_AWAY = tl.constexpr(Rounding.NEAREST_AWAY.kernel_id)
ROUND_TOWARD_ZERO = tl.constexpr(Rounding.TOWARD_ZERO.kernel_id)
ROUND_STOCHASTIC = tl.constexpr(Rounding.STOCHASTIC.kernel_id)
code_field = triton.constexpr_function(vocab.code_field)

KIND_FP32 = tl.constexpr(0)  # pointer to int32 bit patterns
KIND_BF16 = tl.constexpr(1)  # pointer to int16 bit patterns
KIND_FP16 = tl.constexpr(2)  # pointer to int16 bit patterns

# A tile's path (`_tile_path`, `_stochastic_path`): the exact integer steps; the fast path; the fast path with no
# NaN/Inf block; stochastic rounding where every element is zero or element-normal
PATH_EXACT = tl.constexpr(0)
PATH_FAST = tl.constexpr(1)
PATH_FINITE = tl.constexpr(2)
PATH_NORMAL_STOCHASTIC = tl.constexpr(3)

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
    if IN_KIND == KIND_FP32:
        bits = tl.load(pointers, mask=mask, other=0)
    elif IN_KIND == KIND_BF16 and CONVERT_BF16:
        bits = (
            tl.load(pointers, mask=mask, other=0)
            .to(tl.bfloat16, bitcast=True)
            .to(tl.float32)
            .to(tl.int32, bitcast=True)
        )
    elif IN_KIND == KIND_BF16:
        bits = tl.load(pointers, mask=mask, other=0).to(tl.int32) << 16
    else:
        half = tl.load(pointers, mask=mask, other=0).to(tl.float16, bitcast=True)
        bits = half.to(tl.float32).to(tl.int32, bitcast=True)  # exact widening
    return bits


@triton.jit
def _load_tile(
    x_ptr,
    row,
    col,
    pid_a,
    L,
    B,
    stride_a,
    stride_l,
    stride_b,
    seed_key,
    IN_KIND: tl.constexpr,
    CODE: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    """(float32 bits, mask, values offsets, random bits) of the elements (row, col) of the (A, L, B) view in
    batch pid_a: bits 0 where masked, offsets into the unpadded (A, L, B) output, and the stochastic-rounding
    bits of those offsets (0 for the other roundings of the kernel code CODE)."""
    in_mask = (row < L) & (col < B)
    pointers = x_ptr + pid_a * stride_a + row * stride_l + col * stride_b
    bits = _load_bits(pointers, in_mask, IN_KIND, code_field(CODE, "hw_fp8"))
    values_offsets = (pid_a * L + row) * B + col
    if code_field(CODE, "rounding") == ROUND_STOCHASTIC:
        r24 = _random_bits24(values_offsets, seed_key, WIDE_INDEX)
    else:
        r24 = 0
    return bits, in_mask, values_offsets, r24


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
    subnormal = tl.where(
        k >= 0, n << tl.minimum(tl.maximum(k, 0), 31), _rne_shift(n, tl.minimum(tl.maximum(-k, 0), 30))
    )
    bits = tl.where(value_exp >= -126, normal, subnormal)
    bits = tl.where(value_exp > 127, 0x7F800000, bits)
    return tl.where(n == 0, 0, bits)


@triton.jit
def _f32_bits_to_output(bits, OUT_KIND: tl.constexpr):
    """float32 bits rounded (nearest even) to the output dtype's bit pattern (int32/int16)."""
    if OUT_KIND == KIND_FP32:
        out = bits
    elif OUT_KIND == KIND_BF16:
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
    last axis, 1: its row axis); hadamard_key = mix32(seed).
    docs/numerics.md, "Random Hadamard transform fused with the cast"."""
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
def _scale_exponent(amax, CODE: tl.constexpr):
    """(S, special) for block amax bit patterns: the clamped unbiased scale exponent of the kernel code CODE's
    format and scale mode, and NaN/Inf blocks."""
    MBITS: tl.constexpr = code_field(CODE, "mbits")
    EMAX: tl.constexpr = code_field(CODE, "emax")
    SCALE_MODE: tl.constexpr = code_field(CODE, "scale_mode")
    exponent = amax >> 23
    fraction = amax & 0x7FFFFF
    if EMAX >= 1 or SCALE_MODE == SCALE_FLOOR:
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
    if SCALE_MODE == SCALE_CEIL:
        s += (m != 0).to(tl.int32)
    elif SCALE_MODE == SCALE_RCEIL:
        s += (m > code_field(CODE, "mmax")).to(tl.int32)
    elif SCALE_MODE == SCALE_EVEN:
        keep = m >> (23 - MBITS)
        rest = m & ((1 << (23 - MBITS)) - 1)
        half = 1 << (22 - MBITS)
        up = (rest > half) | ((rest == half) & ((keep & 1) == 1))
        s += (keep + up.to(tl.int32)) >> MBITS
    s = tl.minimum(tl.maximum(s, -127), 127)
    if EMAX == 0 and SCALE_MODE != SCALE_FLOOR:
        s = tl.where(amax == 0, -127, s)  # otherwise already -127 (above)
    return s, amax >= 0x7F800000


@triton.jit
def _fast_path_ok(s, inert, CODE: tl.constexpr):
    """Per block: the fast path is exact for this scale (inert blocks, all-zero or NaN/Inf, always are)."""
    qe = s + code_field(CODE, "emin") - code_field(CODE, "mbits")
    ok = (qe >= -125) & (qe <= 104) & (s + code_field(CODE, "emax") <= 126)
    return ok | inert


@triton.jit
def _tile_path(s, special, inert, CODE: tl.constexpr):
    """The path of a whole tile (one reduction): PATH_EXACT, the exact integer steps; PATH_FAST (`_fast_path_ok`
    for every block); PATH_FINITE, the fast path and no NaN/Inf block (the hardware FP8 path then needs no
    per-element select)."""
    tl.static_assert(PATH_EXACT == 0 and PATH_FAST == 1 and PATH_FINITE == 2, "the sum below counts the paths")
    ok = _fast_path_ok(s, inert, CODE)
    return tl.min(ok.to(tl.int32) + (ok & ~special).to(tl.int32))


@triton.jit
def _block_scales(amax, CODE: tl.constexpr):
    """(S, special, inert, path) of blocks with these amax bit patterns: the scale exponent, NaN/Inf blocks,
    blocks that need no rounding (NaN/Inf or all zero), and the tile's `_tile_path`."""
    s, special = _scale_exponent(amax, CODE)
    inert = special | (amax == 0)
    return s, special, inert, _tile_path(s, special, inert, CODE)


@triton.jit
def _scale_bytes(s, special):
    """E8M0 scale bytes (uint8): S + 127, 0xFF for NaN/Inf blocks."""
    return (s + 127 + special.to(tl.int32) * (128 - s)).to(tl.uint8)
