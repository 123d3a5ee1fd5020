"""`torchrun --nproc-per-node N -m mxlab.experiment.ddp SPEC [--out DIR] [--set K=V ...] [--resume]`.

Trains every run of a study, one after another, each over all the processes torchrun started
(DDP: NCCL on GPUs, gloo with `--device cpu`). Rank 0 writes the study folder; render the
report afterwards with `mxlab report DIR`. `mxlab run SPEC --nproc-per-node N` does the same
without torchrun on one node.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    """Run the study's runs data-parallel in this torchrun group; returns the exit code (2 on bad input)."""
    import torch.distributed as dist

    from mxlab.experiment.distributed import World
    from mxlab.experiment.runner import check_out_dir, write_study_json
    from mxlab.experiment.spec import load_spec
    from mxlab.experiment.study_jobs import study_jobs
    from mxlab.experiment.train import run_is_done, train_run
    from mxlab.experiment.worker import make_data_source

    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m mxlab.experiment.ddp")
    parser.add_argument("spec", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print(
            "error: start this module with torchrun (it reads RANK and WORLD_SIZE), "
            "or use `mxlab run SPEC --nproc-per-node N`",
            file=sys.stderr,
        )
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = f"cuda:{local_rank}" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    world = World(dist.get_rank(), dist.get_world_size())
    try:
        problem: list[str | None] = [None]
        try:  # every rank loads the spec; rank 0 checks and writes the study folder, and tells the others
            spec = load_spec(args.spec, args.overrides)
            out_dir = args.out or Path("reports") / spec.name
            if world.writes:
                check_out_dir(spec, out_dir, args.resume)
                out_dir.mkdir(parents=True, exist_ok=True)
                command = " ".join(
                    ["torchrun", f"--nproc-per-node {world.size}", "-m mxlab.experiment.ddp", *sys.argv[1:]]
                )
                write_study_json(
                    spec,
                    out_dir,
                    [device],
                    command,
                    {**spec.to_dict()["execution"], "executor": "torchrun", "nproc_per_node": world.size},
                )
        except ValueError as error:
            problem = [str(error)]
        dist.broadcast_object_list(problem, src=0)
        if problem[0] is not None:
            if world.writes:
                print(f"error: {problem[0]}", file=sys.stderr)
            return 2
        source = make_data_source(spec)
        for job in study_jobs(spec, out_dir / "runs"):
            done = run_is_done(job.run_dir)
            dist.barrier()  # every rank decides on the same files
            if not done:
                train_run(job, source, device, world=world)
                if world.writes:
                    print(f"{job.label}: done", flush=True)
        if world.writes:
            print(f"runs in {out_dir / 'runs'}; render the report with: mxlab report {out_dir}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
