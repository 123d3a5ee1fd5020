"""The data-parallel group one run trains in: which rank this process is, its shard of a batch, DDP.

A run over N processes (mxlab.experiment.ddp, or torchrun) reads the same global batch order
on every rank; each rank trains on its contiguous shard of each batch. Each rank's loss is
weighted by its share of the batch, so DDP's averaged gradient equals the gradient of the global
batch's mean loss; gradients are reduced in float32 (the master weights' dtype). Rank 0 writes
the run folder. One process is `World()` (rank 0 of 1), which changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class World:
    """This process's place in the group of one run: rank (0 writes the run folder) of size processes."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} of world size {self.size}: need 0 <= rank < size and size >= 1")

    @property
    def writes(self) -> bool:
        """Whether this process writes the run folder (rank 0)."""
        return self.rank == 0

    def shard(self, batch: Any) -> tuple[Any, float]:
        """(this rank's contiguous rows of `batch`, the weight of its loss: rows here x size / rows in all).

        One process gets the batch itself and weight 1.0.
        """
        if self.size == 1:
            return batch, 1.0
        rows = batch.batch_size
        start, stop = rows * self.rank // self.size, rows * (self.rank + 1) // self.size
        return batch.slice(start, stop), (stop - start) * self.size / rows

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the forward pass goes through: `model` itself, or DDP around it in a group."""
        if self.size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=None, broadcast_buffers=False)

    def mean_on_device(self, values: torch.Tensor, weight: float) -> torch.Tensor:
        """The global-batch means of this rank's per-shard means `values` (a device tensor), summed over
        the ranks with weight `weight / size`; `values` itself in one process. No host read."""
        if self.size == 1:
            return values
        import torch.distributed as dist

        reduced = values.to(torch.float64) * (weight / self.size)
        dist.all_reduce(reduced)
        return reduced.to(values.dtype)
