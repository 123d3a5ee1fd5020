"""Emulated MX layers under torch.compile with its default settings (automatic dynamic shapes): every format,
block, scale mode and rounding gives eager mode's bits, output and both gradients, with layers of several widths
compiled in one process (the second width used to make the block axis symbolic and unblock the tensor)."""

import pytest
import torch
from torch import nn

from mxlab.nn.linear import QLinear
from mxlab.nn.precision import GemmQuant, MatmulPrecision, OperandQuant
from mxlab.numerics.formats import FORMATS
from mxlab.numerics.quant import fake_quantize
from mxlab.numerics.vocab import Rounding, ScaleMode
from mxlab.recipe import apply_recipe, load_recipe

# (format, block, scale mode, rounding, grad format, hadamard, in_features, out_features): every value of each
# option at least once, each layer its own width (some not a multiple of 32: padded blocks).
LAYERS = [
    ("e4m3", 32, "rceil", "nearest_even", "e4m3", None, 64, 96),
    ("e5m2", (32, 32), "floor", "stochastic", "e5m2", None, 96, 64),
    ("e2m1", 32, "ceil", "nearest_away", "e2m1", None, 40, 72),
    ("int8", 32, "even", "toward_zero", "int8", None, 128, 32),
    ("e3m2", (32, 32), "even", "nearest_even", "e5m2", None, 32, 160),
    ("e2m3", 32, "floor", "stochastic", "e2m3", None, 160, 48),
    ("e4m3", (32, 32), "ceil", "toward_zero", "e4m3", None, 48, 64),
    ("e2m1", (32, 32), "rceil", "stochastic", "e2m1", None, 64, 40),
    ("e4m3", 32, "rceil", "nearest_even", "e5m2", 32, 96, 96),
    ("fp8_tensor_e4m3", 32, "floor", "nearest_even", "fp8_tensor_e5m2", None, 72, 64),
]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _assert_same_bits(eager, compiled, what: str) -> None:
    for name, want, got in zip(("output", "input grad", "weight grad", "bias grad"), eager, compiled):
        assert torch.equal(_bits(want), _bits(got)), f"{what}: {name} differs from eager mode"


def _layer(fmt, block, scale_mode, rounding, grad_fmt, hadamard, in_features, out_features) -> QLinear:
    operand = OperandQuant(fmt, block, scale_mode, "nearest_even" if fmt.startswith("fp8") else rounding)
    grad = OperandQuant(grad_fmt, block, scale_mode, "nearest_even" if grad_fmt.startswith("fp8") else rounding)
    precision = MatmulPrecision(
        GemmQuant(operand, operand), GemmQuant(grad, operand), GemmQuant(operand, grad, hadamard), name="layer"
    )
    precision.seed = 7
    torch.manual_seed(in_features * 1000 + out_features)
    return QLinear(in_features, out_features, precision=precision)


def _input(rows: int, features: int) -> torch.Tensor:
    x = torch.randn(rows, features)
    x[:, :32] *= 2.0**-20  # a small-magnitude block: one scale for the whole row would flush it to zero
    x[0, :] = 0.0
    x[1, 1] = 2.0**-140  # a float32 subnormal
    return x


