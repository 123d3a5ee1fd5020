"""Where the code of a study came from: its git commit, or the best substitute when there is no checkout."""
from __future__ import annotations

import hashlib
import os
import subprocess
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

    ``source`` says where the commit came from: "git" (the checkout holding mxlab, with ``dirty``
    telling uncommitted changes), "MXLAB_GIT_COMMIT" (the environment variable naming the commit of
    a copy shipped without .git), or "package" (neither exists: ``commit`` is then
    "mxlab-VERSION+sha256:HASH" from the installed version and :func:`package_hash`). Never None.
    """
    checkout = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            status = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10)
            return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    shipped = os.environ.get("MXLAB_GIT_COMMIT")
    if shipped:
        return {"commit": shipped, "dirty": None, "source": "MXLAB_GIT_COMMIT"}
    from importlib import metadata

    try:
        version = metadata.version("mxlab")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"commit": f"mxlab-{version}+sha256:{package_hash()}", "dirty": None, "source": "package"}
