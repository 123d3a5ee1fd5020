"""Evaluation: predictions and labels of a trained model on the eval set, in the source's fixed order."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

EVAL_FIELDS = ("click", "conversion", "p_ctr", "p_cvr", "p_ctcvr", "user_id")
TRUTH_FIELDS = ("true_ctr", "true_cvr")


@torch.no_grad()
def evaluate_model(model: torch.nn.Module, source: Any, batch_size: int, device: torch.device | str) -> dict[str, np.ndarray]:
    """Run `model` over `source.eval_batches(batch_size)`; return eval.npz's arrays.

    Keys: click, conversion, p_ctr, p_cvr, p_ctcvr (float32), user_id (int64), and true_ctr,
    true_cvr when the source has ground truth. p_ctcvr = p_ctr * p_cvr. The model is left in
    train mode afterwards. Refuses an eval set with no examples.
    """
    was_training = model.training
    model.eval()
    columns: dict[str, list[np.ndarray]] = {key: [] for key in EVAL_FIELDS + TRUTH_FIELDS}
    try:
        for batch in source.eval_batches(batch_size):
            batch = batch.to(device)
            output = model(batch)
            p_ctr = torch.sigmoid(output.ctr_logit.float())
            p_cvr = torch.sigmoid(output.cvr_logit.float())
            columns["p_ctr"].append(p_ctr.cpu().numpy())
            columns["p_cvr"].append(p_cvr.cpu().numpy())
            columns["p_ctcvr"].append((p_ctr * p_cvr).cpu().numpy())
            columns["click"].append(batch.click.float().cpu().numpy())
            columns["conversion"].append(batch.conversion.float().cpu().numpy())
            columns["user_id"].append(batch.user_id.long().cpu().numpy())
            for key in TRUTH_FIELDS:
                value = getattr(batch, key, None)
                if value is not None:
                    columns[key].append(value.float().cpu().numpy())
    finally:
        model.train(was_training)
    if not columns["click"]:
        raise ValueError("the eval set has no examples; set data.eval_examples > 0")
    arrays = {key: np.concatenate(columns[key]) for key in EVAL_FIELDS}
    for key in TRUTH_FIELDS:
        if columns[key]:
            if len(columns[key]) != len(columns["click"]):
                raise ValueError(f"{key} is present in some eval batches and missing in others")
            arrays[key] = np.concatenate(columns[key])
    arrays["p_ctr"] = arrays["p_ctr"].astype(np.float32)
    arrays["p_cvr"] = arrays["p_cvr"].astype(np.float32)
    arrays["p_ctcvr"] = arrays["p_ctcvr"].astype(np.float32)
    return arrays
