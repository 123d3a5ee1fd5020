"""The jagged attention kernel against the reference `JaggedAttention(backend="reference")`.

CPU: the kernels run under TRITON_INTERPRET=1 (set here when there is no GPU) at tiny sizes.
GPU (`-m gpu`): the benchmark's shape (512 sequences, log-normal lengths, 4 heads x 64).

Tolerances, derived from what differs between the two implementations:

- MX mode and SiLU: the kernel computes the reference's operands with the reference's roundings;
  only the order of float32 accumulation differs (tiles versus one matmul, the softmax sum,
  the backward's row term), and in MX softmax the rounding of the running maximum's rescale factors
  (applied step by step in the kernel, at once in the reference). A float32 result that is not near a rounding
  boundary then rounds to the same output value, or to a neighbour: at most one unit in the last place (ulp) of the
  output dtype. Near a boundary (a float32 value within a few float32 ulps of a tie of a later
  rounding: S or dS to BF16, P or dS to the MX grid) one rounding may flip by one step, which
  moves one quantized element by one quantum and perturbs the outputs along one row or column
  by at most 2^-mbits of their terms. Flips are rare (about 2^-12 per rounded value for random
  data) but at these sizes one flip touches a visible share of the elements. The test asserts:
  at most FLIP_SHARE of the elements differ by more than one output ulp, and the whole
  difference has a norm below 2^-mbits x the reference's norm (mbits of the coarsest operand
  format used). A wrong block axis, block start or scale changes most elements by a few percent
  and fails both.
- BF16 mode with softmax: the kernel follows flash attention, which rounds the unnormalized P to
  BF16 (the reference rounds the normalized P) and takes the backward's row term from the BF16
  output. Each term of each sum then carries up to two extra BF16 roundings (2 x 2^-9 relative)
  in a different place, so |difference| <= 2^-8 x sum |terms| + 1 ulp; with sums whose terms
  cancel (softmax gradients) sum |terms| stays within a few times max |reference|, so the test
  asserts |difference| <= 2^-6 max |reference| elementwise and a norm below 2^-7 of the reference's.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


from mxlab.kernels import attention as jagged_attention_module  # noqa: E402  (after TRITON_INTERPRET is set)
from mxlab.kernels.attention import AttentionLaunch  # noqa: E402
from mxlab.kernels.attention import api as attention_api  # noqa: E402
from mxlab.kernels.attention import codes as attention_codes  # noqa: E402
from mxlab.kernels.attention import launch as attention_launch  # noqa: E402
from mxlab.kernels.attention import tiles as attention_tiles  # noqa: E402

jagged_attention = jagged_attention_module.jagged_attention
unsupported_reason = jagged_attention_module.unsupported_reason

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mxlab.kernels import _mx_device  # noqa: E402
from mxlab.kernels._mx_device import fake_quant_tile, score_random_bits  # noqa: E402
from mxlab.nn.attention import JaggedAttention, call_seeds  # noqa: E402
from mxlab.nn.qmatmul import OperandQuant  # noqa: E402
from mxlab.numerics.formats import get_format  # noqa: E402
from mxlab.numerics.seeding import seed_key  # noqa: E402
from mxlab.numerics.vocab import code_field, pack_code  # noqa: E402
from mxlab.recipe import AttentionPolicy, AttentionRecipe  # noqa: E402

# Masked lanes compute exp of -inf-like arguments; NumPy (the interpreter) warns, the GPU does not.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu")
FLIP_SHARE = 0.10


def _policy(
    fwd: str = "e4m3",
    grad: str = "e4m3",
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    grad_rounding: str | None = None,
) -> AttentionPolicy:
    fwd_quant = OperandQuant(fwd, 32, scale_mode, rounding)
    grad_quant = OperandQuant(grad, 32, scale_mode, grad_rounding or rounding)
    recipe = AttentionRecipe(fwd_quant, grad_quant, fwd_quant, grad_quant)
    return AttentionPolicy(qk=recipe.product_precision("qk", "test", 1), pv=recipe.product_precision("pv", "test", 2))


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64, device=DEVICE)


def _inputs(q_lengths: list[int], k_lengths: list[int], heads: int, head_dim: int, seed: int, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(seed)

    def randn(tokens: int) -> torch.Tensor:
        return torch.randn(tokens, heads, head_dim, generator=generator).to(dtype).to(DEVICE).requires_grad_()

    q, k, v = randn(sum(q_lengths)), randn(sum(k_lengths)), randn(sum(k_lengths))
    grad = torch.randn(sum(q_lengths), heads, head_dim, generator=generator).to(dtype).to(DEVICE)
    return q, k, v, grad


def _kernel_call(q, k, v, q_offsets, k_offsets, policy, tiles=None, hw_fp8=True, **options):
    """The kernel on these inputs as mxlab.nn.attention runs it: this call's seeds drawn from the policy
    (`call_seeds`, which advances each product's call counter when an operand rounds stochastically)."""
    return jagged_attention(
        q,
        k,
        v,
        q_offsets,
        k_offsets,
        policy=policy,
        seeds=call_seeds(policy),
        _launch=AttentionLaunch(tiles=tiles, hw_fp8=hw_fp8),
        **options,
    )


def _run_both(q, k, v, grad, q_offsets, k_offsets, causal, activation, policy, tiles=None):
    out = _kernel_call(q, k, v, q_offsets, k_offsets, policy, tiles, causal=causal, activation=activation)
    kernel = (out, *torch.autograd.grad(out, (q, k, v), grad))
    reference_module = JaggedAttention(backend="reference")
    reference_module.policy = policy
    expected = reference_module(q, k, v, q_offsets, k_offsets, causal=causal, activation=activation)
    reference = (expected, *torch.autograd.grad(expected, (q, k, v), grad))
    return kernel, reference


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at |x| (float32 result; normal range)."""
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    exponent = torch.floor(torch.log2(x.abs().clamp(min=torch.finfo(dtype).tiny)))
    return torch.exp2(exponent - mantissa_bits)


def _assert_exact_up_to_accumulation(name: str, actual: torch.Tensor, expected: torch.Tensor, mbits: int) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
    a, e = actual.float(), expected.float()
    assert torch.isfinite(a).all(), f"{name}: non-finite values"
    difference = (a - e).abs()
    beyond_ulp = difference > _ulp(torch.maximum(a.abs(), e.abs()), expected.dtype)
    share = beyond_ulp.float().mean().item() if beyond_ulp.numel() else 0.0
    assert share <= FLIP_SHARE, (
        f"{name}: {share:.1%} of elements differ by more than one ulp (max {difference.max().item():.3e})"
    )
    norm_ratio = (difference.norm() / e.norm().clamp(min=1e-30)).item()
    assert norm_ratio <= 2.0**-mbits, f"{name}: relative norm of the difference {norm_ratio:.3e} > 2^-{mbits}"


def _assert_bf16_flash_close(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
    a, e = actual.float(), expected.float()
    assert torch.isfinite(a).all(), f"{name}: non-finite values"
    scale = e.abs().max().clamp(min=1e-30)
    worst = ((a - e).abs().max() / scale).item() if e.numel() else 0.0
    assert worst <= 2.0**-6, f"{name}: max difference {worst:.3e} x max |reference| > 2^-6"
    norm_ratio = ((a - e).norm() / e.norm().clamp(min=1e-30)).item()
    assert norm_ratio <= 2.0**-7, f"{name}: relative norm of the difference {norm_ratio:.3e} > 2^-7"


SELF_LENGTHS = [31, 0, 1, 33, 65]  # 65: the largest here, three 32-row tiles
CROSS_Q, CROSS_K = [2, 5, 0, 3, 1], [40, 0, 7, 1, 65]
PMA_Q, PMA_K = [2, 2, 2, 2, 2], [31, 0, 33, 1, 64]

# 64-row tiles hold two quantization blocks per tile along each axis (the kernels reshape them);
# the default interpreter tiles (32) hold one. MX softmax's forward key tile is always 32 (the running
# maximum's step), so its query tile is the wide one there.
WIDE_TILES = jagged_attention_module.TileSizes(64, 32, 64, 64, 64, 64, 1, 1)
FUSED_DQ_TILES = jagged_attention_module.TileSizes(32, 32, 32, 32, 32, 32, 1, 1, fused_dq=True)
MX_CASES = [
    # id, q lengths, k lengths, causal, activation, heads, policy arguments, tiles
    ("self-causal-softmax-e4m3-floor", SELF_LENGTHS, SELF_LENGTHS, True, "softmax", 1, dict(), None),
    (
        "self-silu-e4m3-even-away",
        SELF_LENGTHS,
        SELF_LENGTHS,
        False,
        "silu",
        1,
        dict(scale_mode="even", rounding="nearest_away"),
        None,
    ),
    (
        "cross-softmax-e4m3-e5m2grad-rceil-wide-3heads",
        CROSS_Q,
        CROSS_K,
        False,
        "softmax",
        3,
        dict(grad="e5m2", scale_mode="rceil"),
        WIDE_TILES,
    ),
    (
        "pma-silu-e3m2-e2m3grad-ceil-tz",
        PMA_Q,
        PMA_K,
        False,
        "silu",
        1,
        dict(fwd="e3m2", grad="e2m3", scale_mode="ceil", rounding="toward_zero"),
        None,
    ),
    (
        "self-causal-softmax-int8-wide",
        SELF_LENGTHS,
        SELF_LENGTHS,
        True,
        "softmax",
        1,
        dict(fwd="int8", grad="e2m1"),
        WIDE_TILES,
    ),
    ("self-causal-softmax-fused-dq", SELF_LENGTHS, SELF_LENGTHS, True, "softmax", 1, dict(), FUSED_DQ_TILES),
    ("cross-silu-fused-dq", CROSS_Q, CROSS_K, False, "silu", 1, dict(), FUSED_DQ_TILES),
]


@pytest.mark.parametrize("case", MX_CASES, ids=[case[0] for case in MX_CASES])
def test_mx_mode_matches_reference(case):
    _, q_lengths, k_lengths, causal, activation, heads, policy_arguments, tiles = case
    policy = _policy(**policy_arguments)
    q, k, v, grad = _inputs(q_lengths, k_lengths, heads, 32, seed=len(case[0]))
    kernel, reference = _run_both(
        q, k, v, grad, _offsets(q_lengths), _offsets(k_lengths), causal, activation, policy, tiles
    )
    mbits = min(get_format(policy_arguments.get(key, "e4m3")).mbits for key in ("fwd", "grad"))
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        _assert_exact_up_to_accumulation(name, actual, expected, mbits)


BF16_CASES = [
    ("self-causal-softmax", SELF_LENGTHS, SELF_LENGTHS, True, "softmax"),
    ("self-silu", SELF_LENGTHS, SELF_LENGTHS, False, "silu"),
    ("self-causal-silu", SELF_LENGTHS, SELF_LENGTHS, True, "silu"),
    ("cross-softmax", CROSS_Q, CROSS_K, False, "softmax"),
    ("pma-softmax", PMA_Q, PMA_K, False, "softmax"),
]


@pytest.mark.parametrize("fused_dq", [False, True], ids=["dq-kernel", "fused-dq"])
@pytest.mark.parametrize("case", BF16_CASES, ids=[case[0] for case in BF16_CASES])
def test_bf16_mode_matches_reference(case, fused_dq):
    _, q_lengths, k_lengths, causal, activation = case
    q, k, v, grad = _inputs(q_lengths, k_lengths, 2, 32, seed=len(case[0]))
    tiles = FUSED_DQ_TILES if fused_dq else None
    kernel, reference = _run_both(
        q, k, v, grad, _offsets(q_lengths), _offsets(k_lengths), causal, activation, None, tiles
    )
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        if activation == "silu":  # exact semantics: only the accumulation order differs
            _assert_exact_up_to_accumulation(name, actual, expected, 7)
        else:
            _assert_bf16_flash_close(name, actual, expected)


@pytest.mark.parametrize(
    "dtype, mx, activation",
    [(torch.float32, True, "softmax"), (torch.float16, False, "silu")],
    ids=["float32-mx", "float16-bf16mode-silu"],
)
def test_other_input_dtypes_match_reference(dtype, mx, activation):
    lengths = [5, 33]
    q, k, v, grad = _inputs(lengths, lengths, 1, 32, seed=7, dtype=dtype)
    kernel, reference = _run_both(
        q, k, v, grad, _offsets(lengths), _offsets(lengths), True, activation, _policy() if mx else None
    )
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        _assert_exact_up_to_accumulation(name, actual, expected, 3 if mx else 10)


def test_empty_histories_and_empty_query_sets_give_zeros():
    q_lengths, k_lengths = [3, 0, 2], [0, 5, 4]
    q, k, v, grad = _inputs(q_lengths, k_lengths, 1, 32, seed=3)
    for policy in (None, _policy()):
        for activation in ("softmax", "silu"):
            kernel, reference = _run_both(
                q, k, v, grad, _offsets(q_lengths), _offsets(k_lengths), False, activation, policy
            )
            out, dq, dk, dv = kernel
            assert torch.equal(out[:3].float(), torch.zeros(3, 1, 32)), "queries without keys must get exact zeros"
            assert torch.equal(dq[:3].float(), torch.zeros(3, 1, 32))
            assert torch.equal(dk[:5].float(), torch.zeros(5, 1, 32)) and torch.equal(
                dv[:5].float(), torch.zeros(5, 1, 32)
            ), "keys of an example without queries must get zero gradients"
            assert out[3:].abs().sum() > 0 and dk[5:].abs().sum() > 0
            reference_out, reference_dq, reference_dk, reference_dv = reference
            assert torch.equal(reference_out[:3], out[:3]) and torch.equal(reference_dq[:3], dq[:3]), (
                "the reference agrees"
            )
            assert torch.equal(reference_dk[:5], dk[:5]) and torch.equal(reference_dv[:5], dv[:5])


@pytest.fixture
def nan_filled_empty(monkeypatch):
    """torch.empty / empty_like return NaN-filled floating tensors, so that an output row the
    kernels leave unwritten shows up instead of reading whatever memory held."""
    original_empty, original_empty_like = torch.empty, torch.empty_like

    def empty(*args, **kwargs):
        tensor = original_empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    def empty_like(*args, **kwargs):
        tensor = original_empty_like(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)


@pytest.mark.parametrize("fused_dq", [False, True], ids=["dq-kernel", "fused-dq"])
def test_unwritten_outputs_are_exact_zeros_not_uninitialized_memory(nan_filled_empty, fused_dq):
    # Sequence 0 has queries but no keys, sequence 1 keys but no queries (and a 33-key run: two tiles).
    q_lengths, k_lengths = [3, 0, 2], [0, 33, 4]
    q, k, v, grad = _inputs(q_lengths, k_lengths, 2, 32, seed=5)
    tiles = FUSED_DQ_TILES if fused_dq else None
    for policy in (None, _policy()):
        for activation in ("softmax", "silu"):
            out = _kernel_call(q, k, v, _offsets(q_lengths), _offsets(k_lengths), policy, tiles, activation=activation)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
            for name, tensor in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
                assert torch.isfinite(tensor).all(), (
                    f"{name}: rows left unwritten ({activation}, policy {policy is not None})"
                )
            assert torch.equal(out[:3].float(), torch.zeros(3, 2, 32)) and torch.equal(
                dq[:3].float(), torch.zeros(3, 2, 32)
            )
            assert torch.equal(dk[:33].float(), torch.zeros(33, 2, 32)) and torch.equal(
                dv[:33].float(), torch.zeros(33, 2, 32)
            )
            assert out[3:].abs().sum() > 0 and dk[33:].abs().sum() > 0 and dq[3:].abs().sum() > 0


def test_tile_tables_are_cached_on_the_offsets_until_changed_in_place(monkeypatch):
    computed = []
    compute_tiles = attention_tiles._compute_tiles

    def counting(offsets, tokens, work_offsets, block):
        computed.append((tokens, block))
        return compute_tiles(offsets, tokens, work_offsets, block)

    monkeypatch.setattr(attention_tiles, "_compute_tiles", counting)
    lengths, permuted = [31, 0, 1, 33, 65], [65, 31, 0, 33, 1]
    q, k, v, grad = _inputs(lengths, lengths, 1, 32, seed=11)
    offsets = _offsets(lengths)

    def forward_backward(policy):
        out = jagged_attention(q, k, v, offsets, offsets, policy=policy)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    first = forward_backward(None)
    # Self-attention with the interpreter's 32-row tiles: forward, dK/dV and dQ share one table.
    assert len(computed) == 1
    second = forward_backward(None)
    assert len(computed) == 1, "the same offsets object must reuse its tables"
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    forward_backward(_policy())
    assert len(computed) == 2, "MX mode adds only the (unsorted) 32-token table of the pre-quantization"

    offsets.copy_(_offsets(permuted))  # same total, other sequences: stale tables would be wrong
    changed = forward_backward(None)
    assert len(computed) == 3, "an in-place change must invalidate the cached tables"
    fresh = jagged_attention(q, k, v, _offsets(permuted), _offsets(permuted))
    assert torch.equal(changed[0], fresh)

    out = jagged_attention(q, k, v, offsets, offsets)
    offsets.add_(0)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.backward(grad)


def test_tile_cache_drops_the_tables_of_freed_partner_offsets():
    queries = _offsets([2, 2, 2])  # e.g. pooled attention's fixed seed queries, with per-batch keys
    for batch in range(5):
        keys = _offsets([batch + 1, 3, 40])
        attention_tiles._tiles(queries, 6, keys, 32)
        del keys
    _, entries = queries.__dict__[attention_tiles._OFFSETS_CACHE_ATTRIBUTE]
    assert len(entries) <= 2, f"{len(entries)} cached tables for one live partner"


def test_offset_checks_run_once_per_offsets_version(monkeypatch):
    checked = []
    check_offset_values = attention_api.check_offsets_values

    def counting(name, offsets, total):
        checked.append(name)
        return check_offset_values(name, offsets, total)

    monkeypatch.setattr(attention_api, "check_offsets_values", counting)
    q, k, v, _ = _inputs([4, 3], [4, 3], 1, 32, seed=2)
    offsets = _offsets([4, 3])
    with torch.no_grad():
        jagged_attention(q, k, v, offsets, offsets, causal=True)
        jagged_attention(q, k, v, offsets, offsets, causal=True)
        assert checked == ["q_offsets"], "the second call and the k_offsets check (the same tensor) hit the cache"
        offsets[1] = 8  # now ends beyond the tokens: the next call must check again and refuse
        with pytest.raises(ValueError, match="must be non-decreasing"):
            jagged_attention(q, k, v, offsets, offsets)
        offsets[1] = 4
        other = _offsets([4, 3])
        jagged_attention(q, k, v, offsets, other, causal=True)
        other[1] = 5  # still valid offsets, no longer equal to the queries'
        with pytest.raises(ValueError, match="causal attention needs as many queries as keys"):
            jagged_attention(q, k, v, offsets, other, causal=True)


def test_all_empty_batch():
    offsets = _offsets([0, 0])
    q = torch.zeros(0, 2, 32, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    out = jagged_attention(q, q, q, offsets, offsets, causal=True)
    assert out.shape == (0, 2, 32)


def test_refusals_name_the_problem():
    q, k, v, _ = _inputs([4], [4], 1, 32, seed=0)
    offsets = _offsets([4])
    with pytest.raises(ValueError, match="causal attention needs as many queries as keys"):
        jagged_attention(q[:2], k, v, _offsets([2]), offsets, causal=True)
    with pytest.raises(ValueError, match="unknown attention activation 'relu'"):
        jagged_attention(q, k, v, offsets, offsets, activation="relu")
    with pytest.raises(ValueError, match="head_dim 48"):
        x = torch.zeros(4, 1, 48, dtype=torch.bfloat16, device=DEVICE)
        jagged_attention(x, x, x, offsets, offsets)
    with pytest.raises(ValueError, match="float32 is not supported without a policy"):
        x = torch.zeros(4, 1, 32, device=DEVICE)
        jagged_attention(x, x, x, offsets, offsets)
    with pytest.raises(ValueError, match="must start at 0 and end at the number of tokens"):
        jagged_attention(q, k, v, _offsets([3]), offsets)
    block_policy = _policy()
    block_policy.qk.fwd = type(block_policy.qk.fwd)(OperandQuant("e4m3", (32, 32)), OperandQuant("e4m3", (32, 32)))
    assert "block" in unsupported_reason(q, block_policy)
    assert unsupported_reason(q, _policy()) is None and unsupported_reason(q, None) is None
    assert unsupported_reason(q, _policy(rounding="stochastic")) is None


# ----------------------------------------------------------------------------- hardware FP8 conversion
def _device_module():
    from mxlab.kernels import _mx_device

    return _mx_device


def test_operand_code_packs_the_hardware_switch_and_refuses_it_where_it_is_not_exact():
    operand_code = _device_module().operand_code
    plain = operand_code("e4m3", "rceil", "nearest_even")
    assert operand_code("e4m3", "rceil", "nearest_even", hw_fp8=True) == plain | pack_code(hw_fp8=True)
    assert code_field(operand_code("e5m2", "floor", "nearest_even", hw_fp8=True), "hw_fp8")
    for fmt, rounding in (("e3m2", "nearest_even"), ("int8", "nearest_even"), ("e4m3", "toward_zero")):
        with pytest.raises(ValueError, match="hw_fp8=True needs format e4m3 or e5m2 with nearest_even"):
            operand_code(fmt, "floor", rounding, hw_fp8=True)


def test_host_sets_the_hardware_switch_per_operand_where_the_cast_kernels_would(monkeypatch):
    from mxlab.kernels.cast import launch as cast_launch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    capability = {"value": (9, 0)}
    monkeypatch.setattr(cast_launch, "_cuda_capability", lambda index: capability["value"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = torch.device("cuda", 0)

    def switches(policy):
        codes = attention_codes._codes(policy, cuda)
        return {name: int(code_field(code, "hw_fp8")) for name, code in vars(codes).items()}

    assert set(switches(_policy(fwd="e4m3", grad="e5m2")).values()) == {1}
    assert set(switches(_policy(rounding="nearest_away")).values()) == {0}
    assert set(switches(_policy(fwd="e3m2", grad="e2m3")).values()) == {0}
    mixed = switches(_policy(fwd="e4m3", grad="e2m1"))  # forward operands e4m3, incoming gradients e2m1
    assert mixed["q_d"] == mixed["p_n"] == 1 and mixed["do_d"] == mixed["ds_n"] == mixed["ds_m"] == 0
    capability["value"] = (8, 9)  # Triton 3.6 converts float32 -> FP8 there in two roundings
    assert set(switches(_policy()).values()) == {0}
    capability["value"] = (9, 0)
    assert set(vars(attention_codes._codes(_policy(), None)).values()) == set(
        vars(attention_codes._codes(_policy(), torch.device("cpu"))).values()
    )
    assert not any(code_field(code, "hw_fp8") for code in vars(attention_codes._codes(_policy(), None)).values())
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert set(switches(_policy()).values()) == {0}


COMPILE_ATTENTION_SCRIPT = r"""
import json, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mxlab.kernels.attention import device, kernels
from mxlab.kernels._mx_device import operand_code

def conversions(kernel, runtime, constants, num_warps):
    signature = {name: runtime.get(name, "constexpr") for name in kernel.arg_names}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 2})
    lines = compiled.asm["ptx"].splitlines()
    return sorted({line.split()[0] for line in lines if line.strip().startswith("cvt.") and "satfinite" in line})

