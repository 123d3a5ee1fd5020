"""Seeds and counters for stochastic rounding and random Hadamard signs, shared by every layer.

Each `MatmulPrecision` (mxlab.nn.qmatmul) carries a base seed and a counter of its calls; the seed of
operand slot s at call c is `derive_seed(base, c, SEED_SLOTS[s])`. Kernels take a seed as its 32-bit mix
(`seed_key`), the first step of `mxlab.numerics.reference.random_bits24` (docs/numerics.md).
"""

from __future__ import annotations

# Seed slots: one seed per operand per GEMM per call, and one per GEMM for its Hadamard signs
# (shared by the GEMM's two operands). Seed of slot s at call c: derive_seed(seed, c, SEED_SLOTS[s]).
SEED_SLOTS = {
    "fwd.a": 0,
    "fwd.b": 1,
    "grad_a.g": 2,
    "grad_a.b": 3,
    "grad_b.a": 4,
    "grad_b.g": 5,
    "fwd.hadamard": 6,
    "grad_a.hadamard": 7,
    "grad_b.hadamard": 8,
}

_MASK64 = (1 << 64) - 1
_MASK32 = 0xFFFFFFFF


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def derive_seed(base_seed: int, call: int, slot: int) -> int:
    """A 32-bit seed for operand `slot` of forward call `call` under `base_seed` (splitmix64 chain)."""
    z = _splitmix64(base_seed & _MASK64)
    z = _splitmix64(z ^ (call & _MASK64))
    z = _splitmix64(z ^ (slot & _MASK64))
    return z & _MASK32


def mix32_int(z: int) -> int:
    """The 32-bit mixer of docs/numerics.md on one Python int in [0, 2^32) (multiplications wrap mod 2^32)."""
    z ^= z >> 16
    z = (z * 0x7FEB352D) & _MASK32
    z ^= z >> 15
    z = (z * 0x846CA68B) & _MASK32
    return z ^ (z >> 16)


def seed_key(seed: int) -> int:
    """mix32 of a seed's low 32 bits as a signed int32 (one kernel signature for every seed)."""
    key = mix32_int(seed & _MASK32)
    return key - (1 << 32) if key >= 1 << 31 else key
