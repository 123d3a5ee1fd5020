"""The fork server that starts local CPU worker processes, with torch and mxlab's training modules imported once.

Kept free of torch and of mxlab.experiment (whose imports take seconds) so that `mxlab run` can start the
server first thing (`start_worker_server`): it imports in its own process while the driver imports, checks
the spec and prepares the study, instead of after it.
"""

from __future__ import annotations

import multiprocessing

# What a run imports on its way (the optimizer alone pulls in torch._dynamo, seconds of imports); a
# name that does not exist is skipped by the fork server.
PRELOAD = (
    "torch._dynamo",
    "triton",
    "mxlab.experiment.worker",
    "mxlab.models",
    "mxlab.recipe",
    "mxlab.data",
    "mxlab.nn",
    "mxlab.scaling",
    "mxlab.diagnostics",
    "mxlab.te_backend",
    "mxlab.metrics",
)


def preload_worker_modules() -> None:
    """Have the fork server that starts worker processes import torch and mxlab's training modules once."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))


def start_worker_server() -> None:
    """Start the fork server now (it preloads `PRELOAD` in the background); the first worker would start it
    otherwise. Nothing else changes: the workers it forks are the same."""
    from multiprocessing import forkserver

    preload_worker_modules()
    forkserver.ensure_running()