def _step(layer: QLinear, fn, x: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = fn(layer, x)
    y.backward(grad)
    out = [y.detach(), x.grad, layer.weight.grad, layer.bias.grad]
    layer.weight.grad = layer.bias.grad = None
    return out


def _call(layer, x):
    return layer(x)


@pytest.mark.parametrize("backend", [pytest.param("eager", marks=pytest.mark.slow), "aot_eager"])
def test_layers_of_every_option_and_several_widths_compile_to_eager_bits(backend):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(_call, backend=counter)
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        for spec in LAYERS:
            layer = _layer(*spec)
            x, grad = _input(40, spec[6]), torch.randn(40, spec[7]) * 2.0**-10
            for call in range(2 if layer.precision.draws_per_call else 1):  # the second call draws the next seeds
                calls = layer.precision.calls
                eager = _step(layer, _call, x, grad)
                layer.precision.calls = calls
                _assert_same_bits(eager, _step(layer, compiled, x, grad), f"{backend} {spec} call {call}")
    assert counter.frame_count >= 1


def test_fake_quantize_of_every_format_scale_mode_and_rounding_compiles_to_eager_bits():
    """One graph quantizes blocks holding zeros, subnormals, NaN and Inf along both axes and in (32, 32) tiles."""

    def every_option(x):
        outs = []
        for index, fmt in enumerate(FORMATS):  # each scale mode and rounding with several formats
            scale_mode, rounding = list(ScaleMode)[index % 4], list(Rounding)[(index + 1) % 4]
            seed = 11 if rounding == "stochastic" else None
            options = {"scale_mode": scale_mode, "rounding": rounding, "seed": seed, "pad": True}
            outs.append(fake_quantize(x, fmt, axis=index % 2, **options))
            outs.append(fake_quantize(x, fmt, block=(32, 32), **options))
        return outs

    torch.manual_seed(0)
    x = torch.randn(64, 72) * torch.logspace(-30, 30, 72, base=2.0)
    x[:32, :32] = 0.0
    x[40, 3], x[50, 60], x[33, 40] = float("nan"), float("inf"), 2.0**-145
    torch._dynamo.reset()
    compiled = torch.compile(every_option, backend="aot_eager")
    for want, got in zip(every_option(x), compiled(x)):
        assert torch.equal(_bits(want), _bits(got))


def test_a_deterministic_recipe_compiles_whole_and_a_stochastic_one_says_why_not():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))
    apply_recipe(model, load_recipe("mxfp8-rceil"))
    x = torch.randn(8, 64)
    assert torch.equal(torch.compile(model, backend="eager", fullgraph=True)(x), model(x))
    apply_recipe(model, load_recipe("mxfp8-rceil-sr"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="_drawing_product_outside_the_graph"):
        torch.compile(model, backend="eager", fullgraph=True)(x)


@pytest.mark.slow
def test_inductor_on_the_cpu_compiles_a_layer_to_eager_bits():
    """The emulated GEMMs' bits; the bias gradient is a plain float32 sum, which Inductor reorders (nn.Linear too)."""
    torch._dynamo.reset()
    compiled = torch.compile(_call, backend="inductor")
    for spec in (LAYERS[0], LAYERS[3]):
        layer = _layer(*spec)
        x, grad = _input(40, spec[6]), torch.randn(40, spec[7])
        eager, got = _step(layer, _call, x, grad), _step(layer, compiled, x, grad)
        _assert_same_bits(eager[:3], got[:3], f"inductor {spec}")
        torch.testing.assert_close(eager[3], got[3], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_inductor_gives_a_bfloat16_models_eager_bits_with_emulate_precision_casts():
    """Linear-GELU-Linear in bfloat16 under mxfp8-rceil: Inductor fuses the GELU into the second layer's quantizer.
    With `emulate_precision_casts` it rounds the GELU's output to bfloat16 as eager mode does, and the model gives
    eager mode's bits; with PyTorch's default (off) the quantizer reads unrounded values and the bits differ
    (docs/applying.md, "torch.compile")."""
    import torch._inductor.config as inductor_config

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 192)).to(torch.bfloat16)
    apply_recipe(model, load_recipe("mxfp8-rceil"), seed=1)
    x = torch.randn(256, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = model(x)
        for emulate in (True, False):
            torch._dynamo.reset()
            with inductor_config.patch(emulate_precision_casts=emulate):
                compiled = torch.compile(model, backend="inductor")(x)
            assert torch.equal(_bits(compiled), _bits(eager)) == emulate, f"emulate_precision_casts={emulate}"


def _autocast_step(layer: nn.Sequential, fn, x: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    """Output, input grad and weight grad of `fn` (the layer, or it compiled) under bfloat16 CPU autocast."""
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fn(x)
    y.backward(grad)
    out = [y.detach(), x.grad, layer[0].weight.grad]
    layer.zero_grad(set_to_none=True)
    return out


@pytest.mark.slow
def test_inductor_on_the_cpu_compiles_a_layer_under_bfloat16_autocast_with_rows_not_a_multiple_of_32():
    """Inductor's C++ code fuses the casts of the input (122 rows) and the weight horizontally, and its loop split
    then fails an assertion (torch 2.13); apply_recipe turns that fusion off (cpp.max_horizontal_fusion_size = 1),
    and the layer compiles to eager mode's bits. The first half checks the failure is still PyTorch's to fix."""
    import torch._inductor.config as inductor_config
    from torch._inductor.exc import InductorError

    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(128, 128))
    apply_recipe(layer, load_recipe("mxfp8-rceil"))
    x, grad = torch.randn(122, 128), torch.randn(122, 128, dtype=torch.bfloat16)

    torch._dynamo.reset()
    with inductor_config.patch({"cpp.max_horizontal_fusion_size": 16}), pytest.raises(InductorError, match="{y0: 122"):
        _autocast_step(layer, torch.compile(layer, backend="inductor"), x, grad)
    assert inductor_config.cpp.max_horizontal_fusion_size == 1
    torch._dynamo.reset()
    eager, compiled = (
        _autocast_step(layer, layer, x, grad),
        _autocast_step(layer, torch.compile(layer, backend="inductor"), x, grad),
    )
    for name, want, got in zip(("output", "input grad", "weight grad"), eager, compiled):
        assert torch.equal(_bits(want), _bits(got)), f"{name} differs from eager mode"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["mxfp8-rceil-sr", "mxfp8-hadamard", "mxfp8-square32", "mxfp4-all"])
