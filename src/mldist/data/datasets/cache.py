"""The cache's checksums: hashing, the per-folder record of checked files, and each dataset's state.

A file reaches the cache only after its SHA-256 matched, and ``sha256.json`` in its folder
records that hash with the file's size and mtime: ``mldist data list`` then knows a file is
unchanged since its check without reading it again (``--verify`` reads it anyway).

Example:
    >>> import tempfile
    >>> [c.status for c in cached(Path(tempfile.mkdtemp()))]
    ['absent', 'absent', 'absent']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...base.files import atomic_write
from ...errors import ConfigError
from .table import DATASETS, MANIFEST, SHA256, Dataset


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of the file at ``path``.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "f"; _ = p.write_bytes(b"")
        >>> sha256_of(p)[:12]
        'e3b0c44298fc'
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_sha256(path: Path) -> str | None:
    """The SHA-256 recorded when ``path`` was fetched, if the file is unchanged since (size, mtime).

    Example:
        >>> recorded_sha256(Path("/nonexistent/mnist.npz")) is None
        True
    """
    entry = _manifest(path.parent).get(path.name)
    try:
        st = path.stat()
    except OSError:
        return None
    if isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
        return str(entry.get("sha256"))
    return None


def record_sha256(path: Path, sha: str) -> None:
    """Note in the folder's record that ``path`` (as it is now: size, mtime) has SHA-256 ``sha``."""
    data = _manifest(path.parent)
    st = path.stat()
    data[path.name] = {"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    atomic_write(path.parent / MANIFEST, json.dumps(data, indent=1, sort_keys=True) + "\n")


def expected_hashes(ds: Dataset, pins: Sequence[str] = ()) -> dict[str, str]:
    """Each file's SHA-256: the table's, overridden by ``pins`` (``HASH`` for a one-file dataset, or ``FILE=HASH``).

    Example:
        >>> expected_hashes(DATASETS["mnist"], ["ab" * 32])["mnist.npz"][:4]
        'abab'
    """
    hashes = dict(ds.files)
    for pin in pins:
        file, _, value = pin.rpartition("=")
        if not file:
            if len(hashes) > 1:
                raise ConfigError(f"{ds.name} has {len(hashes)} files: pin each as --sha256 FILE=HASH")
            file = next(iter(hashes))
        if file not in hashes:
            raise ConfigError(f"--sha256 {pin!r}: {ds.name} has no file {file!r}; its files: {', '.join(hashes)}")
        if not SHA256.fullmatch(value.lower()):
            raise ConfigError(f"--sha256 {value!r} is not a SHA-256 (64 hexadecimal digits)")
        hashes[file] = value.lower()
    return hashes


#: A dataset's states from worst to best; it shows the worst of its files'.
STATES = ("absent", "incomplete", "partial", "damaged", "unverified", "pinned", "verified")


@dataclass(frozen=True)
class Cached:
    """What the cache holds of one dataset (a row of ``mldist data list``).

    Args:
        name: the dataset.
        folder: its folder in the cache.
        present: how many of its ``total`` files are in the cache.
        total: how many files it has.
        size: bytes of the present files.
        status: "verified"; "pinned" (checked against a ``--sha256`` other than the table's);
            "unverified" (changed since its check, or copied in by hand); "damaged" (``--verify``
            found another checksum); "partial" (a download to resume); "incomplete"; "absent".
    """

    name: str
    folder: str
    present: int
    total: int
    size: int
    status: str


def _file_state(path: Path, table_sha: str, verify: bool) -> str:
    if not path.is_file():
        return "partial" if path.with_name(path.name + ".part").is_file() else "absent"
    recorded = recorded_sha256(path)
    if not verify:
        return "unverified" if recorded is None else "verified" if recorded == table_sha else "pinned"
    actual = sha256_of(path)
    if actual == table_sha:
        return "verified"
    return "pinned" if actual == _manifest(path.parent).get(path.name, {}).get("sha256") else "damaged"


def status(ds: Dataset, root: Path, verify: bool = False) -> Cached:
    """The state of dataset ``ds`` in cache ``root``; ``verify`` hashes every file again.

    Example:
        >>> status(DATASETS["mnist"], Path("/nonexistent")).status
        'absent'
    """
    folder = root / ds.name
    states = [_file_state(folder / f, sha, verify) for f, sha in ds.files]
    present = [folder / f for f, _ in ds.files if (folder / f).is_file()]
    worst = min(states, key=STATES.index)
    if worst == "absent" and present:
        worst = "incomplete"
    elif worst == "absent" and "partial" in states:
        worst = "partial"
    size = sum(p.stat().st_size for p in present)
    return Cached(ds.name, str(folder), len(present), len(ds.files), size, worst)


def cached(root: Path, verify: bool = False) -> list[Cached]:
    """The state of every dataset of the table in cache ``root``, in table order."""
    return [status(ds, root, verify) for ds in DATASETS.values()]
