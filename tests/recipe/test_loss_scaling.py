import pytest
import torch
from torch import nn

from mxlab.nn.linear import QLinear
from mxlab.nn.qmatmul import GemmQuant, MatmulPrecision, OperandQuant
from mxlab.recipe.loss_scaling import DynamicLossScaler, LossScalingConfig, make_loss_scaler, parse_loss_scaling


def one_parameter_step(scaler, gradient_value):
    """Run scaler.step on an optimizer whose single parameter has gradient `gradient_value` x scale."""
    parameter = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    parameter.grad = torch.full((3,), gradient_value * scaler.scale_value)
    stepped = scaler.step(optimizer)
    return stepped, parameter.detach()


def test_dynamic_backs_off_on_inf_skips_the_step_and_grows_after_the_interval():
    scaler = make_loss_scaler({"policy": "dynamic", "init_scale": 1024, "growth_interval": 3})
    stepped, parameter = one_parameter_step(scaler, float("inf"))
    assert not stepped and torch.equal(parameter, torch.ones(3))  # optimizer did not move
    assert scaler.scale_value == 512 and scaler.skipped_steps == 1
    for _ in range(2):
        stepped, parameter = one_parameter_step(scaler, 0.5)
        assert stepped and torch.allclose(parameter, torch.full((3,), 0.5))  # unscaled gradient applied
    assert scaler.scale_value == 512
    one_parameter_step(scaler, 0.5)
    assert scaler.scale_value == 1024
    assert scaler.scale_history == [(0, 1024.0), (0, 512.0), (3, 1024.0)]


def test_dynamic_matches_torch_grad_scaler_on_the_same_gradient_sequence():
    gradients = [1.0, float("inf"), 1.0, 1.0, float("nan"), 1.0, 1.0, 1.0, 1.0, float("inf"), 1.0]
    ours = make_loss_scaler(
        {"policy": "dynamic", "init_scale": 256, "growth_interval": 2, "growth_factor": 4, "backoff_factor": 0.25}
    )
    theirs = torch.amp.GradScaler("cpu", init_scale=256, growth_factor=4, backoff_factor=0.25, growth_interval=2)

    def train_step(scale, step, gradient):
        parameter = nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([parameter], lr=1.0)
        scale((parameter * gradient).sum()).backward()
        step(optimizer)
        return parameter.detach()

    for gradient in gradients:
        ours_parameter = train_step(ours.scale, ours.step, gradient)
        theirs_parameter = train_step(theirs.scale, theirs.step, gradient)
        theirs.update()
        assert ours.scale_value == theirs.get_scale()
        assert torch.equal(ours_parameter, theirs_parameter)
    assert ours.skipped_steps == 3


def test_state_dict_restores_scale_counters_and_growth_progress():
    scaler = make_loss_scaler({"policy": "dynamic", "init_scale": 64, "growth_interval": 2})
    one_parameter_step(scaler, float("inf"))
    one_parameter_step(scaler, 1.0)
    restored = make_loss_scaler({"policy": "dynamic", "init_scale": 64, "growth_interval": 2})
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale_value, restored.skipped_steps, restored.steps) == (32, 1, 2)
    one_parameter_step(restored, 1.0)  # completes the growth interval started before the save
    assert restored.scale_value == 64
    with pytest.raises(ValueError, match="policy 'dynamic'"):
        make_loss_scaler({"policy": "static"}).load_state_dict(scaler.state_dict())


def test_static_skips_non_finite_steps_without_changing_the_scale_and_none_never_skips():
    static = make_loss_scaler({"policy": "static", "init_scale": 8})
    assert one_parameter_step(static, float("nan"))[0] is False
    assert static.scale_value == 8 and static.skipped_steps == 1
    loss = torch.tensor(2.0)
    assert static.scale(loss).item() == 16.0
    none = make_loss_scaler(None)
    assert none.scale(loss) is loss
    assert one_parameter_step(none, 1.0)[0] is True and none.scale_value == 1.0


def test_config_validation_names_the_bad_key():
    with pytest.raises(
        ValueError, match=r"unknown key 'loss_scaling\.growth'; accepted keys in \[loss_scaling\]: policy"
    ):
        parse_loss_scaling({"policy": "dynamic", "growth": 2})
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScalingConfig(policy="dynamic", backoff_factor=2.0)
    with pytest.raises(ValueError, match="needs the model"):
        make_loss_scaler({"policy": "per_layer"})


def mx_layer(scale_mode="floor"):
    e4m3 = OperandQuant("e4m3", scale_mode=scale_mode)
    gemm = GemmQuant(e4m3, e4m3)
    return QLinear(
        32, 32, bias=False, precision=MatmulPrecision(gemm, gemm, gemm, labels=("fwd", "dgrad", "wgrad"), name="layer")
    )