pointers = {name: "*bf16" for name in ("QD", "KD", "VT", "VD", "O", "X", "OUT", "DOT_WITH",
                                       "QT", "KT", "DOD", "DOT", "DK", "DV")}
pointers.update({name: "*fp32" for name in ("M", "L", "ROW_DOTS", "DELTA", "DQ_ACC")})
pointers.update({name: "*i64" for name in ("q_offsets", "k_offsets", "offsets")})
pointers.update({name: "*i32" for name in ("tile_seq", "tile_start")})
_INT_ARGUMENTS = ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "total_q", "stride_t", "width", "tokens")
_SEED_ARGUMENTS = ("p_seed_key", "seed_key", "pm_seed_key", "dsm_seed_key", "dsn_seed_key")
pointers.update({name: "i32" for name in _INT_ARGUMENTS + _SEED_ARGUMENTS})
pointers["sm_scale"] = "fp32"
common = dict(HEAD_DIM=64, CAUSAL=False, SILU=False, QUANT=True, S_DTYPE=tl.bfloat16, OP_DTYPE=tl.bfloat16,
              DOT_DTYPE=tl.bfloat16, BY_BITS=False)
result = []
for kernel, fmt, mode in json.loads(sys.argv[1]):
    if mode == "stochastic":
        code = operand_code(fmt, "floor", "stochastic")
    else:
        code = operand_code(fmt, "floor", "nearest_even", hw_fp8=mode == "hardware")
    if kernel == "forward":
        constants = dict(common, BLOCK_M=64, BLOCK_N=32, P_CODE=code)
        result.append(conversions(kernels._jagged_attention_fwd, pointers, constants, 4))
    elif kernel == "dkdv":
        constants = dict(common, BLOCK_M=32, BLOCK_N=64, PM_CODE=code, DSM_CODE=code, FUSED_DQ=True, DSN_CODE=code)
        result.append(conversions(kernels._jagged_attention_bwd_dkdv, pointers, constants, 4))
    else:
        constants = dict(COLS=256, CODE=code, ROW_DOT=False, HEAD_DIM=64)
        result.append(conversions(device._prequantize, pointers, constants, 8))
