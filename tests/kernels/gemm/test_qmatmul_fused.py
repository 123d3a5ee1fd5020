"""qmatmul and QLinear through the fused MX GEMM: forward, dgrad and wgrad equal the products of the
reference path's quantized operands (as the GEMM observer shows them) within float32 accumulation, every
GEMM runs in the fused kernel, and the gradient statistics stay on the device. CPU: the kernel under
TRITON_INTERPRET=1 with MXLAB_BACKEND=triton, tiny shapes; `-m gpu`: CUDA, QLinear-sized shapes, no host
synchronisation in forward + backward."""
import pytest
import torch

from mxlab.nn.linear import QLinear
from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant, qmatmul, set_gemm_observer

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)

SQUARE = (32, 32)


def precision(kind: str) -> MatmulPrecision:
    e4m3 = OperandQuant("e4m3", 32, "rceil")
    e5m2 = OperandQuant("e5m2", 32, "rceil")
    if kind == "mxfp8":
        return MatmulPrecision(GemmQuant(e4m3, e4m3), GemmQuant(e5m2, e4m3), GemmQuant(e4m3, e5m2), seed=3)
    if kind == "stochastic-square":
        w = OperandQuant("e2m1", SQUARE, "floor")
        g = OperandQuant("e2m1", 32, "even", "stochastic")
        return MatmulPrecision(GemmQuant(OperandQuant("int8"), w), GemmQuant(g, w), GemmQuant(OperandQuant("e3m2", 32, "ceil", "toward_zero"), g), seed=4)
    assert kind == "hadamard"
    sr = OperandQuant("e4m3", 32, "rceil", "stochastic")
    return MatmulPrecision(GemmQuant(e4m3, e4m3, hadamard=32), GemmQuant(sr, e4m3, hadamard=32),
                           GemmQuant(e4m3, sr, hadamard=32), seed=5)


def expected(records: dict) -> dict:
    """label -> (float64 product of the recorded quantized operands, float64 product of magnitudes, K)."""
    out = {}
    for label, transpose_a, transpose_b in (("fwd", False, False), ("grad_a", False, True), ("grad_b", True, False)):
        a, b = records[label]["a_q"].double(), records[label]["b_q"].double()
        a = a.transpose(-1, -2) if transpose_a else a
        b = b.transpose(-1, -2) if transpose_b else b
        out[label] = (a @ b, a.abs() @ b.abs(), a.shape[-1])
    return out


def assert_within_accumulation(got: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, k: int) -> None:
    unit = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}[got.dtype]
    bound = (k + 2) * 2.0 ** -24 * magnitude + unit * exact.abs() + 2.0 ** -149 * k
    assert ((got.double() - exact).abs() <= bound).all()


def step(a, b, g, prec):
    a_leaf, b_leaf = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = qmatmul(a_leaf, b_leaf, prec)
    out.backward(g)
    return out.detach(), a_leaf.grad, b_leaf.grad


def reference_records(a, b, g, prec, monkeypatch) -> dict:
    records = {}
    monkeypatch.setenv("MXLAB_BACKEND", "reference")
    previous = set_gemm_observer(lambda **record: records.__setitem__(record["gemm"], record))
    try:
        step(a, b, g, prec)
    finally:
        set_gemm_observer(previous)
    return records