def test_per_layer_scale_is_absorbed_by_mx_block_scales():
    """A power-of-two gradient scale changes nothing in MX (rceil) for float32-normal gradients, even
    in blocks whose E8M0 scale clamps at 2^-127 (amax < 2^-119 for E4M3). Positive operands keep
    every FP32 product and partial sum normal, so only the quantization could differ. (With the
    floor scale, a clamped block cannot saturate while its scaled copy can: see mxlab.recipe.loss_scaling.)"""
    torch.manual_seed(0)
    x = 1 + torch.rand(64, 32)
    g = torch.ldexp(1 + torch.rand(64, 32), torch.randint(-20, 4, (64, 32)))
    g[:32] = torch.ldexp(1 + torch.rand(32, 32), torch.randint(-124, -121, (32, 32)))  # clamped blocks
    grads = []
    for scale in (None, 1024.0):
        layer = mx_layer("rceil")
        with torch.no_grad():
            layer.weight.copy_(torch.eye(32) + 1)
        layer.precision.grad_scale = scale
        x_leaf = x.clone().requires_grad_()
        layer(x_leaf).backward(g)
        grads.append((x_leaf.grad, layer.weight.grad))
    for dx, dW in grads[1:]:
        assert torch.equal(dx, grads[0][0]) and torch.equal(dW, grads[0][1])


def test_per_layer_statistics_stay_on_the_device_until_one_read_per_step():
    """Each backward adds its gradient's counts (non-finite, nonzero, underflowing) on the gradient's device; the
    scaler's step reads every product's counts in one transfer."""
    from unittest import mock

    model = nn.Sequential(mx_layer(), mx_layer())
    scaler = make_loss_scaler({"policy": "per_layer", "init_scale": 1, "growth_interval": 1000}, model)
    g = torch.randn(64, 32)
    g[0, 0], g[1, 1] = 1e-39, 0.0  # one float32 subnormal (below 2^-126), one zero
    for _ in range(2):
        model(torch.randn(64, 32, requires_grad=True)).backward(g)
    stats = model[1].precision.grad_stats
    assert stats["counts"].dtype == torch.int64 and stats["counts"].tolist() == [0, 2 * (64 * 32 - 1), 2]
    assert stats["backward_calls"] == 2
    reads = mock.Mock(wraps=torch.Tensor.tolist)
    with mock.patch.object(torch.Tensor, "tolist", lambda self: reads(self)):
        scaler.step_on_device(torch.optim.SGD(model.parameters(), lr=0.0))
    assert reads.call_count == 1 and model[1].precision.grad_stats == {}


def test_per_layer_grows_on_underflow_backs_off_on_overflow_and_restores():
    model = nn.Sequential(mx_layer())
    config = {"policy": "per_layer", "init_scale": 1, "underflow_threshold": 0.1, "growth_interval": 1000}
    scaler = make_loss_scaler(config, model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(64, 32, requires_grad=True)
    model(x).backward(torch.randn(64, 32) * 1e-39)  # below float32's smallest normal, 2^-126
    assert scaler.step(optimizer)
    assert scaler.layer_scales == {"0": 2.0}
    model(x).backward(torch.full((64, 32), float("inf")))
    assert not scaler.step(optimizer)
    assert scaler.layer_scales == {"0": 1.0}
    assert scaler.layer_scale_history["0"] == [(0, 1.0), (0, 2.0), (1, 1.0)]
    model.zero_grad()
    flushed_not_underflowing = torch.full((64, 32), 1e-7)
    flushed_not_underflowing[:, 0] = 1.0  # flushed within their blocks, which no scale cures
    model(x).backward(flushed_not_underflowing)
    scaler.step(optimizer)
    assert scaler.layer_scales == {"0": 1.0}
    state = scaler.state_dict()
    other = make_loss_scaler(config, nn.Sequential(mx_layer()))
    other.load_state_dict(state)
    assert other.layer_scales == {"0": 1.0} and other.skipped_steps == 1
    assert isinstance(other, DynamicLossScaler)


def test_dynamic_scaler_with_a_fused_optimizer_never_reads_the_device(monkeypatch):
    scaler = make_loss_scaler({"policy": "dynamic", "init_scale": 1024, "growth_interval": 2})
    parameter = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([parameter], lr=0.1, fused=True)

    def refuse(*_):
        raise AssertionError("a host sync")

    stepped = []
    for gradient in (float("inf"), 1.0, 1.0, float("nan")):
        parameter.grad = None
        scaler.scale((parameter * gradient).sum()).backward()
        with monkeypatch.context() as patch:
            for name in ("__bool__", "__float__", "__int__", "item", "tolist"):
                patch.setattr(torch.Tensor, name, refuse)
            stepped.append(scaler.step_on_device(optimizer))
        if gradient == float("inf"):
            assert torch.equal(parameter.detach(), torch.ones(3))  # skipped on the device
    assert [bool(flag) for flag in stepped] == [False, True, True, False]
    assert not torch.equal(parameter.detach(), torch.ones(3))
    assert (scaler.scale_value, scaler.skipped_steps) == (512.0, 2)  # 1024 -> 512 -> 1024 after 2 -> 512
    assert scaler.scale_history == [(0, 1024.0), (0, 512.0), (2, 1024.0), (3, 512.0)]
