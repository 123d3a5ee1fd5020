"""CUDA MPS for a study whose runs share a GPU: the control daemon started for the study, stopped after.

Without MPS a GPU time-slices between processes, so several runs on one GPU (`runs_per_device`)
mostly take turns; with the MPS daemon running, their kernels run side by side (docs/running.md
gives the measured gain). Worker processes find the daemon through CUDA_MPS_PIPE_DIRECTORY, which
`mps_daemon` sets in this process's environment before any worker is spawned.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from unittest import mock

CONTROL = "nvidia-cuda-mps-control"
TIMEOUT_S = 30


def running_daemon() -> Path | None:
    """The pipe folder of an MPS daemon this process already points at (CUDA_MPS_PIPE_DIRECTORY holding a
    `control` pipe), else None."""
    folder = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if folder and (Path(folder) / "control").exists():
        return Path(folder)
    return None


def check_mps_devices(devices: Sequence[str], executor: str) -> None:
    """Refuses (ValueError) MPS without a CUDA device or with the Ray executor (its workers are not this
    process's children, so they would not find the daemon)."""
    if executor == "ray" or not any(device.startswith("cuda") for device in devices):
        raise ValueError(
            f"--mps needs CUDA devices and the local executor; got devices {list(devices)}, executor {executor!r}"
        )


@contextlib.contextmanager
def mps_daemon(enabled: bool) -> Iterator[str]:
    """Yield 'off' (not enabled), 'running' (a daemon this process already points at: used, left running)
    or 'started' (a daemon started here, in a fresh pipe folder, and told to quit on exit, the
    environment restored). Refuses (ValueError) when `nvidia-cuda-mps-control` is not on PATH, and
    raises RuntimeError, with the daemon's words, when it does not start."""
    if not enabled:
        yield "off"
        return
    if running_daemon() is not None:
        yield "running"
        return
    control = shutil.which(CONTROL)
    if control is None:
        raise ValueError(
            f"mps = true needs {CONTROL} (the CUDA driver's MPS control daemon) on PATH; none was found. "
            "Run without --mps, or install the driver's MPS tools"
        )
    root = Path(tempfile.mkdtemp(prefix="mxlab-mps-"))
    env_values = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for folder in env_values.values():
        Path(folder).mkdir()
    try:
        with mock.patch.dict(os.environ, env_values):  # workers inherit it; restored on exit
            started = subprocess.run([control, "-d"], capture_output=True, text=True, timeout=TIMEOUT_S)
            if started.returncode != 0:
                raise RuntimeError(
                    f"{CONTROL} -d exited with {started.returncode}: {(started.stderr or started.stdout).strip()}"
                )
            try:
                yield "started"
            finally:
                subprocess.run([control], input="quit\n", capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        shutil.rmtree(root, ignore_errors=True)
