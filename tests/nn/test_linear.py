import pytest
import torch
from torch import nn

from mxlab.nn.linear import QLinear
from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant
from mxlab.numerics.quant import fake_quantize
from mxlab.numerics.seeding import SEED_SLOTS, derive_seed


def fq(x, quant, axis, seed=None):
    return fake_quantize(
        x.float(),
        quant.fmt,
        block=quant.block,
        axis=axis if quant.block == 32 else -1,
        scale_mode=quant.scale_mode,
        rounding=quant.rounding,
        seed=seed,
        pad=True,
    )


def linear_precision(weight_block=32, grad_rounding="nearest_even", grad_fmt="e4m3", wgrad_fmt="e4m3", seed=3):
    activation = OperandQuant("e4m3", 32, "floor", "nearest_even")
    weight = OperandQuant("e4m3", weight_block, "floor", "nearest_even")
    grad = OperandQuant(grad_fmt, 32, "floor", grad_rounding)
    wgrad_input = OperandQuant(wgrad_fmt, 32, "floor", "nearest_even")
    wgrad_grad = OperandQuant(wgrad_fmt if wgrad_fmt in ("bf16", "fp32") else grad_fmt, 32, "floor", grad_rounding)
    return MatmulPrecision(
        GemmQuant(activation, weight),
        GemmQuant(grad, weight),
        GemmQuant(wgrad_input, wgrad_grad),
        labels=("fwd", "dgrad", "wgrad"),
        seed=seed,
    )


def run(layer, x, g):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(g)
    return y, x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("weight_block", [32, (32, 32)])
@pytest.mark.parametrize("grad_rounding", ["nearest_even", "stochastic"])
def test_output_and_three_gradients_equal_reference_composition(weight_block, grad_rounding):
    torch.manual_seed(0)
    layer = QLinear(40, 48, precision=linear_precision(weight_block, grad_rounding))  # K = 40: padded
    x = torch.randn(2, 30, 40) * 2  # M = 60 tokens: padded along M for wgrad
    g = torch.randn(2, 30, 48)
    y, dx, dW, db = run(layer, x, g)

    p = layer.precision
    seed = lambda slot: derive_seed(3, 0, SEED_SLOTS[slot])  # noqa: E731
    W, b = layer.weight.detach(), layer.bias.detach()
    x2, g2 = x.reshape(60, 40), g.reshape(60, 48)
    # forward y = x W^T (x, W along K); dgrad dx = dy W (dy, W along N); wgrad dW = dy^T x (dy, x along M)
    expected_y = fq(x2, p.fwd.a, -1) @ fq(W, p.fwd.b, -1).T + b
    expected_dx = fq(g2, p.grad_a.a, -1, seed("grad_a.g")) @ fq(W, p.grad_a.b, 0)
    expected_dW = (fq(x2, p.grad_b.a, 0).T @ fq(g2, p.grad_b.b, 0, seed("grad_b.g"))).T
    assert torch.equal(y, expected_y.reshape(2, 30, 48))
    assert torch.equal(dx, expected_dx.reshape(2, 30, 40))
    assert torch.equal(dW, expected_dW)
    assert torch.equal(db, g2.sum(0))
    assert not torch.equal(y, nn.functional.linear(x, W, b))


def test_wgrad_left_high_precision_is_the_plain_product():
    torch.manual_seed(1)
    layer = QLinear(32, 32, precision=linear_precision(wgrad_fmt="bf16"))
    x, g = torch.randn(64, 32), torch.randn(64, 32)
    _, dx, dW, _ = run(layer, x, g)
    assert torch.equal(dW, (x.T @ g).T)
    assert not torch.equal(dx, g @ layer.weight.detach())  # dgrad still quantized


def test_high_precision_policy_equals_nn_linear_exactly():
    torch.manual_seed(2)
    reference = nn.Linear(24, 40)
    x, g = torch.randn(3, 7, 24), torch.randn(3, 7, 40)
    expected = run(reference, x, g)
    for precision in (None, MatmulPrecision(*(GemmQuant(OperandQuant("bf16"), OperandQuant("bf16")),) * 3)):
        reference.zero_grad()
        layer = QLinear.from_linear(reference, precision)
        got = run(layer, x, g)
        for value, want in zip(got, expected):
            assert torch.equal(value, want)


def test_gradcheck_with_quantization_off():
    layer = QLinear(5, 3, precision=MatmulPrecision(), dtype=torch.float64)  # fp32 operands: no rounding
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    # the layer's own Parameters are among the checked inputs (gradcheck perturbs them in place)
    assert torch.autograd.gradcheck(lambda inp, weight, bias: layer(inp), (x, layer.weight, layer.bias))


def test_same_parameters_and_state_dict_as_nn_linear():
    plain = nn.Linear(20, 33)
    quantized = QLinear.from_linear(plain, linear_precision())
    assert quantized.weight is plain.weight and quantized.bias is plain.bias
    assert list(quantized.state_dict()) == list(plain.state_dict()) == ["weight", "bias"]
    fresh = QLinear(20, 33, precision=linear_precision())
    fresh.load_state_dict(plain.state_dict())
    assert torch.equal(fresh.weight, plain.weight)
    back = nn.Linear(20, 33)
    back.load_state_dict(fresh.state_dict())
    assert torch.equal(back.bias, plain.bias)
    assert quantized.padded_dims == ["in_features 20->32", "out_features 33->64"]
    assert QLinear(64, 32).padded_dims == []