print(json.dumps(result))
"""


def test_attention_kernels_compile_the_hardware_switch_to_the_fp8_conversion_for_sm90():
    """Compiles the attention kernels for sm_90 in a fresh process (no GPU needed): the hardware switch turns
    P's and the operands' element rounding into cvt.rn.satfinite, and only the switch does; the stochastic
    rounding code paths build too."""
    import json
    import subprocess
    import sys

    cases = [
        ("forward", "e4m3", "hardware"),
        ("prequantize", "e5m2", "hardware"),
        ("forward", "e4m3", "integer"),
        ("dkdv", "e4m3", "stochastic"),
        ("prequantize", "e4m3", "stochastic"),
    ]
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_ATTENTION_SCRIPT, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    instructions = json.loads(result.stdout.strip().splitlines()[-1])
    expected = [[f"cvt.rn.satfinite.{fmt}x2.f32"] if mode == "hardware" else [] for _, fmt, mode in cases]
    assert instructions == expected


# ----------------------------------------------------------------------------- stochastic rounding
def _run_kernel(q, k, v, grad, q_offsets, k_offsets, causal, activation, policy, tiles=None):
    out = _kernel_call(q, k, v, q_offsets, k_offsets, policy, tiles, causal=causal, activation=activation)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def _run_reference(q, k, v, grad, q_offsets, k_offsets, causal, activation, policy):
    module = JaggedAttention(backend="reference")
    module.policy = policy
    out = module(q, k, v, q_offsets, k_offsets, causal=causal, activation=activation)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def _saved_between_forward_and_backward(q, k, v, q_offsets, k_offsets, policy) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: saved.append(tensor) or tensor, lambda tensor: tensor):
        _kernel_call(q, k, v, q_offsets, k_offsets, policy, None, causal=True, activation="softmax")
    return saved


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_mx_mode_keeps_exactly_what_bf16_mode_keeps_for_the_backward(rounding):
    """Between the forward and the backward MX mode holds what BF16 mode holds: the high-precision inputs, the
    output and the softmax statistics, no quantized copy of Q, K or V; the backward quantizes the inputs
    again (`test_mx_mode_matches_reference` and the stochastic tests check its bits)."""
    lengths = [5, 33, 0, 40]
    q, k, v, _ = _inputs(lengths, lengths, 2, 32, seed=3)
    offsets = _offsets(lengths)
    bf16_saved = _saved_between_forward_and_backward(q, k, v, offsets, offsets, None)
    mx_saved = _saved_between_forward_and_backward(q, k, v, offsets, offsets, _policy(rounding=rounding))
    for saved in (bf16_saved, mx_saved):
        assert (
            any(tensor is q for tensor in saved)
            and any(tensor is k for tensor in saved)
            and any(tensor is v for tensor in saved)
        )
    describe = lambda tensors: sorted((str(t.dtype), tuple(t.shape)) for t in tensors)  # noqa: E731
    assert describe(mx_saved) == describe(bf16_saved)
    assert [t.dtype for t in mx_saved].count(torch.bfloat16) == 4


SR_LENGTHS = [31, 0, 1, 33]
SR_CASES = [
    # id, q lengths, k lengths, causal, activation, heads, policy arguments, tiles
    (
        "self-causal-softmax-all-sr",
        SR_LENGTHS,
        SR_LENGTHS,
        True,
        "softmax",
        2,
        dict(rounding="stochastic", scale_mode="rceil"),
        None,
    ),
    (
        "cross-silu-grad-sr-e5m2-fused-dq",
        CROSS_Q,
        CROSS_K,
        False,
        "silu",
        1,
        dict(grad="e5m2", grad_rounding="stochastic", scale_mode="rceil"),
        FUSED_DQ_TILES,
    ),
    (
        "pma-softmax-all-sr-e2m1-wide",
        PMA_Q,
        PMA_K,
        False,
        "softmax",
        1,
        dict(fwd="e2m1", grad="e3m2", rounding="stochastic"),
        WIDE_TILES,
    ),
]


@pytest.mark.parametrize("case", SR_CASES, ids=[case[0] for case in SR_CASES])
def test_stochastic_rounding_matches_the_reference_forward_and_backward(case):
    """The kernel draws every stochastically rounded operand's bits from the reference's counters and seeds:
    outputs and gradients agree up to accumulation order (at these sizes, in practice, exactly), where other
    seeds change almost every element (`test_other_seeds_fail_the_comparison`)."""
    _, q_lengths, k_lengths, causal, activation, heads, policy_arguments, tiles = case
    q, k, v, grad = _inputs(q_lengths, k_lengths, heads, 32, seed=len(case[0]))
    kernel_policy, reference_policy = _policy(**policy_arguments), _policy(**policy_arguments)
    arguments = (q, k, v, grad, _offsets(q_lengths), _offsets(k_lengths), causal, activation)
    kernel = _run_kernel(*arguments, kernel_policy, tiles)
    reference = _run_reference(*arguments, reference_policy)
    for policy in (kernel_policy, reference_policy):  # one call: each product's seeds advanced once
        assert policy.qk.calls == policy.pv.calls == 1
    mbits = min(get_format(policy_arguments.get(key, "e4m3")).mbits for key in ("fwd", "grad"))
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        _assert_exact_up_to_accumulation(name, actual, expected, mbits)


def test_other_seeds_fail_the_comparison():
    """The comparison above can fail: the reference's next call (other seeds, same counters) differs."""
    q, k, v, _ = _inputs(SR_LENGTHS, SR_LENGTHS, 1, 32, seed=4)
    policy = _policy(rounding="stochastic")
    offsets = _offsets(SR_LENGTHS)
    reference_module = JaggedAttention(backend="reference")
    reference_module.policy = policy
    with torch.no_grad():
        kernel = _kernel_call(q, k, v, offsets, offsets, policy)
        later_call = reference_module(q, k, v, offsets, offsets)
    with pytest.raises(AssertionError, match="differ by more than one ulp"):
        _assert_exact_up_to_accumulation("out", kernel, later_call, 3)


