"""Evaluation: predictions and labels of a trained model on the eval set, in the source's fixed order."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mxlab import metrics
from mxlab.models import head_label, head_logits
from mxlab.tasks import ESMM_HEADS, TaskSet

EVAL_FIELDS = ("click", "conversion", "p_ctr", "p_cvr", "p_ctcvr", "user_id")
TRUTH_FIELDS = ("true_ctr", "true_cvr")


def _numpy(tensor: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    return tensor.detach().to(dtype).cpu().numpy()


def _outputs(model: torch.nn.Module, source: Any, batch_size: int, device: torch.device | str, limit: int) -> Any:
    """Yield (host batch, model output) over `source.eval_batches(batch_size)`, stopping after the first whole
    batches that hold at least `limit` examples (0: all); the model is in eval mode meanwhile, then as it was."""
    was_training = model.training
    model.eval()
    try:
        seen = 0
        for host_batch in source.eval_batches(batch_size):
            if limit and seen >= limit:
                break
            seen += int(host_batch.click.shape[0])
            yield host_batch, model(host_batch.to(device))
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module,
    source: Any,
    batch_size: int,
    device: torch.device | str,
    limit: int = 0,
    tasks: TaskSet | None = None,
) -> dict[str, np.ndarray]:
    """Run `model` over `source.eval_batches(batch_size)` (with `limit` > 0, only the first whole
    batches that hold at least `limit` examples); return eval.npz's arrays.

    Keys: click, conversion, p_ctr, p_cvr, p_ctcvr (float32), user_id (int64), true_ctr, true_cvr when
    the source has ground truth, and tasks (["ctr"]) when it has no conversion labels
    (mxlab.metrics.eval_tasks). p_ctcvr = p_ctr * p_cvr. Independent `tasks` (mxlab.tasks) give instead
    per head H label_H and p_H, user_id and tasks (the heads). The model is left in
    train mode afterwards. Refuses an eval set with no examples.
    """
    if tasks is not None and tasks.relation != "esmm":
        return _evaluate_heads(model, source, batch_size, device, limit, tasks.heads)
    columns: dict[str, list[Any]] = {key: [] for key in EVAL_FIELDS + TRUTH_FIELDS}
    for host_batch, raw in _outputs(model, source, batch_size, device, limit):
        output = head_logits(raw, ESMM_HEADS)
        # predictions stay on the device until the end (one read, no sync per batch); labels
        # come from the batch as the source made it
        columns["p_ctr"].append(output["ctr"].detach().float())
        columns["p_cvr"].append(output["cvr"].detach().float())
        columns["click"].append(_numpy(host_batch.click, torch.float32))
        columns["conversion"].append(_numpy(host_batch.conversion, torch.float32))
        columns["user_id"].append(_numpy(host_batch.user_id, torch.int64))
        for key in TRUTH_FIELDS:
            value = getattr(host_batch, key, None)
            if value is not None:
                columns[key].append(_numpy(value, torch.float32))
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
    labelled = source_tasks(source)
    if labelled != metrics.TASKS:
        arrays[metrics.EVAL_TASKS_KEY] = np.array(labelled)
    return arrays


def _evaluate_heads(
    model: torch.nn.Module, source: Any, batch_size: int, device: torch.device | str, limit: int, heads: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """eval.npz's arrays of independent heads: label_H, p_H (float32) per head, user_id, tasks. Predictions stay
    on the device until the end (one read, no sync per batch)."""
    logits: dict[str, list[torch.Tensor]] = {head: [] for head in heads}
    labels: dict[str, list[np.ndarray]] = {head: [] for head in heads}
    users: list[np.ndarray] = []
    for host_batch, raw in _outputs(model, source, batch_size, device, limit):
        output = head_logits(raw, heads)
        for head in heads:
            logits[head].append(output[head].detach().float())
            labels[head].append(_numpy(torch.as_tensor(head_label(host_batch, head)), torch.float32))
        users.append(_numpy(host_batch.user_id, torch.int64))
    if not users:
        raise ValueError("the eval set has no examples; set data.eval_examples > 0")
    probabilities = torch.sigmoid(torch.stack([torch.cat(logits[head]) for head in heads])).cpu().numpy()
    arrays = {f"p_{head}": probabilities[i].astype(np.float32) for i, head in enumerate(heads)}
    arrays |= {f"{metrics.LABEL_PREFIX}{head}": np.concatenate(labels[head]) for head in heads}
    arrays["user_id"] = np.concatenate(users)
    arrays[metrics.EVAL_TASKS_KEY] = np.array(heads)
    return arrays


def source_tasks(source: Any, tasks: TaskSet | None = None) -> tuple[str, ...]:
    """The tasks evaluated on `source`: under ESMM those it labels (mxlab.metrics.tasks_of its
    info.has_conversion), else the independent heads of `tasks`."""
    if tasks is not None and tasks.relation != "esmm":
        return tasks.heads
    return metrics.tasks_of(source.info.has_conversion)


def held_out_metrics(
    model: torch.nn.Module,
    source: Any,
    batch_size: int,
    device: torch.device | str,
    limit: int = 0,
    tasks: TaskSet | None = None,
) -> dict[str, float | None]:
    """NE and AUC of CTR and CTCVR (CTR alone for a source without conversions; each head of independent `tasks`)
    on the first `limit` eval examples (0 = all; see `evaluate_model`): {"ctr.ne", "ctr.auc", "ctcvr.ne",
    "ctcvr.auc", "examples"}; a metric the slice cannot give (one class only) is None."""
    arrays = evaluate_model(model, source, min(batch_size, limit) if limit else batch_size, device, limit, tasks)
    return {"examples": float(len(arrays["user_id"])), **judged_metrics(arrays)}


def judged_metrics(arrays: dict[str, np.ndarray]) -> dict[str, float | None]:
    """{"TASK.ne", "TASK.auc"} of eval.npz's `arrays` for each task of `gate_labels`; None where the labels
    hold one class only."""
    record: dict[str, float | None] = {}
    for task, label in gate_labels(arrays).items():
        both = 0 < float(label.sum()) < len(label)
        record[f"{task}.ne"] = metrics.normalized_entropy(label, arrays[f"p_{task}"]) if both else None
        record[f"{task}.auc"] = metrics.auc(label, arrays[f"p_{task}"]) if both else None
    return record


def gate_labels(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The labels of the tasks that held-out metrics and the warm-up gate judge: CTR and CTCVR of the ESMM tasks
    the arrays label (mxlab.metrics.eval_tasks), or every independent task."""
    independent = metrics.independent_tasks(arrays)
    if independent:
        return {task: arrays[f"{metrics.LABEL_PREFIX}{task}"] for task in independent}
    labels = {"ctr": arrays["click"], "ctcvr": arrays["click"] * arrays["conversion"]}
    return {task: label for task, label in labels.items() if task in metrics.eval_tasks(arrays)}
