"""Evaluation: predictions and labels of a trained model on the eval set, in the source's fixed order."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mxlab import metrics

EVAL_FIELDS = ("click", "conversion", "p_ctr", "p_cvr", "p_ctcvr", "user_id")
TRUTH_FIELDS = ("true_ctr", "true_cvr")


def _numpy(tensor: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    return tensor.detach().to(dtype).cpu().numpy()


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module, source: Any, batch_size: int, device: torch.device | str, limit: int = 0
) -> dict[str, np.ndarray]:
    """Run `model` over `source.eval_batches(batch_size)` (with `limit` > 0, only the first whole
    batches that hold at least `limit` examples); return eval.npz's arrays.

    Keys: click, conversion, p_ctr, p_cvr, p_ctcvr (float32), user_id (int64), true_ctr, true_cvr when
    the source has ground truth, and tasks (["ctr"]) when it has no conversion labels
    (mxlab.metrics.eval_tasks). p_ctcvr = p_ctr * p_cvr. The model is left in
    train mode afterwards. Refuses an eval set with no examples.
    """
    was_training = model.training
    model.eval()
    columns: dict[str, list[Any]] = {key: [] for key in EVAL_FIELDS + TRUTH_FIELDS}
    try:
        seen = 0
        for host_batch in source.eval_batches(batch_size):
            if limit and seen >= limit:
                break
            seen += int(host_batch.click.shape[0])
            output = model(host_batch.to(device))
            # predictions stay on the device until the end (one read, no sync per batch); labels
            # come from the batch as the source made it
            columns["p_ctr"].append(output.ctr_logit.detach().float())
            columns["p_cvr"].append(output.cvr_logit.detach().float())
            columns["click"].append(_numpy(host_batch.click, torch.float32))
            columns["conversion"].append(_numpy(host_batch.conversion, torch.float32))
            columns["user_id"].append(_numpy(host_batch.user_id, torch.int64))
            for key in TRUTH_FIELDS:
                value = getattr(host_batch, key, None)
                if value is not None:
                    columns[key].append(_numpy(value, torch.float32))
    finally:
        model.train(was_training)
    if columns["p_ctr"]:
        logits = torch.stack([torch.cat(columns["p_ctr"]), torch.cat(columns["p_cvr"])])
        probabilities = torch.sigmoid(logits)
        p_ctr, p_cvr = probabilities.cpu().numpy()
        columns["p_ctr"], columns["p_cvr"] = [p_ctr], [p_cvr]
        columns["p_ctcvr"] = [(probabilities[0] * probabilities[1]).cpu().numpy()]
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
    tasks = source_tasks(source)
    if tasks != metrics.TASKS:
        arrays[metrics.EVAL_TASKS_KEY] = np.array(tasks)
    return arrays


def source_tasks(source: Any) -> tuple[str, ...]:
    """The tasks `source` labels (mxlab.metrics.tasks_of its info.has_conversion)."""
    return metrics.tasks_of(getattr(source.info, "has_conversion", True))


def held_out_metrics(
    model: torch.nn.Module, source: Any, batch_size: int, device: torch.device | str, limit: int = 0
) -> dict[str, float | None]:
    """NE and AUC of CTR and CTCVR (CTR alone for a source without conversions) on the first `limit` eval
    examples (0 = all; see `evaluate_model`): {"ctr.ne", "ctr.auc", "ctcvr.ne", "ctcvr.auc", "examples"};
    a metric the slice cannot give (one class only) is None."""
    arrays = evaluate_model(model, source, min(batch_size, limit) if limit else batch_size, device, limit)
    labels = {"ctr": arrays["click"], "ctcvr": arrays["click"] * arrays["conversion"]}
    labels = {task: label for task, label in labels.items() if task in source_tasks(source)}
    record: dict[str, float | None] = {"examples": float(len(arrays["click"]))}
    for task, label in labels.items():
        both = 0 < float(label.sum()) < len(label)
        record[f"{task}.ne"] = metrics.normalized_entropy(label, arrays[f"p_{task}"]) if both else None
        record[f"{task}.auc"] = metrics.auc(label, arrays[f"p_{task}"]) if both else None
    return record