def _head_dim_copy(x: torch.Tensor, fmt: str, scale_mode: str, rounding: str, seed=None) -> torch.Tensor:
    """x's copy along the head dim as the attention makes it (`launch._head_dim_quantized`, the cast kernels)."""
    from mxlab.kernels.cast import CastLaunch
    from mxlab.numerics.formats import FORMATS

    cast = attention_codes._RowCast(FORMATS[fmt], scale_mode, rounding, seed)
    return attention_launch._head_dim_quantized(x.contiguous(), cast, CastLaunch())


def test_stochastic_prequantized_operands_equal_the_reference_bits():
    """Q/K/V/dO copies (both orientations: the cast kernels along the head dim, `_prequantize` along the tokens)
    against the reference's counter: the element's linear index in the packed (tokens, heads, head_dim) tensor,
    bit for bit."""
    from mxlab.nn.operands import counted_stochastic_fake_quantize as _stochastic_fake_quantize

    lengths = [31, 0, 1, 33, 70]
    tokens, heads, head_dim = sum(lengths), 2, 64
    generator = torch.Generator().manual_seed(8)
    x = (
        torch.randn(tokens, heads, head_dim, generator=generator)
        * torch.exp2(torch.randint(-30, 10, (tokens, heads, head_dim), generator=generator).float())
    ).to(DEVICE)
    quant = OperandQuant("e4m3", 32, "even", "stochastic")
    code = attention_codes.operand_code("e4m3", "even", "stochastic")
    seeds = (12345, 2**32 - 7)
    keys = [seed_key(seed) for seed in seeds]
    offsets = _offsets(lengths)
    along_d = _head_dim_copy(x, "e4m3", "even", "stochastic", seeds[0])
    along_t, _ = attention_launch._prequantized(x, offsets, code, seed_key=keys[1])
    counter = torch.arange(x.numel(), device=DEVICE).view(x.shape)
    assert torch.equal(along_d.float(), _stochastic_fake_quantize(x, quant, -1, seeds[0], counter))
    for begin, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        expected = _stochastic_fake_quantize(x[begin:end], quant, 0, seeds[1], counter[begin:end])
        assert torch.equal(along_t[begin:end].float(), expected), f"tokens {begin}:{end}"
    assert not torch.equal(along_d.float(), _stochastic_fake_quantize(x, quant, -1, seeds[1], counter))


