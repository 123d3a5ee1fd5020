"""Run checkpoints that hold tensors and plain data only, loaded with `torch.load(weights_only=True)`.

A study folder on a shared filesystem is not a way in: a checkpoint that carries any pickled
object (a class instance, a function) is refused on load instead of running its code. What a
checkpoint holds beyond tensors (RNG states, counters, data positions) is stored as tensors,
numbers, strings, lists and dicts.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mxlab import io

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"  # the checkpoint before the last: where a run resumes when the last is unreadable


def rng_state() -> dict[str, Any]:
    """Every RNG state of this process (torch, CUDA if in use, numpy, Python) as tensors and plain data."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {
            "version": int(version),
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the RNG states saved by `rng_state`."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["kind"],
            saved["keys"].numpy().astype(np.uint32),
            saved["position"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    python = state["python"]
    random.setstate(
        (python["version"], tuple(int(value) for value in python["internal"].tolist()), python["gauss_next"])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` (tensors, numbers, strings, lists, dicts) to `path` atomically; the checkpoint it replaces
    is kept beside it as checkpoint.prev.pt (the last two are kept)."""
    path = Path(path)
    if path.is_file():
        os.replace(path, path.with_name(PREVIOUS))
    io.write_torch(path, state)


def load_resume_checkpoint(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(checkpoint, note) to resume a run from: RUN/checkpoint.pt, else checkpoint.prev.pt when the last one
    cannot be read, else None (the run restarts from step 0); `note` says which when one was unreadable
    (printed to stderr too), None otherwise. Refuses (ValueError) a checkpoint that holds pickled objects."""
    unreadable = []
    for name in (CHECKPOINT, PREVIOUS):
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        try:
            checkpoint = load_checkpoint(path)
            if not isinstance(checkpoint, dict) or "step" not in checkpoint:
                raise ValueError("it is not a run checkpoint")
        except (RuntimeError, EOFError, OSError, KeyError) as error:
            unreadable.append(f"{path} ({type(error).__name__})")
            continue
        except ValueError as error:
            if "refusing to load" in str(error):
                raise
            unreadable.append(f"{path} ({error})")
            continue
        if not unreadable:
            return checkpoint, None
        note = f"{'; '.join(unreadable)} unreadable: resumed from {path} (step {int(checkpoint['step'])})"
        print(f"mxlab: {note}", file=sys.stderr)
        return checkpoint, note
    if not unreadable:
        return None, None
    note = f"{'; '.join(unreadable)} unreadable and no earlier checkpoint: the run restarted from step 0"
    print(f"mxlab: {note}", file=sys.stderr)
    return None, note


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at `path`, read with weights_only=True (on the CPU).

    Refuses (ValueError naming the file) a checkpoint that holds anything but tensors and plain
    data: loading it would run pickled code.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"refusing to load {path}: it holds objects other than tensors and plain data ({first}); "
            f"checkpoints are read with torch.load(weights_only=True). Delete it to restart that run from step 0"
        ) from None


def start_from_fork(fork_dir: Path, model: torch.nn.Module, optimizer: Any = None) -> tuple[int, int, int]:
    """Load the fork warm-up's final model weights (and, given `optimizer`, its optimizer state) from
    `fork_dir/checkpoint.pt`; return its data position (step, epoch, batches consumed in that epoch).

    The loss scaler, RNG and stochastic-rounding counters are not taken: the continuing run starts
    them as its recipe does. Refuses (ValueError naming the folder) a warm-up without a checkpoint,
    and weights that do not fit the model.
    """
    path, checkpoint = _fork_checkpoint(fork_dir)
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as error:
        raise ValueError(f"the fork warm-up's weights in {path} do not fit this arm's model: {error}") from None
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return int(checkpoint["step"]), int(checkpoint["epoch"]), int(checkpoint["batches_in_epoch"])


def fork_data_position(fork_dir: Path) -> tuple[int, int]:
    """The fork warm-up's final data position: (epoch, batches taken in it), from `fork_dir/checkpoint.pt`.
    Refuses (ValueError naming the folder) a warm-up without a checkpoint."""
    _, checkpoint = _fork_checkpoint(fork_dir)
    return int(checkpoint["epoch"]), int(checkpoint["batches_in_epoch"])


def _fork_checkpoint(fork_dir: Path) -> tuple[Path, dict]:
    path = Path(fork_dir) / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"the fork warm-up {fork_dir} has no {CHECKPOINT}; it must finish before its arms start")
    return path, load_checkpoint(path)