@pytest.fixture
def counted(gemm, monkeypatch):
    """Run the fused kernel (MXLAB_BACKEND=triton) and count its calls."""
    calls = []
    original = gemm.mx_gemm
    monkeypatch.setattr(gemm, "mx_gemm", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    return calls


def check_qmatmul(a, b, g, kind, monkeypatch, calls):
    records = reference_records(a, b, g, precision(kind), monkeypatch)
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    out, grad_a, grad_b = step(a, b, g, precision(kind))
    assert len(calls) == 3
    want = expected(records)
    k = a.shape[-1]
    exact, magnitude, _ = want["fwd"]
    assert_within_accumulation(out.cpu(), exact, magnitude, k)
    exact, magnitude, n = want["grad_a"]
    assert_within_accumulation(grad_a.cpu(), exact, magnitude, n)
    exact, magnitude, m = want["grad_b"]
    assert_within_accumulation(grad_b.cpu(), exact, magnitude, m)


@pytest.mark.parametrize("kind", ["mxfp8", "stochastic-square", "hadamard"])
def test_qmatmul_fused_equals_the_reference_products(gemm, device, counted, monkeypatch, kind):
    torch.manual_seed(1)
    a = torch.randn(40, 70, device=device)
    b = (torch.randn(70, 36, device=device) * 0.05).to(torch.bfloat16)
    g = torch.randn(40, 36, device=device)
    check_qmatmul(a, b.float(), g, kind, monkeypatch, counted)


def test_batched_qmatmul_fused(gemm, device, counted, monkeypatch):
    torch.manual_seed(2)
    a = torch.randn(2, 33, 40, device=device).to(torch.bfloat16)
    b = torch.randn(2, 40, 20, device=device).to(torch.bfloat16)
    g = torch.randn(2, 33, 20, device=device).to(torch.bfloat16)
    check_qmatmul(a, b, g, "mxfp8", monkeypatch, counted)


def qlinear_step(layer: QLinear, x: torch.Tensor, g: torch.Tensor):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(g)
    return y.detach(), x.grad, layer.weight.grad


def qlinear_reference_records(layer: QLinear, x, g, kind: str, monkeypatch) -> dict:
    """The observer's records of one reference-path step; leaves the layer with a fresh precision of `kind`."""
    records = {}
    monkeypatch.setenv("MXLAB_BACKEND", "reference")
    previous = set_gemm_observer(lambda **record: records.__setitem__(record["gemm"], record))
    try:
        qlinear_step(layer, x, g)
    finally:
        set_gemm_observer(previous)
    layer.weight.grad = None
    layer.precision = precision(kind)
    return records


def test_qlinear_fused_equals_the_reference_products(gemm, device, counted, monkeypatch):
    torch.manual_seed(3)
    layer = QLinear(70, 36, bias=False, precision=precision("mxfp8"), device=device)
    x = torch.randn(4, 10, 70, device=device)
    g = torch.randn(4, 10, 36, device=device)
    records = qlinear_reference_records(layer, x, g, "mxfp8", monkeypatch)
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    y, grad_x, grad_w = qlinear_step(layer, x, g)
    assert len(counted) == 3
    want = expected(records)
    exact, magnitude, k = want["fwd"]
    assert_within_accumulation(y.reshape(40, 36).cpu(), exact, magnitude, k)
    exact, magnitude, n = want["grad_a"]
    assert_within_accumulation(grad_x.reshape(40, 70).cpu(), exact, magnitude, n)
    exact, magnitude, m = want["grad_b"]
    assert_within_accumulation(grad_w.t().cpu(), exact, magnitude, m)


def test_grad_stats_accumulate_on_the_device(gemm, device, monkeypatch):
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    prec = precision("mxfp8")
    prec.grad_scale = 2.0
    a, b = torch.randn(32, 64, device=device), torch.randn(64, 32, device=device)
    g = torch.randn(32, 32, device=device)
    g[0, :5] = 0.0
    g[1, 0] = 1e-39
    for _ in range(2):
        step(a, b, g, prec)
    stats = prec.reset_grad_stats()
    assert isinstance(stats["nonzero"], torch.Tensor) and stats["nonzero"].device.type == torch.device(device).type
    assert int(stats["nonzero"]) == 2 * (32 * 32 - 5) and int(stats["underflow"]) == 2 and int(stats["nonfinite"]) == 0
    assert stats["backward_calls"] == 2


@pytest.mark.gpu
def test_gpu_qlinear_fused_without_host_sync(gemm, monkeypatch):
    """QLinear-sized shapes on CUDA: the fused path equals the reference products and never syncs."""
    torch.manual_seed(4)
    for kind in ("mxfp8", "stochastic-square", "hadamard"):
        layer = QLinear(520, 300, bias=False, precision=precision(kind), device="cuda")
        x = torch.randn(1000, 520, device="cuda").to(torch.bfloat16)
        g = torch.randn(1000, 300, device="cuda").to(torch.bfloat16)
        records = qlinear_reference_records(layer, x, g, kind, monkeypatch)
        monkeypatch.delenv("MXLAB_BACKEND")
        qlinear_step(layer, x, g)  # compile outside the sync check
        layer.weight.grad = None
        layer.precision = precision(kind)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            y, grad_x, grad_w = qlinear_step(layer, x, g)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = expected(records)
        assert_within_accumulation(y.cpu(), *want["fwd"][:2], 520)
        assert_within_accumulation(grad_x.cpu(), *want["grad_a"][:2], 300)
        assert_within_accumulation(grad_w.t().cpu(), *want["grad_b"][:2], 1000)


def test_fused_forward_saves_only_the_high_precision_inputs(gemm, device, counted, monkeypatch):
    """A square-block weight is reused from the forward on the reference path; the fused path keeps no copy."""
    monkeypatch.setenv("MXLAB_BACKEND", "triton")
    w = OperandQuant("e4m3", SQUARE, "rceil")
    prec = MatmulPrecision(GemmQuant(OperandQuant("e4m3"), w), GemmQuant(OperandQuant("e5m2"), w), GemmQuant(OperandQuant("e4m3"), OperandQuant("e5m2")))
    a = torch.randn(32, 64, device=device, requires_grad=True)
    b = torch.randn(64, 32, device=device, requires_grad=True)
    out = qmatmul(a, b, prec)
    assert len(counted) == 1
    assert out.grad_fn.b_quantized is None
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0] is a and saved[1] is b


def test_refused_gemms_take_the_reference_path(gemm, device, counted, monkeypatch):
    """Per-tensor FP8, a high-precision operand, Hadamard 64 and an installed observer: no fused call, and the
    reference path's bits."""
    a, b = torch.randn(32, 64, device=device), torch.randn(64, 32, device=device)
    mx = OperandQuant("e4m3")
    for fwd in (GemmQuant(OperandQuant("fp8_tensor_e4m3"), mx), GemmQuant(OperandQuant("bf16"), mx), GemmQuant(mx, mx, hadamard=64)):
        monkeypatch.setenv("MXLAB_BACKEND", "reference")
        expected_out = qmatmul(a, b, MatmulPrecision(fwd=fwd))
        monkeypatch.setenv("MXLAB_BACKEND", "triton")
        assert torch.equal(qmatmul(a, b, MatmulPrecision(fwd=fwd)), expected_out)
    previous = set_gemm_observer(lambda **record: None)
    try:
        qmatmul(a, b, MatmulPrecision(fwd=GemmQuant(mx, mx)))
    finally:
        set_gemm_observer(previous)
    assert counted == []
