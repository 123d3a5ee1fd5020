"""One training step without host synchronisation, and the deferred host reads of its results.

`train_step` runs forward (under the run's autocast), the loss, backward, the loss scaler and
the optimizer, and returns the step's losses as a device tensor: nothing in it reads a value
back to the host, so the host can queue the next step while the device works. (What the model's
layers and the loss scaler do inside is theirs; the host reads that remain inside a step, by owner:

- `mxlab.recipe.loss_scaling`: `step_on_device` checks every gradient's finiteness and updates
  the scale on the device; it reads the overflow flag once only for an optimizer that cannot
  skip on the device (not fused), and per_layer reads each product's gradient statistics;
- `mxlab.kernels.attention.api.check_jagged_offsets`: one read per new offsets tensor (each
  batch's history offsets; the model reuses its query offsets from step to step);
- `mxlab.nn.attention`'s reference path (CPU, or what the kernel cannot run) buckets on the host;
- `mxlab.nn.qmatmul`: emulated GEMMs check operands and record gradient statistics on the host;
- any read inside torch's own CUDA backward kernels (tests/experiment/test_train_step.py's GPU
  test prints every sync a step still makes);
- a sampled `mxlab.recipe.diagnostics` step reads its statistics.)

The training loop keeps each step's device results in a `PendingStep` and reads a whole
interval of them back at once with `read_pending` (one transfer every `log_every` steps, at a
checkpoint, and at the end), then replays the host-side logic (divergence checks, log records)
step by step on the values read, so what it records is what a per-step read would record.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from mxlab.nn.bf16_gemm import bf16_gemms_in_float32


@contextlib.contextmanager
def _cpu_bf16_autocast() -> Any:
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16), bf16_gemms_in_float32():
        yield


def autocast(device: torch.device, precision: str) -> Any:
    """The autocast context of train.precision: bfloat16 autocast on `device` for "bf16" (on a CPU with its
    GEMMs as float32 GEMMs of bfloat16-rounded operands, mxlab.nn.bf16_gemm), nothing for "fp32"."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        if device.type == "cpu":
            return _cpu_bf16_autocast()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"unknown precision {precision!r}; accepted: bf16, fp32")


def train_step(
    model: torch.nn.Module,
    batch: Any,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    loss_fn: Callable[[Any, Any], dict[str, torch.Tensor]],
    *,
    device: torch.device,
    precision: str,
    sampling: AbstractContextManager[Any] | None = None,
    loss_weight: float = 1.0,
) -> torch.Tensor:
    """One step: zero the gradients, forward under `autocast(device, precision)`, `loss_fn`, the
    scaled backward, `scaler.step_on_device(optimizer)` (with a fused optimizer
    the skip of a non-finite step is decided on the device too).

    Returns the detached float32 tensor of the loss's values in its order ([loss, loss_ctr, loss_ctcvr] for
    ESMM's; mxlab.models.loss_components) on the device; reads nothing
    back to the host itself. `sampling` (a diagnostics context) wraps forward and backward;
    `loss_weight` multiplies the loss that is backpropagated (a data-parallel rank's share of the batch).
    Refuses an unknown precision (ValueError).
    """
    optimizer.zero_grad(set_to_none=True)
    with sampling if sampling is not None else contextlib.nullcontext():
        with autocast(device, precision):
            output = model(batch)
        losses = loss_fn(output, batch)
        scaler.scale(losses["loss"] * loss_weight if loss_weight != 1.0 else losses["loss"]).backward()
    scaler.step_on_device(optimizer)
    return torch.stack(list(losses.values())).detach().float()


@dataclass
class PendingStep:
    """A finished step whose device results have not been read yet."""

    step: int
    epoch: int
    losses: torch.Tensor  # on the device: loss, then the loss's components (ctr, ctcvr for ESMM's)
    scale: torch.Tensor  # 0-d, the loss scale after the step
    skipped: torch.Tensor  # 0-d, the scaler's skipped steps after the step
    examples: int
    seconds: float
    grad_norm: torch.Tensor | None = None  # 0-d, the global gradient norm before clipping (None: not taken)

    @classmethod
    def after(
        cls,
        step: int,
        epoch: int,
        losses: torch.Tensor,
        scaler: Any,
        examples: int,
        seconds: float,
        grad_norm: torch.Tensor | None = None,
    ) -> PendingStep:
        """The record of a step just taken: copies of the scaler's device-side scale and skipped count
        (`scale_on_device`, `skipped_on_device` of mxlab.recipe.loss_scaling's scalers) and of the
        optimizer's gradient norm (mxlab.experiment.optim.SplitOptimizer.grad_norm); no sync."""
        return cls(
            step,
            epoch,
            losses,
            scaler.scale_on_device.detach().clone(),
            scaler.skipped_on_device.detach().clone(),
            examples,
            seconds,
            None if grad_norm is None else grad_norm.detach().clone(),
        )


@dataclass
class ReadStep:
    """A PendingStep with its values on the host."""

    step: int
    epoch: int
    losses: list[float]
    scale: float
    skipped: int
    examples: int
    seconds: float
    grad_norm: float = math.nan  # NaN: the step took no gradient norm (skipped, or no optimizer step)


def read_pending(pending: Sequence[PendingStep]) -> list[ReadStep]:
    """The host values of `pending`, in order, read with one device-to-host transfer (none when empty)."""
    if not pending:
        return []
    device = pending[0].losses.device
    values = iter(
        torch.cat(
            [
                torch.cat(
                    [
                        value.reshape(-1).to(device, torch.float64)
                        for value in (entry.losses, entry.scale, entry.skipped, _norm(entry))
                    ]
                )
                for entry in pending
            ]
        )
        .cpu()
        .tolist()
    )
    read = []
    for entry in pending:
        losses = [next(values) for _ in range(entry.losses.numel())]
        scale, skipped, norm = next(values), next(values), next(values)
        read.append(
            ReadStep(entry.step, entry.epoch, losses, float(scale), int(skipped), entry.examples, entry.seconds, norm)
        )
    return read


def _norm(entry: PendingStep) -> torch.Tensor:
    if entry.grad_norm is not None:
        return entry.grad_norm
    return torch.full((), math.nan, device=entry.losses.device)


__all__ = ["PendingStep", "ReadStep", "autocast", "read_pending", "train_step"]