@triton.jit
def _score_tile_kernel(
    X, Y, first_row, head, heads, seed_key, AXIS: tl.constexpr, CODE: tl.constexpr, KEYS_FIRST: tl.constexpr
):
    """Y = fake_quant_tile of the (32, 64) float32 score tile X of query rows first_row.. and keys 0..63 (AXIS 0:
    along the queries); KEYS_FIRST quantizes its transpose, the (64, 32) tile of keys x queries, as dK/dV does."""
    rows = tl.arange(0, 32)
    keys = tl.arange(0, 64)
    if KEYS_FIRST:
        index = rows[None, :] * 64 + keys[:, None]
        bits = score_random_bits(first_row + rows, head, heads, keys, seed_key, True)
        tl.store(Y + index, fake_quant_tile(tl.load(X + index), bits, 64, 32, 1 - AXIS, CODE))
    else:
        index = rows[:, None] * 64 + keys[None, :]
        bits = score_random_bits(first_row + rows, head, heads, keys, seed_key, False)
        tl.store(Y + index, fake_quant_tile(tl.load(X + index), bits, 32, 64, AXIS, CODE))


@triton.jit
def _every_block_kernel(FLAGS, OUT, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr):
    flags = tl.load(FLAGS + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]) != 0
    if AXIS == 2:  # the flags of a tile reshaped to (R, C, 32), reduced along its last axis
        tl.store(OUT, _mx_device._every_block(flags, 2).to(tl.int32))
    else:  # a 2-D tile reduced along AXIS: flags of shape (C,) or (R,)
        tl.store(OUT, _mx_device._every_block(tl.min(flags.to(tl.int32), AXIS) != 0, AXIS).to(tl.int32))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_every_block_is_true_exactly_when_every_flag_is_set(axis):
    """The tile-wide fast-path decision of the in-kernel quantization (`_every_block`) is the AND of the block flags."""
    generator = torch.Generator().manual_seed(axis)
    for unset in (0, 1, 5):
        flags = torch.ones(4, 8, dtype=torch.int32)
        flags.view(-1)[torch.randperm(32, generator=generator)[:unset]] = 0
        if axis == 0:  # each column reduced down the rows: a column is set when all its rows are
            expected = bool(flags.min(0).values.all())
        elif axis == 1:
            expected = bool(flags.min(1).values.all())
        else:
            expected = bool(flags.all())
        out = torch.full((1,), -1, dtype=torch.int32)
        _every_block_kernel[(1,)](flags, out, R=4, C=8, AXIS=axis)
        assert out.item() == int(expected), (axis, unset)


