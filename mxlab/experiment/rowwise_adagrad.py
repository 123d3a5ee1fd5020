"""Row-wise Adagrad for embedding tables, as FBGEMM's EXACT_ROWWISE_ADAGRAD (torchrec's default) trains them.

One accumulator per table row (not per element): for a row r with gradient g_r (D values),

    s_r += mean(g_r ** 2);    w_r -= lr * g_r / (sqrt(s_r) + eps)

A row absent from the batch has a zero gradient, so neither it nor its accumulator moves: unlike Adam
on a dense table, no row keeps moving on stale moments. torch has no such optimizer (torch.optim.Adagrad
keeps one accumulator per element, SparseAdam needs nn.Embedding(sparse=True), which the model's
autocast path and data-parallel wrapper do not use), and torchrec/FBGEMM need their CUDA kernels, so it
is written here: a few tensor operations on the dense gradient, on any device.

Skipping on the device: given `found_inf` (a 0-d tensor set by a loss scaler, mxlab.recipe.loss_scaling),
a step with a non-finite gradient leaves weights and accumulators as they were, without a host read.
"""

from __future__ import annotations

from typing import Any

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over 2-D parameters (embedding tables); state "sum": (rows,) float32 per table.

    Refuses a parameter that is not 2-D, lr <= 0 and eps <= 0 (ValueError).
    """

    def __init__(self, params: Any, lr: float = 0.01, eps: float = 1e-8, initial_accumulator: float = 0.0) -> None:
        if not lr > 0 or not eps > 0:
            raise ValueError(f"RowWiseAdagrad needs lr > 0 and eps > 0, got lr={lr}, eps={eps}")
        super().__init__(params, {"lr": lr, "eps": eps, "initial_accumulator": initial_accumulator})
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.dim() != 2:
                    raise ValueError(
                        f"RowWiseAdagrad trains 2-D tables, got a parameter of shape {tuple(parameter.shape)}"
                    )

    @torch.no_grad()
    def step(self, closure: Any = None, found_inf: torch.Tensor | None = None) -> None:
        """One step over every table with a gradient; with `found_inf` nonzero, nothing changes."""
        if closure is not None:
            raise ValueError("RowWiseAdagrad takes no closure")
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                grad = parameter.grad.float()
                state = self.state[parameter]
                if "sum" not in state:
                    state["sum"] = torch.full(
                        (parameter.shape[0],),
                        group["initial_accumulator"],
                        dtype=torch.float32,
                        device=parameter.device,
                    )
                accumulated = state["sum"] + grad.square().mean(dim=1)
                update = grad * (group["lr"] / (accumulated.sqrt() + group["eps"])).unsqueeze(1)
                if found_inf is not None:
                    skip = found_inf.to(parameter.device) > 0
                    accumulated = torch.where(skip, state["sum"], accumulated)
                    update = torch.where(skip, torch.zeros_like(update), update)
                state["sum"].copy_(accumulated)
                parameter.sub_(update.to(parameter.dtype))
