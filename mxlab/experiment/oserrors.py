"""Operating-system errors as one line: the path, what went wrong, and what to do.

A full disk stops a study at its first failure (no more runs start: each would fail the same way);
finished runs keep their files, and `--resume` goes on once there is space.
"""

from __future__ import annotations

import errno

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", f"[Errno {errno.ENOSPC}]")

_ADVICE = {
    errno.ENOSPC: "the disk is full: free space (or choose another --out) and continue with --resume; "
    "finished runs are kept",
    errno.EDQUOT: "the disk quota is used up: free space (or choose another --out) and continue with --resume; "
    "finished runs are kept",
    errno.EROFS: "the file system is read-only: choose a writable --out",
    errno.EACCES: "permission denied: make the folder writable for you, or choose another --out",
    errno.EPERM: "operation not permitted: make the folder writable for you, or choose another --out",
    errno.ENOENT: "no such file or folder: check the path (a missing parent folder is not created for input files)",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "it is a folder, not a file: check the path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) and continue with --resume",
    errno.EIO: "an input/output error from the disk: check the device, then continue with --resume",
}


class StudyStopped(OSError):
    """The study stopped starting runs after an operating-system failure (the message says which and why)."""


def os_error_line(error: OSError) -> str:
    """One line for `error`: "PATH: what happened (what to do)"; refuses nothing."""
    if isinstance(error, StudyStopped) or (error.errno is None and not error.filename):
        return str(error.strerror or error)
    what = error.strerror or type(error).__name__
    advice = _ADVICE.get(error.errno or -1)
    where = f"{error.filename}: " if error.filename else ""
    target = f" -> {error.filename2}" if error.filename2 else ""
    return f"{where}{what}{target}" + (f"; {advice}" if advice else "")


def is_disk_full(reason: str | BaseException | None) -> bool:
    """Whether a failure (an exception, or a run's recorded reason) is a full disk or a used-up quota."""
    if isinstance(reason, OSError):
        return reason.errno in DISK_FULL
    return reason is not None and any(text in str(reason) for text in _DISK_FULL_TEXT)


def stopped(label: str, reason: str, not_started: int) -> StudyStopped:
    """The error that ends a study after run `label` failed on a full disk (`not_started` runs left)."""
    message = (
        f"the disk is full: {label} failed ({reason}); {not_started} runs were not started. "
        f"Free space (or choose another --out) and continue with --resume; finished runs are kept"
    )
    return StudyStopped(errno.ENOSPC, message)
