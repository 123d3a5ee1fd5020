"""The training step reads nothing back to the host; the loop reads the losses once per interval."""

from __future__ import annotations

import linecache
import sys
import warnings
from pathlib import Path

import pytest
import torch

from mxlab.data import make_source
from mxlab.experiment import load_spec
from mxlab.experiment.execution import ExecutionOptions
from mxlab.experiment.step import PendingStep, read_pending, train_step
from mxlab.models import build_model, esmm_loss
from mxlab.nn.attention import JaggedAttention
from mxlab.recipe.loss_scaling import make_loss_scaler
from tests.experiment import standins
from tests.experiment.test_runner_logic import SPEC

HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
OPTIMIZER_FILES = f"torch{Path('/optim/')}"  # Adam reads its step count, a host tensor on every device


@pytest.fixture(scope="module")
def source():
    return make_source({"source": "synthetic", "train_examples": 256, "eval_examples": 64, "n_users": 50}, 16)


def _attention_without_reads(self, q, k, v, q_offsets, k_offsets, *, causal=False, activation="softmax"):
    """Stands in for the attention (whose CPU reference path buckets by length on the host)."""
    return q + v.mean(0)


def _count_host_reads(monkeypatch) -> list[str]:
    """Patch every tensor method that reads a value back to the host; return the list of callers it fills."""
    calls: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def patched(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if OPTIMIZER_FILES not in caller:
                calls.append(f"{_name} from {caller}:{sys._getframe(1).f_lineno}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, patched)
    return calls


@pytest.mark.parametrize("precision, scaling", [("bf16", None), ("fp32", None), ("bf16", {"policy": "dynamic"})])
def test_the_train_step_of_the_model_reads_nothing_back(source, monkeypatch, precision, scaling):
    torch.manual_seed(0)
    model = build_model({"size": "tiny", "max_history": 16}, source.info).train()
    monkeypatch.setattr(JaggedAttention, "forward", _attention_without_reads)
    # a fused optimizer skips a non-finite step on the device, so the dynamic scaler reads nothing either
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=scaling is not None)
    scaler = make_loss_scaler(scaling)
    batches = list(source.train_batches(64, 0, 0))[:3]
    before = [parameter.detach().clone() for parameter in model.parameters()]
    calls = _count_host_reads(monkeypatch)
    results = [
        train_step(model, batch, optimizer, scaler, esmm_loss, device=torch.device("cpu"), precision=precision)
        for batch in batches
    ]
    assert calls == []
    monkeypatch.undo()
    assert all(
        result.shape == (3,) and result.dtype == torch.float32 and not result.requires_grad for result in results
    )
    loss, ctr, ctcvr = results[-1].tolist()
    assert loss == pytest.approx(ctr + ctcvr, rel=1e-6) and 0 < ctr < 2
    assert any(not torch.equal(old, new) for old, new in zip(before, model.parameters()))  # it did train


def test_pending_steps_are_read_in_one_transfer(monkeypatch):
    scaler = make_loss_scaler({"policy": "dynamic", "init_scale": 8.0})
    first_pending = PendingStep.after(1, 0, torch.tensor([1.0, 0.25, 0.75]), scaler, 16, 0.5)
    scaler.scale_on_device.fill_(2.0)  # a later in-place update of the scaler does not reach the snapshot
    scaler.skipped_on_device.fill_(3)
    pending = [first_pending, PendingStep.after(2, 1, torch.tensor([float("nan"), 1.0, 2.0]), scaler, 8, 0.25)]
    transfers = []
    original = torch.Tensor.cpu
    monkeypatch.setattr(
        torch.Tensor, "cpu", lambda self, *a, **k: transfers.append(self.shape) or original(self, *a, **k)
    )
    first, second = read_pending(pending)
    assert len(transfers) == 1 and read_pending([]) == []
    assert (first.step, first.epoch, first.losses, first.scale, first.skipped, first.examples) == (
        1,
        0,
        [1.0, 0.25, 0.75],
        8.0,
        0,
        16,
    )
    assert second.losses[1:] == [1.0, 2.0] and second.losses[0] != second.losses[0]
    assert (second.scale, second.skipped, second.seconds) == (2.0, 3, 0.25)


def test_the_loop_reads_losses_every_log_every_steps_and_at_checkpoints(monkeypatch, tmp_path):
    import mxlab.experiment.train as train_module
    from mxlab.experiment.runner import run_study

    standins.write_recipes(tmp_path, "base")
    (tmp_path / "logic.toml").write_text(SPEC)
    read_at: list[list[int]] = []
    original = train_module.read_pending
    monkeypatch.setattr(
        train_module, "read_pending", lambda pending: read_at.append([p.step for p in pending]) or original(pending)
    )
    spec = load_spec(tmp_path / "logic.toml", ['arms=["base"]', 'baseline="base"', "seeds=[0]"])
    run_study(spec, tmp_path / "out", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    # 96 examples / 16 = 6 steps per epoch, 2 epochs; log_every 3, checkpoint_every 4; epoch ends at 6 and 12
    assert [steps for steps in read_at if steps] == [[1, 2, 3], [4], [5, 6], [7, 8], [9], [10, 11, 12]]
    metrics = [line for line in (tmp_path / "out/runs/base/seed0/metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 4  # steps 3, 6, 9, 12


@pytest.mark.gpu
def test_the_model_and_step_do_not_sync_on_cuda(source):
    """On CUDA under torch's sync debug mode: no synchronisation from the model's or the step's own code
    (the backward and the loss scaler are named: theirs are other modules'); prints what remains."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = build_model({"size": "tiny", "max_history": 16}, source.info).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = make_loss_scaler(None)
    batches = [batch.to(device) for batch in list(source.train_batches(64, 0, 0))[:2]]
    for batch in batches:  # first calls: compilation, offset checks cached on the offsets tensors
        train_step(model, batch, optimizer, scaler, esmm_loss, device=device, precision="bf16")
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for batch in batches * 2:
                train_step(model, batch, optimizer, scaler, esmm_loss, device=device, precision="bf16")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [(record.filename, record.lineno) for record in caught if "synchroniz" in str(record.message)]
    print("syncs:", sorted(set(syncs)))
    mine = [
        (file, line)
        for file, line in syncs
        if ("mxlab/models/" in file or "mxlab/experiment/" in file)
        and not any(name in linecache.getline(file, line) for name in (".backward(", "scaler.step("))
    ]
    assert mine == []