def test_stochastic_rounding_seeds_follow_the_call_counter():
    torch.manual_seed(4)
    x, g = torch.randn(64, 32), torch.randn(64, 32)
    weight = torch.randn(32, 32)

    def gradients(seed, calls):
        layer = QLinear(32, 32, precision=linear_precision(grad_rounding="stochastic", seed=seed))
        with torch.no_grad():
            layer.weight.copy_(weight)
        results = [run(layer, x, g)[1] for _ in range(calls)]
        return results, layer.precision.calls

    (first, second), calls = gradients(7, 2)
    (again,), _ = gradients(7, 1)
    assert calls == 2
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_bf16_input_gives_bf16_output():
    layer = QLinear(32, 16, precision=linear_precision(), dtype=torch.bfloat16)
    y = layer(torch.randn(8, 32, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16


def test_refuses_a_precision_of_the_wrong_type():
    with pytest.raises(ValueError, match="MatmulPrecision"):
        QLinear(4, 4, precision="e4m3")


def test_under_autocast_the_emulated_gemms_quantize_what_nn_linear_would_multiply():
    """Under autocast x, W and the bias become bfloat16 first (as autocast casts them for nn.Linear):
    the result is the layer run without autocast on bfloat16 copies, and the output stays bfloat16."""
    torch.manual_seed(5)
    layer = QLinear(32, 32, precision=linear_precision(wgrad_fmt="bf16"))
    x, g = torch.randn(64, 32) * 3, torch.randn(64, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x_leaf = x.clone().requires_grad_()
        y = layer(x_leaf)
    y.backward(g.bfloat16())
    assert y.dtype == torch.bfloat16 and x_leaf.grad.dtype == torch.float32
    assert layer.weight.grad.dtype == torch.float32

    copy = QLinear(32, 32, precision=linear_precision(wgrad_fmt="bf16"), dtype=torch.bfloat16)
    with torch.no_grad():
        copy.weight.copy_(layer.weight)
        copy.bias.copy_(layer.bias)
    y_copy, dx_copy, dW_copy, db_copy = run(copy, x.bfloat16(), g.bfloat16())
    assert torch.equal(y, y_copy)
    assert torch.equal(x_leaf.grad, dx_copy.float())  # dgrad: emulated, leaves in bfloat16
    bf16_wgrad = (x.T.bfloat16() @ g.bfloat16()).T.float()
    assert torch.equal(layer.weight.grad, bf16_wgrad) and torch.equal(dW_copy.float(), bf16_wgrad)  # wgrad "bf16"
    assert torch.equal(layer.bias.grad, db_copy.float())

    plain = run(layer, x, g)[0]  # without autocast: the float32 operands are quantized, float32 out
    assert plain.dtype == torch.float32 and not torch.equal(plain.bfloat16(), y)


def test_bias_joins_the_float32_accumulator_before_the_one_rounding():
    """As nn.Linear's addmm: y = round_bf16(fq(x) @ fq(W)^T + b) in float32, not the product rounded
    to bfloat16 and then the bias added and rounded again."""
    torch.manual_seed(6)
    layer = QLinear(64, 48, precision=linear_precision(), dtype=torch.bfloat16)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(48) * 3)
    x = torch.randn(256, 64).bfloat16()
    y = layer(x)
    p = layer.precision
    product = fq(x, p.fwd.a, -1) @ fq(layer.weight.detach(), p.fwd.b, -1).T
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, (product + layer.bias.detach().float()).bfloat16())
    assert not torch.equal(y, product.bfloat16() + layer.bias.detach())  # the double rounding differs


def test_refuses_a_bias_of_the_wrong_shape():
    from mxlab.nn.qmatmul import qmatmul

    with pytest.raises(ValueError, match=r"bias must be \(N,\) = \(16,\)"):
        qmatmul(torch.randn(8, 32), torch.randn(32, 16), linear_precision(), bias=torch.randn(8))


def test_bias_keeps_a_bfloat16_output_bfloat16():
    layer = QLinear(32, 16, precision=linear_precision())  # float32 parameters
    assert layer(torch.randn(8, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "weight_block, grad_rounding, expected_calls",
    [
        ((32, 32), "nearest_even", 5),  # the forward's 32x32 weight tiles serve dgrad too
        (32, "nearest_even", 6),
        ((32, 32), "stochastic", 5),  # stochastic gradients; the weight still rounds to nearest
    ],
)
def test_square_weight_tiles_are_quantized_once_per_step(monkeypatch, weight_block, grad_rounding, expected_calls):
    import mxlab.numerics.quant

    calls = []
    original = mxlab.numerics.quant.fake_quantize
    monkeypatch.setattr(
        mxlab.numerics.quant, "fake_quantize", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    )
    layer = QLinear(32, 32, precision=linear_precision(weight_block, grad_rounding))
    run(layer, torch.randn(64, 32), torch.randn(64, 32))
    assert len(calls) == expected_calls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bias_gradient_under_autocast_is_the_baselines(device):
    """The bias gradient does not depend on quantization: under autocast it is nn.Linear's (the output gradient
    summed in bfloat16, then the float32 master's), bit for bit, on CUDA too (where autocast would sum in float32)."""
    torch.manual_seed(7)
    plain = nn.Linear(64, 32, device=device)
    layer = QLinear.from_linear(nn.Linear(64, 32, device=device), linear_precision())
    with torch.no_grad():
        layer.weight.copy_(plain.weight)
        layer.bias.copy_(plain.bias)
    x, g = torch.randn(512, 64, device=device), torch.randn(512, 32, device=device).bfloat16() * 100
    for module in (plain, layer):
        with torch.autocast(device, dtype=torch.bfloat16):
            y = module(x)
        y.backward(g)
    assert layer.bias.grad.dtype == torch.float32
    assert torch.equal(layer.bias.grad, plain.bias.grad)
