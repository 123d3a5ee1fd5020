"""Atomic file writes for run folders: write to a temporary name in the same folder, then os.replace.

A reader (or a resumed run) therefore sees either the previous complete file or the new one.
Written files get the mode the user's umask gives (as open() would), not the 0600 of a temporary file.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(path: Path, write: Callable[[Path], None]) -> None:
    """Atomically replace `path` by what `write(temporary)` writes to a temporary path beside it (for writers
    that take a file name, such as a figure's savefig); the temporary is removed if `write` raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        error.filename, error.filename2 = str(path), None  # the file being written, not a temporary name
        raise
    os.close(handle)
    try:
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets what open() would give
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.filename in (None, temporary):
            error.filename, error.filename2 = str(path), None  # name the file being written, not its temporary
        raise


def _atomic_write_bytes(path: Path, payload: bytes) -> None:
    def write(temporary: Path) -> None:
        with open(temporary, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())

    write_file(path, write)


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {value!r}")


def to_json(value: Any, *, indent: int | None = 2) -> str:
    """JSON text for `value`; non-finite floats are written as NaN / Infinity, which Python's json reads back."""
    return json.dumps(value, indent=indent, default=_json_default)


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically."""
    _atomic_write_bytes(path, text.encode())


def write_json(path: Path, value: Any) -> None:
    """Write `value` as indented JSON to `path` atomically."""
    write_text(path, to_json(value) + "\n")


def write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write one JSON object per line to `path` atomically (the whole file is replaced)."""
    write_text(path, "".join(to_json(dict(record), indent=None) + "\n" for record in records))


def read_json(path: Path) -> Any:
    """The JSON value in `path`. Refuses (ValueError) text that is not JSON, naming the file, line and column."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: {_json_error(error)}; restore it or delete it") from None


def _json_error(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON at line {error.lineno}, column {error.colno} ({error.msg})"
    return f"not valid UTF-8 text ({error})"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file ([] when it does not exist). Refuses (ValueError) a line that is not
    JSON, naming the file and the line."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
    return records


def write_npz(path: Path, arrays: Mapping[str, np.ndarray], *, compressed: bool = False) -> None:
    """Write arrays to an .npz at `path` atomically (deflated with `compressed`; the arrays read back the same)."""
    buffer = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(buffer, **{key: np.asarray(value) for key, value in arrays.items()})
    _atomic_write_bytes(path, buffer.getvalue())


def write_torch(path: Path, value: Any) -> None:
    """torch.save `value` to `path` atomically."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    _atomic_write_bytes(path, buffer.getvalue())
