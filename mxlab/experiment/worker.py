"""A runner worker bound to one device: reads job-file paths on stdin, trains each, answers one line per job.

Started by mxlab.experiment.runner for parallel runs (one per GPU); not a user command.
Answers `mxlab-worker: ok PATH` or `mxlab-worker: error MESSAGE` on stdout; everything else goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

import torch

ANSWER_TAG = "mxlab-worker:"


def main(argv: list[str] | None = None) -> int:
    """Serve jobs until stdin closes; returns the process exit code (0)."""
    from mxlab.experiment.runner import make_data_source
    from mxlab.experiment.train import train_run

    parser = argparse.ArgumentParser(prog="python -m mxlab.experiment.worker")
    parser.add_argument("--device", required=True)
    args = parser.parse_args(argv)
    # Answers go to the original stdout; everything else that writes to stdout (libraries, C code)
    # lands in stderr, the worker's log, so it cannot be mistaken for an answer.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if args.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(args.device))
    sources: dict[str, Any] = {}
    for line in sys.stdin:
        job_path = line.strip()
        if not job_path:
            continue
        try:
            job = torch.load(job_path, weights_only=False)
            key = json.dumps([job.spec.data, job.spec.model], sort_keys=True, default=str)
            if key not in sources:
                sources.clear()
                sources[key] = make_data_source(job.spec)
            print(f"[{args.device}] {job.label}", file=sys.stderr, flush=True)
            train_run(job, sources[key], args.device)
            answer = f"ok {job_path}"
        except Exception as error:  # reported to the runner, which goes on with the other jobs
            traceback.print_exc(file=sys.stderr)
            message = " ".join(f"{type(error).__name__}: {error}".split())
            answer = f"error {message}"
        print(f"{ANSWER_TAG} {answer}", file=protocol, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
