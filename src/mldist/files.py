"""Durable file writes: temp file, fsync, rename, fsync the directory.

The one place mldist writes files that must exist whole or not at all: job
scripts and records, checkpoints, the final Keras model. A crash at any point
leaves either the old file or the new one, never a torn mix.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write(d / "a.txt", "hello\\n").read_text()
    'hello\\n'
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new entry in directory ``path`` durable.

    Example:
        >>> fsync_dir(".")
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """A hidden sibling of ``path`` private to this process, for writing before the rename.

    Example:
        >>> temp_name(Path("/d/job.json")).name.startswith(".job.json.")
        True
    """
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: str | os.PathLike[str], data: str | bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically and durably; the final path.

    Args:
        path: destination; its parent directory is created if missing.
        data: text (UTF-8) or bytes.
        mode: permission bits of the new file (default: 0o666 less the umask).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    return atomic_write_with(final, lambda fh: fh.write(raw), mode)


def atomic_write_with(path: Path, write: Callable[..., object], mode: int | None = None) -> Path:
    """Like :func:`atomic_write`, but ``write(fh)`` fills the binary file handle itself.

    Args:
        path: destination (its parent must exist).
        write: called with the open temporary file.
        mode: permission bits of the new file (default: 0o666 less the umask).
    """
    tmp = temp_name(path)
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def replace_durably(tmp: Path, final: Path) -> None:
    """Rename a finished file or directory ``tmp`` over ``final`` and make it durable.

    Args:
        tmp: written and fsynced already.
        final: its name from now on (same directory).
    """
    if tmp.is_file():
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, final)
    fsync_dir(final.parent)
