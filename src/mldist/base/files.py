"""Durable file writes: temp file, fsync, rename, fsync the directory.

The one place mldist writes files that must exist whole or not at all: job
scripts and records, checkpoints, the final Keras model. A crash at any point
leaves either the old file or the new one, never a torn mix.

Permissions are given at creation and the umask applies on top: a mode only
ever narrows what the umask allows, never widens it (no ``chmod`` afterwards).

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write(d / "a.txt", "hello\\n").read_text()
    'hello\\n'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError


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


def make_dirs(path: str | os.PathLike[str], mode: int = 0o777) -> Path:
    """Create directory ``path`` and its missing parents, each with ``mode`` less the umask; ``path``.

    Unlike ``Path.mkdir(parents=True, mode=...)``, the parents get ``mode`` too. Existing
    directories are left as they are.

    Example:
        >>> import tempfile, stat
        >>> d = make_dirs(Path(tempfile.mkdtemp()) / "a" / "b", 0o700)
        >>> stat.S_IMODE(d.parent.stat().st_mode) & 0o077
        0
    """
    final = Path(path)
    missing = [p for p in (final, *final.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode)
        except FileExistsError:  # made meanwhile by someone else
            if not directory.is_dir():
                raise
    return final


def current_umask() -> int:
    """This process's umask (read without changing it where Linux tells, else set and restored).

    Example:
        >>> 0 <= current_umask() <= 0o777
        True
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def atomic_write(
    path: str | os.PathLike[str], data: str | bytes, mode: int | None = None, dir_mode: int = 0o777
) -> Path:
    """Write ``data`` to ``path`` atomically and durably; the final path.

    Args:
        path: destination; its missing parent directories are created (``dir_mode`` less the umask).
        data: text (UTF-8) or bytes.
        mode: permission bits of the new file, less the umask (default 0o666).
        dir_mode: permission bits of the parent directories it creates, less the umask.
    """
    final = Path(path)
    make_dirs(final.parent, dir_mode)
    raw = data.encode() if isinstance(data, str) else data
    return atomic_write_with(final, lambda fh: fh.write(raw), mode)


def atomic_write_with(path: Path, write: Callable[..., object], mode: int | None = None) -> Path:
    """Like :func:`atomic_write`, but ``write(fh)`` fills the binary file handle itself.

    Args:
        path: destination (its parent must exist).
        write: called with the open temporary file.
        mode: permission bits of the new file, less the umask (default 0o666).

    A write that fails (``OSError``: a full disk, ``ENOSPC``) raises after removing the temporary
    file; ``path`` is then as it was.
    """
    tmp = temp_name(path)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crashed process with our pid: it may have other permissions
    # O_EXCL: a new file of ours (never a planted file or symlink), created with the mode less the umask.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else mode)
    try:
        with open(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a quota, an interrupt: no half-written temporary file stays behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
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


#: How many ``-N`` suffixes :func:`new_directory` tries before it gives up.
MAX_SUFFIX = 1000


def new_directory(base: str | os.PathLike[str], mode: int = 0o777, create: bool = True) -> Path:
    """A directory that did not exist: ``base``, else ``base-2``, ``base-3``, ...; created with ``mode``.

    ``os.mkdir`` without ``exist_ok`` claims each name atomically, so two processes asking for
    the same ``base`` at the same moment get different directories. Missing parents are made
    with ``mode`` too (less the umask).

    Args:
        base: the preferred path.
        mode: permission bits of the new directory, less the umask.
        create: False only looks for the first free name (a preview; nothing is created).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> [new_directory(d / "job").name for _ in range(3)]
        ['job', 'job-2', 'job-3']
    """
    first = Path(base)
    if create:
        make_dirs(first.parent, mode)
    for n in range(1, MAX_SUFFIX + 1):
        path = first if n == 1 else first.with_name(f"{first.name}-{n}")
        if not create:
            if not os.path.lexists(path):
                return path
            continue
        try:
            path.mkdir(mode)
        except FileExistsError:
            continue
        return path
    raise ConfigError(f"{first} and {MAX_SUFFIX - 1} suffixed names are taken; remove old ones or choose another name")