@pytest.mark.parametrize(
    "fmt, axis, keys_first",
    [
        ("e5m2", 0, False),
        ("e5m2", 1, False),
        ("int8", 1, False),
        ("e2m3", 0, False),
        ("e5m2", 0, True),
        ("e2m3", 1, True),
    ],
)
def test_in_kernel_score_quantization_equals_the_reference_bits(fmt, axis, keys_first):
    """P and dS tiles: `score_random_bits` + `fake_quant_tile` against the reference's score counter
    (key * 2^32 + query_row * heads + head), bit for bit (axis 0: blocks along the queries, 1: along the
    keys); query rows x heads beyond 2^31, fractions far below the quantum and float32 subnormals included."""
    from mxlab.nn.attention import score_counter
    from mxlab.nn.operands import counted_stochastic_fake_quantize as _stochastic_fake_quantize

    generator = torch.Generator().manual_seed(axis)
    x = torch.randn(32, 64, generator=generator) * torch.exp2(
        torch.randint(-40, 8, (32, 64), generator=generator).float()
    )
    x[5, :] = 0.0
    x[:, 7] = torch.randn(32, generator=generator) * 2.0**-130  # float32 subnormals, with or without larger neighbours
    x[9, :] = torch.randn(64, generator=generator) * 2.0**-140
    x = x.to(DEVICE)
    quant = OperandQuant(fmt, 32, "floor", "stochastic")
    code = attention_codes.operand_code(fmt, "floor", "stochastic")
    for first_row, heads, head, seed in ((0, 1, 0, 3), (2**30 + 17, 3, 2, 2**31 + 5)):
        y = torch.empty_like(x)
        _score_tile_kernel[(1,)](
            x, y, first_row, head, heads, seed_key(seed), AXIS=axis, CODE=code, KEYS_FIRST=keys_first
        )
        rows = torch.arange(first_row, first_row + 32, device=DEVICE)[None, :]
        counter = score_counter(rows, heads, 64)[0, head]
        expected = _stochastic_fake_quantize(x, quant, axis, seed, counter)
        assert torch.equal(y, expected), f"{(y != expected).sum().item()} elements differ (first row {first_row})"


@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("rounding, scale_mode", [("nearest_even", "floor"), ("stochastic", "rceil")])
def test_in_kernel_fast_path_tiles_equal_the_reference_bits(fmt, rounding, scale_mode):
    """Tiles whose every block scale is in the fast range take the cast kernels' fast steps (integer nearest even or
    stochastic; on the CPU also e4m3/e5m2, which the GPU converts in hardware): the reference's bits, signed zeros,
    element-subnormal values and saturation included, along either axis."""
    from mxlab.nn.attention import score_counter
    from mxlab.nn.operands import counted_stochastic_fake_quantize as _stochastic_fake_quantize
    from mxlab.numerics.quant import fake_quantize

    generator = torch.Generator().manual_seed(len(fmt))
    x = torch.randn(32, 64, generator=generator) * torch.exp2(
        torch.randint(-20, 20, (32, 1), generator=generator).float()
    )
    x[5, :] = 0.0
    x[6, :16] = -0.0
    x[7, :] *= torch.exp2(-torch.arange(64, dtype=torch.float32) / 4)  # values far below their block's largest
    x = x.to(DEVICE)
    quant = OperandQuant(fmt, 32, scale_mode, rounding)
    code = attention_codes.operand_code(fmt, scale_mode, rounding)
    for axis in (0, 1):
        y = torch.empty_like(x)
        _score_tile_kernel[(1,)](x, y, 100, 1, 2, seed_key(11), AXIS=axis, CODE=code, KEYS_FIRST=False)
        if rounding == "stochastic":
            counter = score_counter(torch.arange(100, 132, device=DEVICE)[None, :], 2, 64)[0, 1]
            expected = _stochastic_fake_quantize(x, quant, axis, 11, counter)
        else:
            expected = fake_quantize(x, fmt, axis=axis, scale_mode=scale_mode)
        assert torch.equal(y.view(torch.int32), expected.view(torch.int32)), (
            f"axis {axis}: {(y.view(torch.int32) != expected.view(torch.int32)).sum().item()} elements differ"
        )


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
def test_hardware_fp8_tiles_equal_the_reference_bits_at_every_scale(fmt, scale_mode):
    """The attention's in-kernel hardware FP8 conversion takes every block, with no tile-wide range test: blocks
    whose scale is 2^-127 (a float32-subnormal factor) or just above it, float32-subnormal inputs, signed zeros,
    and blocks near float32's largest values (rceil ones round up to an infinite value, as the reference's do)
    give the reference's bits along either axis; a NaN block is NaN."""
    from mxlab.kernels.cast import hardware_fp8_applies
    from mxlab.numerics.quant import fake_quantize

    if not hardware_fp8_applies(torch.device("cuda"), get_format(fmt), "nearest_even"):
        pytest.skip("the GPU has no exact FP8 conversion (sm_90+)")
    generator = torch.Generator().manual_seed(len(fmt) + len(scale_mode))
    x = torch.randn(32, 64, generator=generator)
    x *= torch.exp2(torch.randint(-150, -95, (32, 1), generator=generator).float())  # 2^-127 <= S <= -100
    x[:4] = torch.randn(4, 64, generator=generator) * 2.0**-130  # all float32 subnormal (and 0)
    x[4, :32] = -0.0
    x[5] = torch.randn(64, generator=generator).sign() * 3.3e38 * torch.rand(64, generator=generator) ** 4
    x[5, 0], x[5, 40] = -3.3e38, 3.3e38
    x[6] = torch.randn(64, generator=generator) * 2.0**126
    x[7] = torch.randn(64, generator=generator)
    x[8, 3] = float("nan")
    code = attention_codes.operand_code(fmt, scale_mode, "nearest_even", hw_fp8=True)
    for axis in (0, 1):
        data = x if axis == 1 else x.reshape(64, 32).T.contiguous()  # the same blocks, down the columns
        y = torch.empty_like(data, device="cuda")
        _score_tile_kernel[(1,)](data.cuda(), y, 0, 0, 1, 0, AXIS=axis, CODE=code, KEYS_FIRST=False)
        expected = fake_quantize(data, fmt, axis=axis, scale_mode=scale_mode)
        nan = expected.isnan()
        assert torch.equal(y.isnan().cpu(), nan), f"axis {axis}: NaN elements differ"
        got, want = y.cpu()[~nan].view(torch.int32), expected[~nan].view(torch.int32)
        assert torch.equal(got, want), f"axis {axis}: {(got != want).sum().item()} elements differ"
        assert (expected[~nan] != 0).sum() > 1000 and expected.isinf().any() == (scale_mode == "rceil")


