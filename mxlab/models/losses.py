"""The training losses, in float32: ESMM's (CTR and CTCVR) and the sum of independent heads' cross-entropies."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from mxlab.data.batch import JaggedBatch
from mxlab.models.heads import head_label, head_logits
from mxlab.tasks import ESMM_HEADS


def _log1mexp(log_p: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(log_p)) for log_p < 0, accurate on both sides of -log 2; log_p is capped at
    -1e-12, so one example costs at most about 27.6 nats."""
    log_p = log_p.clamp(max=-1e-12)
    near_zero = log_p > -math.log(2.0)
    # each branch only sees inputs where it is finite, so no inf/NaN reaches the gradient
    log_p_near, log_p_far = torch.where(near_zero, log_p, -1.0), torch.where(near_zero, -1.0, log_p)
    return torch.where(near_zero, torch.log(-torch.expm1(log_p_near)), torch.log1p(-torch.exp(log_p_far)))


def esmm_loss(output: Any, batch: JaggedBatch) -> dict[str, torch.Tensor]:
    """Return {loss, ctr, ctcvr} (float32 scalars): binary cross-entropies of p_ctr against
    clicks and of p_ctcvr = p_ctr * p_cvr against click-and-convert, over all impressions;
    ``loss = ctr + ctcvr``, or ``ctr`` alone when the batch has no conversion labels
    (``batch.has_conversion`` False; ctcvr is still reported)."""
    logits = head_logits(output, ESMM_HEADS)
    ctr_logit, cvr_logit = logits["ctr"].float(), logits["cvr"].float()
    click = batch.click.float()
    converted = click * batch.conversion.float()
    ctr = F.binary_cross_entropy_with_logits(ctr_logit, click)
    log_ctcvr = F.logsigmoid(ctr_logit) + F.logsigmoid(cvr_logit)
    ctcvr = -(converted * log_ctcvr + (1.0 - converted) * _log1mexp(log_ctcvr)).mean()
    loss = ctr + ctcvr if batch.has_conversion else ctr
    return {"loss": loss, "ctr": ctr, "ctcvr": ctcvr}


def independent_loss(output: Any, batch: JaggedBatch, heads: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Return {loss, HEAD...} (float32 scalars): the binary cross-entropy of each head's logit against its label
    (mxlab.models.heads.head_label) and their sum. Refuses what head_logits and head_label refuse."""
    logits = head_logits(output, heads)
    parts = {
        head: F.binary_cross_entropy_with_logits(logits[head].float(), head_label(batch, head).float())
        for head in heads
    }
    return {"loss": torch.stack(list(parts.values())).sum(), **parts}
