"""One run over several processes: DDP over NCCL on GPUs, gloo on CPUs (`mxlab run --nproc-per-node N`).

Ranks that share a GPU (more processes than GPUs, e.g. a check on one GPU) reduce over gloo.

Every rank reads the same global batch order and trains on its shard (mxlab.experiment.distributed);
rank 0 writes the run folder, so a checkpoint written at one world size resumes at another.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mxlab.experiment.distributed import World
from mxlab.experiment.train import RunJob, RunResult, run_is_done, train_run
from mxlab.experiment.worker import FileProgress, make_data_source, read_result
from mxlab.worker_server import preload_worker_modules


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_device(devices: Sequence[str], rank: int) -> str:
    """The device of `rank`: GPUs in turn ('cuda:0', 'cuda:1', ...), or 'cpu'."""
    cuda = [device for device in devices if device.startswith("cuda")]
    if not cuda:
        return "cpu"
    if cuda == ["cuda"]:
        return f"cuda:{rank % max(1, torch.cuda.device_count())}"
    return cuda[rank % len(cuda)]


def backend_for(devices: Sequence[str], world_size: int) -> str:
    """'nccl' when every rank has a GPU of its own, else 'gloo' (CPUs, or ranks sharing a GPU, which NCCL refuses)."""
    ranks = [rank_device(devices, rank) for rank in range(world_size)]
    on_gpu = all(device.startswith("cuda") for device in ranks)
    return "nccl" if on_gpu and len(set(ranks)) == world_size else "gloo"


def _rank_main(rank: int, job: RunJob, world_size: int, port: int, devices: Sequence[str]) -> None:
    import torch.distributed as dist

    device = rank_device(devices, rank)
    backend = backend_for(devices, world_size)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        progress = FileProgress(job.run_dir) if rank == 0 else None
        train_run(job, make_data_source(job.spec), device, world=World(rank, world_size), progress=progress)
    finally:
        dist.destroy_process_group()


def train_data_parallel(job: RunJob, nproc: int, devices: Sequence[str], *, progress: Any = None) -> RunResult:
    """Train `job` over `nproc` spawned processes on `devices`; return its record (a done run is read back).

    Refuses (RuntimeError with the first rank's error) when a rank fails.
    """
    if run_is_done(job.run_dir):
        return read_result(job.run_dir)
    import torch.multiprocessing as mp

    on_gpu = any(device.startswith("cuda") for device in devices)
    if not on_gpu:
        preload_worker_modules()

    Path(job.run_dir).mkdir(parents=True, exist_ok=True)
    context = mp.start_processes(
        _rank_main,
        args=(job, nproc, free_port(), list(devices)),
        nprocs=nproc,
        join=False,
        start_method="spawn" if on_gpu else "forkserver",
    )
    try:
        while not context.join(timeout=0.25):
            if progress is not None:
                progress.poll(job.label, job.run_dir)
    except Exception as error:
        raise RuntimeError(
            f"{job.label} over {nproc} processes failed: {str(error).strip().splitlines()[-1]}"
        ) from error
    return read_result(job.run_dir)