def test_inductor_on_the_cpu_gives_each_recipe_familys_eager_bits_under_bfloat16_autocast(recipe):
    """Stochastic rounding, the random Hadamard transform, square blocks and MXFP4 at the shape of the test above
    (122 rows): eager mode's bits, the compiled call drawing the same seeds (the counters put back)."""
    from mxlab.recipe import load_rounding_state, rounding_state

    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(128, 128))
    apply_recipe(layer, load_recipe(recipe), seed=3)
    x, grad = torch.randn(122, 128), torch.randn(122, 128, dtype=torch.bfloat16)

    torch._dynamo.reset()
    state = rounding_state(layer)
    eager = _autocast_step(layer, layer, x, grad)
    load_rounding_state(layer, state)
    compiled = _autocast_step(layer, torch.compile(layer, backend="inductor"), x, grad)
    for name, want, got in zip(("output", "input grad", "weight grad"), eager, compiled):
        assert torch.equal(_bits(want), _bits(got)), f"{recipe}: {name} differs from eager mode"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch._inductor.config.patch(emulate_precision_casts=True)
def test_cuda_inductor_compiles_a_recipe_to_eager_bits_and_mxfp8_rceil_whole(dtype):
    """Inductor with emulate_precision_casts (without it, the GELU fused into the next quantizer is not rounded to
    bfloat16: the CPU test above). A float32 model compiles to eager bits, or refuses with the one clear error."""
    torch._dynamo.reset()
    if dtype == torch.float32:
        model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 192)).cuda()
        apply_recipe(model, load_recipe("mxfp8-rceil"), seed=1)
        x = torch.randn(1024, 256, device="cuda")
        try:
            compiled = torch.compile(model)(x)
        except Exception as refusal:  # noqa: BLE001  (Dynamo wraps the layer's RuntimeError)
            assert "compile the model in bfloat16" in str(refusal)
            return
        assert torch.equal(_bits(compiled.detach()), _bits(model(x).detach()))
        return
    for recipe, fullgraph in (("mxfp8-rceil", True), ("mxfp4-all", False), ("mxfp8-rceil-sr", False)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 192)).cuda().to(dtype)
        apply_recipe(model, load_recipe(recipe), seed=1)
        compiled = torch.compile(model, fullgraph=fullgraph)
        x = torch.randn(1024, 256, device="cuda", dtype=dtype)
        grad = torch.randn(1024, 192, device="cuda", dtype=dtype)
        results = []
        for fn in (model, compiled):
            products = [p for m in model.modules() if isinstance(m, QLinear) for p in [m.precision]]
            calls = [p.calls for p in products]
            xi = x.clone().requires_grad_(True)
            y = fn(xi)
            y.backward(grad)
            results.append([y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()])
            model.zero_grad(set_to_none=True)
            for p, c in zip(products, calls):
                p.calls = c
        for want, got in zip(*results):
            assert torch.equal(_bits(want), _bits(got)), recipe


def _norms_and_rotary(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, table) -> torch.Tensor:
    """layer norm, doubling (exact), RMS norm, rotary embedding over two heads (the table built outside:
    Inductor's cos and sin need not round as ATen's)."""
    from mxlab.nn.norms import layer_norm, rms_norm
    from mxlab.nn.rotary import rotary_embedding

    y = rms_norm(2 * layer_norm(x, weight, bias, 1e-5), weight, 1e-6)
    return rotary_embedding(y.view(y.shape[0], 2, y.shape[1] // 2), table).flatten(1)


def _table(x: torch.Tensor):
    from mxlab.nn.rotary import rotary_table

    return rotary_table(torch.arange(x.shape[0], device=x.device), x.shape[1] // 2)


def test_the_norms_and_rotary_stay_in_the_graph_where_torch_computes_them():
    """On the CPU (torch's formulas) a compiled model has no graph break at the norms or the rotary embedding;
    only their CUDA kernels run outside the graph."""
    x, weight, bias = torch.randn(16, 64), torch.randn(64), torch.randn(64)
    explanation = torch._dynamo.explain(_norms_and_rotary)(x, weight, bias, _table(x))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_inductor_keeps_the_norm_and_rotary_kernels_eager_bits(dtype):
    """The Triton norm and rotary kernels under Inductor: output and all three gradients equal eager mode's bits
    (the kernels run outside the graph; traced, a compiled GEM step failed in Inductor's partitioner)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(1024, 256, device="cuda", dtype=dtype)
    weight, bias = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    grad = torch.randn(1024, 256, device="cuda", dtype=dtype)
    results = []
    for fn in (_norms_and_rotary, torch.compile(_norms_and_rotary)):
        inputs = [t.clone().requires_grad_(True) for t in (x, weight, bias)]
        fn(*inputs, _table(x)).backward(grad)
        results.append([fn(*inputs, _table(x)).detach()] + [t.grad for t in inputs])
    for name, want, got in zip(("output", "x grad", "weight grad", "bias grad"), *results):
        assert torch.equal(_bits(want), _bits(got)), name