# ----------------------------------------------------------------------------- GPU, benchmark size
@pytest.fixture
def full_precision_reductions(monkeypatch):
    """cuBLAS may reduce BF16 products in reduced precision (split-K); the reference must not. The
    reference's own quantization runs in PyTorch (the definition), not in the MX cast kernels."""
    monkeypatch.setenv("MXLAB_BACKEND", "reference")
    previous = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    yield
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = previous


# The benchmark-size tests hold 10-17 GiB of GPU memory each (the reference quantizes padded float32 copies):
# under pytest-xdist with --dist loadgroup they run one after another in one worker, so eight workers fit on
# an 80 GB card (benchmarks/visit.sh's tests job).
BENCHMARK_SIZE = pytest.mark.xdist_group("gpu-benchmark-size")


def _benchmark_inputs(n: int = 512, seed: int = 0):
    from mxlab.bench.attention import sample_lengths

    lengths = sample_lengths(n, seed).tolist()
    q, k, v, grad = _inputs(lengths, lengths, 4, 64, seed=seed)
    return lengths, q, k, v, grad


@pytest.mark.gpu
@BENCHMARK_SIZE
@pytest.mark.parametrize("activation", ["softmax", "silu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_benchmark_size_matches_reference_on_gpu(mode, causal, activation, full_precision_reductions):
    lengths, q, k, v, grad = _benchmark_inputs()
    policy = _policy() if mode == "mxfp8" else None
    offsets = _offsets(lengths)
    kernel, reference = _run_both(q, k, v, grad, offsets, offsets, causal, activation, policy)
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        if policy is not None or activation == "silu":
            _assert_exact_up_to_accumulation(name, actual, expected, 3 if policy is not None else 7)
        else:
            _assert_bf16_flash_close(name, actual, expected)


@pytest.mark.gpu
@BENCHMARK_SIZE
@pytest.mark.parametrize("queries", [4, 5])
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_benchmark_cross_and_pma_shapes_match_reference_on_gpu(mode, queries, full_precision_reductions):
    lengths, _, k, v, _ = _benchmark_inputs()
    q, _, _, grad = _inputs([queries] * len(lengths), [0] * len(lengths), 4, 64, seed=1)
    policy = _policy() if mode == "mxfp8" else None
    kernel, reference = _run_both(
        q, k, v, grad, _offsets([queries] * len(lengths)), _offsets(lengths), False, "softmax", policy
    )
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        if policy is not None:
            _assert_exact_up_to_accumulation(name, actual, expected, 3)
        else:
            _assert_bf16_flash_close(name, actual, expected)


HARDWARE_FP8_POLICIES = [
    ("e4m3-floor", dict()),
    ("e4m3-e5m2grad-rceil", dict(grad="e5m2", scale_mode="rceil")),
    ("e4m3-e2m1grad-even", dict(grad="e2m1", scale_mode="even")),  # gradients keep the integer steps
]


@pytest.mark.gpu
@BENCHMARK_SIZE
@pytest.mark.parametrize("activation, causal", [("softmax", False), ("softmax", True), ("silu", False)])
@pytest.mark.parametrize(
    "policy_id, policy_arguments", HARDWARE_FP8_POLICIES, ids=[case[0] for case in HARDWARE_FP8_POLICIES]
)
def test_hardware_fp8_conversion_is_bit_identical_to_the_integer_steps_on_gpu(
    policy_id, policy_arguments, activation, causal
):
    """Same kernels, same accumulation order: the outputs and gradients must be equal bit for bit."""
    lengths, q, k, v, grad = _benchmark_inputs()
    policy = _policy(**policy_arguments)
    codes = attention_codes._codes(policy, q.device)
    assert code_field(codes.p_n, "hw_fp8"), "this GPU must take the hardware FP8 path (sm_90+)"
    offsets = _offsets(lengths)
    results = []
    for hw_fp8 in (True, False):
        out = _kernel_call(q, k, v, offsets, offsets, policy, hw_fp8=hw_fp8, causal=causal, activation=activation)
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    for name, hardware, integer in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(hardware, integer), f"{name}: {(hardware != integer).sum().item()} elements differ"


@pytest.mark.gpu
@BENCHMARK_SIZE
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_hardware_prequantized_operands_equal_the_reference_bits_on_gpu(fmt):
    """Q/K/V/dO copies (both orientations) against mxlab.numerics.reference, bit for bit, on values spread
    over many binades (some blocks outside the fast-path range)."""
    from mxlab.numerics import reference
    from mxlab.numerics.formats import FORMATS

    lengths, q, _, _, _ = _benchmark_inputs()
    generator = torch.Generator().manual_seed(3)
    exponents = torch.randint(-100, 100, (q.shape[0], q.shape[1], 1), generator=generator).float()
    x = (q.detach().float().cpu() * torch.exp2(exponents)).to(torch.bfloat16).to(q.device)
    offsets = _offsets(lengths)
    code = attention_codes.operand_code(fmt, "rceil", "nearest_even", hw_fp8=True)
    along_d = _head_dim_copy(x, fmt, "rceil", "nearest_even")
    along_t, _ = attention_launch._prequantized(x, offsets, code)
    flat = x.float().reshape(x.shape[0], x.shape[1], x.shape[2] // 32, 32)
    expected_d = reference.fake_quantize_blocks(flat, (3,), FORMATS[fmt], "rceil", "nearest_even").reshape(x.shape)
    assert torch.equal(along_d.float().view(torch.int32), expected_d.view(torch.int32))
    for sequence, (begin, end) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        rows = x[begin:end].float()
        padded = torch.cat([rows, rows.new_zeros(-rows.shape[0] % 32, *rows.shape[1:])])
        blocks = padded.reshape(padded.shape[0] // 32, 32, *padded.shape[1:])
        expected_t = reference.fake_quantize_blocks(blocks, (1,), FORMATS[fmt], "rceil", "nearest_even").reshape(
            padded.shape
        )
        assert torch.equal(along_t[begin:end].float().view(torch.int32), expected_t[: end - begin].view(torch.int32)), (
            f"sequence {sequence}"
        )


SR_GPU_POLICIES = [
    ("mxfp8-rceil-sr", dict(scale_mode="rceil", grad_rounding="stochastic")),  # the recipe: gradients only
    ("all-stochastic", dict(scale_mode="rceil", rounding="stochastic")),
]


@pytest.mark.gpu
@BENCHMARK_SIZE
@pytest.mark.parametrize("activation, causal", [("softmax", False), ("softmax", True), ("silu", False)])
@pytest.mark.parametrize("policy_id, policy_arguments", SR_GPU_POLICIES, ids=[case[0] for case in SR_GPU_POLICIES])
def test_benchmark_size_stochastic_rounding_matches_reference_on_gpu(
    policy_id, policy_arguments, activation, causal, full_precision_reductions
):
    lengths, q, k, v, grad = _benchmark_inputs()
    offsets = _offsets(lengths)
    arguments = (q, k, v, grad, offsets, offsets, causal, activation)
    kernel = _run_kernel(*arguments, _policy(**policy_arguments))
    reference = _run_reference(*arguments, _policy(**policy_arguments))
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        _assert_exact_up_to_accumulation(name, actual, expected, 3)


@pytest.mark.gpu
@BENCHMARK_SIZE
def test_benchmark_size_stochastic_cross_attention_matches_reference_on_gpu(full_precision_reductions):
    lengths, _, k, v, _ = _benchmark_inputs()
    q, _, _, grad = _inputs([5] * len(lengths), [0] * len(lengths), 4, 64, seed=1)
    arguments = (q, k, v, grad, _offsets([5] * len(lengths)), _offsets(lengths), False, "softmax")
    policy_arguments = dict(scale_mode="rceil", rounding="stochastic")
    kernel = _run_kernel(*arguments, _policy(**policy_arguments))
    reference = _run_reference(*arguments, _policy(**policy_arguments))
    for name, actual, expected in zip(("out", "dq", "dk", "dv"), kernel, reference):
        _assert_exact_up_to_accumulation(name, actual, expected, 3)


@pytest.mark.gpu
@BENCHMARK_SIZE
def test_stochastic_operands_equal_the_reference_bits_on_gpu():
    """The benchmark's Q in both orientations, and a P-shaped tile, against the reference counters, bit for bit."""
    from mxlab.nn.attention import score_counter
    from mxlab.nn.operands import counted_stochastic_fake_quantize as _stochastic_fake_quantize

    lengths, q, _, _, _ = _benchmark_inputs()
    x = q.detach()
    quant = OperandQuant("e4m3", 32, "rceil", "stochastic")
    code = attention_codes.operand_code("e4m3", "rceil", "stochastic")
    offsets = _offsets(lengths)
    along_d = _head_dim_copy(x, "e4m3", "rceil", "stochastic", 5)
    along_t, _ = attention_launch._prequantized(x, offsets, code, seed_key=seed_key(6))
    counter = torch.arange(x.numel(), device=x.device).view(x.shape)
    assert torch.equal(along_d.float(), _stochastic_fake_quantize(x, quant, -1, 5, counter))
    for begin, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        assert torch.equal(
            along_t[begin:end].float(), _stochastic_fake_quantize(x[begin:end], quant, 0, 6, counter[begin:end])
        )
    scores = x.float().reshape(-1, 64)[:32].contiguous()
    y = torch.empty_like(scores)
    _score_tile_kernel[(1,)](scores, y, 1000, 3, 4, seed_key(9), AXIS=1, CODE=code, KEYS_FIRST=False)
    expected = _stochastic_fake_quantize(
        scores, quant, 1, 9, score_counter(torch.arange(1000, 1032, device=x.device)[None], 4, 64)[0, 3]
    )
    assert torch.equal(y, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_repeated_calls_do_not_synchronize_with_the_host(mode):
    """Once an offsets tensor's checks and tile tables are cached, forward + backward only enqueue work."""
    lengths, q, k, v, grad = _benchmark_inputs(64)
    offsets = _offsets(lengths)
    policy = _policy() if mode == "mxfp8" else None

    def step():
        out = jagged_attention(q, k, v, offsets, offsets, policy=policy)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    first = step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(torch.equal(a, b) for a, b in zip(first, second)), "the cached tables give the same result"


def test_an_installed_gemm_observer_does_not_send_attention_to_the_reference():
    """Diagnostics sample a step without changing its path: the kernel still takes MX attention."""
    from mxlab.nn import qmatmul as qmatmul_module

    q = torch.zeros(4, 2, 32, dtype=torch.bfloat16)
    policy = _policy()
    previous = qmatmul_module.set_gemm_observer(lambda **_: None)
    try:
        assert jagged_attention_module.unsupported_reason(q, policy) is None
    finally:
        qmatmul_module.set_gemm_observer(previous)


def test_the_kernel_takes_seeds_and_never_advances_the_call_counter():
    """Stochastic rounding needs the call's seeds from the caller; the kernel refuses to run without them and
    leaves the policy's call counters alone (mxlab.nn.attention.call_seeds advances them)."""
    q, k, v, _ = _inputs([3, 2], [3, 2], 1, 32, seed=6)
    offsets = _offsets([3, 2])
    policy = _policy(rounding="stochastic")
    with pytest.raises(ValueError, match="needs seeds=\\(qk seeds, pv seeds\\)"):
        jagged_attention(q, k, v, offsets, offsets, policy=policy)
    with pytest.raises(ValueError, match="needs seeds"):
        jagged_attention(q, k, v, offsets, offsets, policy=policy, seeds=((1, 2), (3, 4)))
    seeds = (policy.qk.next_call_seeds(), policy.pv.next_call_seeds())
    calls = (policy.qk.calls, policy.pv.calls)
    with torch.no_grad():
        first = jagged_attention(q, k, v, offsets, offsets, policy=policy, seeds=seeds)
        again = jagged_attention(q, k, v, offsets, offsets, policy=policy, seeds=seeds)
    assert (policy.qk.calls, policy.pv.calls) == calls
    assert torch.equal(first, again)


def test_launch_options_refuse_what_is_not_a_tile_table():
    with pytest.raises(ValueError, match="AttentionLaunch.tiles"):
        AttentionLaunch(tiles=(32, 32))


@pytest.mark.parametrize("rounding", [pytest.param("nearest_even", marks=pytest.mark.slow), "stochastic"])
def test_the_kernel_inside_a_compiled_function_runs_outside_its_graph_with_eager_bits(rounding):
    """torch.compile of a function calling the kernel through JaggedAttention: the kernel runs eagerly (its
    offset checks and tile tables live on the offsets tensors, which a graph cannot hold), the rest is traced;
    output and gradients equal eager mode's bits, with the same seeds per call."""
    q, k, v, grad = _inputs([3, 0, 9], [3, 0, 9], 1, 32, seed=9)
    offsets = _offsets([3, 0, 9])
    attention = JaggedAttention(backend="triton")

    def step(fn):
        attention.policy = _policy(rounding=rounding, scale_mode="rceil")  # fresh call counters: the same seeds
        out = fn(q, k, v, offsets)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    def scaled_attention(q, k, v, offsets):
        return attention(q * 2.0, k, v, offsets, offsets, causal=True) + 1.0

    eager = step(scaled_attention)
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        for name, want, got in zip(
            ("out", "dq", "dk", "dv"), eager, step(torch.compile(scaled_attention, backend=backend))
        ):
            assert torch.equal(want, got), f"{backend} {name}"
