"""Where a study's code and runs came from: the code's git commit (or the best substitute when there is no
checkout), the device a run trained on and the environment a study ran in."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def package_hash(root: Path | None = None) -> str:
    """sha256 (first 16 hex digits) over the relative paths and bytes of every .py file of the mxlab package."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def code_commit() -> dict[str, Any]:
    """The code's identity: {commit, dirty, source}.

    ``source`` says where the commit came from: "MXLAB_GIT_COMMIT" (the environment variable, when set:
    it names the commit of a copy whose .git is absent or not its own, and wins over git), "git" (the
    checkout holding mxlab, with ``dirty`` telling uncommitted changes), or "package" (neither: ``commit``
    is then "mxlab-VERSION+sha256:HASH" from the installed version and :func:`package_hash`). Never None.
    """
    shipped = os.environ.get("MXLAB_GIT_COMMIT")
    if shipped:
        return {"commit": shipped, "dirty": None, "source": "MXLAB_GIT_COMMIT"}
    checkout = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode == 0:
            status = subprocess.run(
                ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib import metadata

    try:
        version = metadata.version("mxlab")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"commit": f"mxlab-{version}+sha256:{package_hash()}", "dirty": None, "source": "package"}


def device_name(device: str) -> str:
    """The product name of `device` ('cuda:N' as CUDA reports it, 'cpu' as /proc/cpuinfo or platform does)."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def trained_with(device: str) -> dict[str, Any]:
    """What a run records of the code and machine that trained it: {"code": code_commit(), "device": device_name}."""
    return {"code": code_commit(), "device": device_name(device)}


def environment_info(devices: Sequence[str]) -> dict[str, Any]:
    """Device names, library versions (torch, triton, numpy, mxlab, python) and the git commit of mxlab."""
    from importlib import metadata

    import torch

    import mxlab

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    names = [device_name(d) for d in devices]
    return {
        "devices": list(devices),
        "device_names": names,
        "device": names[0] if names else None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "numpy": version("numpy"),
        "mxlab": mxlab.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": code_commit(),
    }
