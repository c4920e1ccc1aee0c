"""The on-disk checkpoint format: write, list, read and verify ``ckpt-<step>`` directories.

A checkpoint is a directory ``ckpt-<step>`` holding ``state.npz`` (every
variable of the saved objects) and ``manifest.json`` (step, extra state such
as epoch and data positions, versions, shapes, and the size and SHA-256 of
``state.npz``). It is written under a temporary name, fsynced and renamed, so
a checkpoint either exists whole or not at all. Reading checks everything before
trusting it: a damaged or hostile checkpoint is refused with a one-line reason
(reading never follows a symbolic link, blocks or unpickles). Nothing here
imports TensorFlow or talks to other ranks (that is :mod:`.manager`).

Example::

    path = write_checkpoint(Path("ckpt"), 100, {"w.0": np.zeros(3)}, {"extra": {}})
    manifest, arrays = read_checkpoint(path)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._version import __version__
from ..base.files import atomic_write, fsync_dir
from ..errors import CheckpointError

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d+)$")
STATE, MANIFEST = "state.npz", "manifest.json"
_MAX_MANIFEST = 64 << 20  # bytes; the manifest of a model with 100,000 variables has a few MB
_SLACK = 4096  # bytes of zip and npy headers allowed per array besides its data
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFDIR: "a directory"}
Objects = dict[str, list[list[Any]]]  #: variables of named objects, as manifests list them: name -> [[shape, dtype]]
ExtraCheck = Callable[[dict[str, Any]], "str | None"]  #: what is wrong with a manifest's ``extra``, or None
Loaded = tuple[dict[str, Any], dict[str, Any]]  #: a checkpoint's manifest and arrays


class ModelMismatch(CheckpointError):
    """A sound checkpoint of other variables than the ones to restore (the model changed)."""


class SaveFailed(CheckpointError):
    """A checkpoint that could not be written (a full disk, a quota); nothing of it is left, the older ones stand."""


def megabytes(size: int) -> str:
    """A size as a user reads it (kB, MB or GB).

    Example:
        >>> megabytes(3_250_000), megabytes(10_049), megabytes(7 << 30)
        ('3.2 MB', '10.0 kB', '7.5 GB')
    """
    unit, scale = next((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if size >= s or u == "kB")
    return f"{size / scale:.1f} {unit}"


def not_saved(what: str, where: Path, needed: int, exc: OSError, about: str = "") -> str:
    """The one line of a save that failed: which path, what it needed (``about``: "about " for an estimate)
    and what was free there.

    Example:
        >>> not_saved("checkpoint", Path("/nonexistent/ckpt-0000000048"), 3_100_000, OSError(28, "No space left"))
        'checkpoint /nonexistent/ckpt-0000000048 not saved (No space left): it needs 3.1 MB'
    """
    try:
        free = f", {megabytes(shutil.disk_usage(where.parent).free)} free there"
    except OSError:
        free = ""
    return f"{what} {where} not saved ({exc.strerror or exc}): it needs {about}{megabytes(needed)}{free}"


def versions() -> dict[str, str]:
    """Versions recorded in every manifest."""
    out = {"mldist": __version__, "python": sys.version.split()[0]}
    for name in ("tensorflow", "keras"):
        module = sys.modules.get(name)
        out[name] = str(getattr(module, "__version__", "not loaded"))
    return out


def write_checkpoint(directory: Path, step: int, arrays: dict[str, Any], manifest: dict[str, Any]) -> Path:
    """Write ``ckpt-<step>`` atomically: temp directory, fsync, rename, fsync the parent.

    Args:
        directory: the checkpoint directory (created if missing).
        step: the step number in the name.
        arrays: name -> numpy array, stored in ``state.npz``.
        manifest: JSON-able metadata; the file list with sizes and checksums is added.

    Raises :class:`SaveFailed` (one line: the path, the size it needs, the space free there) when it cannot
    be written; nothing of it is left then, and the checkpoints written before stand.
    """
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    state = buf.getvalue()
    files = {STATE: {"bytes": len(state), "sha256": hashlib.sha256(state).hexdigest()}}
    text = json.dumps({**manifest, "format": FORMAT, "step": step, "files": files}, indent=1, sort_keys=True)
    final = directory / f"ckpt-{step:010d}"
    tmp = directory / f".tmp-ckpt-{step:010d}-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        atomic_write(tmp / STATE, state)
        atomic_write(tmp / MANIFEST, text)
    except OSError as exc:  # a full disk: nothing half-written stays, the older checkpoints stand
        shutil.rmtree(tmp, ignore_errors=True)
        raise SaveFailed(not_saved("checkpoint", final, len(state) + len(text), exc)) from None
    if final.exists():  # the same step saved again (e.g. preempted right after a save)
        old = directory / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(final)
    fsync_dir(directory)
    return final


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the checkpoints in ``directory``, oldest first (unchecked)."""
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir())


def read_checkpoint(path: Path, model: Objects | None = None, check_extra: ExtraCheck | None = None) -> Loaded:
    """Read and verify checkpoint ``path`` (whose manifest must list the ``model`` objects, if given).

    Only regular files are opened (no symbolic link followed, FIFOs and devices refused unread), at most the
    declared bytes are read, npy headers are checked against their size, the manifest and ``model`` before
    arrays are allocated, and nothing is unpickled. Raises CheckpointError naming the file and the fault
    (:class:`ModelMismatch` if the checkpoint is sound but of another model).
    """
    where, name = path / MANIFEST, _NAME.match(path.name)
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be opened as a directory ({_why(exc, path)})") from None
    try:
        try:
            manifest = json.loads(_read_regular(dir_fd, MANIFEST, where, None, _MAX_MANIFEST))
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(f"{where} is unreadable or incomplete ({exc})") from None
        if not (problem := _manifest_problem(manifest, int(name.group(1)) if name else None)) and check_extra:
            problem = check_extra(manifest.setdefault("extra", {}))
        if problem:
            raise CheckpointError(f"{where}: {problem}")
        saved, _ = manifest.setdefault("objects", {}), manifest.setdefault("extra", {})
        for obj, specs in (model or {}).items():
            if saved.get(obj) != specs:
                what = f"other variables for {obj!r} than now" if obj in saved else f"no {obj!r}"
                raise ModelMismatch(f"{where} lists {what}; the model changed: use a new checkpoint directory")
        declared = {f"{obj}.{i}": (s[0], s[1]) for obj, specs in saved.items() for i, s in enumerate(specs)}
        size = manifest["files"][STATE]["bytes"]
        need = sum(math.prod(s) * _dtype(d).itemsize + 2 * len(n) + _SLACK for n, (s, d) in declared.items())
        if declared and size > need + _SLACK:
            raise CheckpointError(f"{where}: {STATE} of {size} bytes, its arrays need {need}")
        state = _read_regular(dir_fd, STATE, path / STATE, size, size)
    finally:
        os.close(dir_fd)
    if hashlib.sha256(state).hexdigest() != manifest["files"][STATE]["sha256"]:
        raise CheckpointError(f"{path / STATE} does not match its SHA-256 checksum (corrupted)")
    return manifest, _load_arrays(state, path / STATE, declared)


def latest_valid(directory: Path, model: Objects | None = None, check_extra: ExtraCheck | None = None) -> Loaded | None:
    """The newest checkpoint that passes :func:`read_checkpoint`, after a one-line warning for each newer one.

    Raises ModelMismatch if none passes and one is sound but of another model (starting afresh would mix runs).
    """
    mismatch: ModelMismatch | None = None
    for _step, path in reversed(checkpoints(directory)):
        try:
            return read_checkpoint(path, model, check_extra)
        except ModelMismatch as exc:
            mismatch = mismatch or exc
            _warn(f"skipping checkpoint that does not fit: {exc}")
        except CheckpointError as exc:
            _warn(f"skipping damaged checkpoint: {exc}")
    if mismatch is not None:
        raise mismatch
    return None


def _warn(message: str) -> None:
    warnings.warn(f"mldist: {message}".replace("\n", " "), stacklevel=3)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dtype(name: str) -> Any:
    """The numeric numpy dtype ``str(array.dtype)`` wrote as ``name`` (bfloat16 & co.: ml_dtypes'), or None."""
    import numpy as np

    found = getattr(sys.modules.get("ml_dtypes"), name, None) if name.isidentifier() else None
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        dtype = np.dtype(found if isinstance(found, type) else name)
        return dtype if dtype.name == name and dtype.kind in "biufcV" else None
    return None


def _is_spec(spec: object) -> bool:
    ok = isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], list) and all(map(_whole, spec[0]))
    return ok and isinstance(spec[1], str) and _dtype(spec[1]) is not None  # type: ignore[index]


def _manifest_problem(manifest: object, step: int | None) -> str | None:
    """What is wrong with a parsed manifest (types included), or None."""
    if not isinstance(manifest, dict):
        return f"holds a JSON {type(manifest).__name__}, not an object"
    m, entry, objects = manifest, manifest.get("files"), manifest.get("objects", {})
    entry = entry.get(STATE) if isinstance(entry, dict) else None
    sha, size = (entry.get("sha256"), entry.get("bytes")) if isinstance(entry, dict) else (None, None)
    entry_ok = _whole(size) and isinstance(sha, str) and re.fullmatch("[0-9a-f]{64}", sha)
    checks = {
        f"format {m.get('format')!r:.40}, expected {FORMAT}": m.get("format") == FORMAT and _whole(m["format"]),
        f"step {m.get('step')!r:.40} is not {step} as in its name": _whole(m.get("step")) and step in (None, m["step"]),
        f"files.{STATE} is {entry!r:.60}, not {{'bytes': N, 'sha256': HEX}}": entry_ok,
        f"extra is {m.get('extra')!r:.40}, not a JSON object": isinstance(m.get("extra", {}), dict),
        f"objects is {objects!r:.60}, not {{name: [[shape, dtype], ...]}}": isinstance(objects, dict)
        and all(isinstance(v, list) and all(map(_is_spec, v)) for v in objects.values()),
    }
    return next((problem for problem, ok in checks.items() if not ok), None)


def _why(exc: OSError, path: Path) -> str:  # O_NOFOLLOW | O_DIRECTORY on a link fails with ENOTDIR
    return "a symbolic link, never followed" if exc.errno == errno.ELOOP or path.is_symlink() else str(exc.strerror)


def _read_regular(dir_fd: int, name: str, where: Path, size: int | None, limit: int) -> bytes:
    """Regular file ``name``: exactly ``size`` bytes and at most ``limit``; anything else is refused unread."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise CheckpointError(f"{where} is unreadable ({_why(exc, where)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{where} is {_KINDS.get(stat.S_IFMT(info.st_mode), 'no regular file')}; refused")
        expected = min(info.st_size if size is None else size, limit)
        if info.st_size != expected:
            what = "is truncated:" if info.st_size < expected else "is too long:"
            raise CheckpointError(f"{where} {what} {info.st_size} of {expected} bytes")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(info.st_size)  # if it shrank meanwhile, its checksum or JSON fails
    finally:
        os.close(fd)


def _load_arrays(state: bytes, where: Path, declared: dict[str, tuple[list[int], str]]) -> dict[str, Any]:
    """The arrays of ``state.npz``, each header checked before its array is allocated."""
    try:
        with zipfile.ZipFile(io.BytesIO(state)) as archive:
            infos = archive.infolist()
            names = [info.filename.removesuffix(".npy") for info in infos]
            if len(set(names)) != len(names) or (declared and set(names) != set(declared)):
                missing = [f"no array {n!r} but " for n in sorted(set(declared) - set(names))[:1]]
                raise CheckpointError(f"has {''.join(missing)}{len(names)} arrays; its manifest lists {len(declared)}")
            room = len(state) - sum(i.file_size for i in infos)  # < 0: members overlap (a zip bomb)
            return {n: _read_member(archive, i, room, declared) for n, i in zip(names, infos, strict=True)}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError, NotImplementedError) as exc:
        raise CheckpointError(f"{where} is not a valid npz archive ({exc})") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{where} {exc}") from None


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, room: int, declared: dict[str, Any]) -> Any:
    """One array, its header checked against its size, declared shape and dtype before the data is read.

    np.save writes ml_dtypes' types (bfloat16, ...) as plain void of their size: viewed as the declared type.
    """
    from numpy.lib import format as fmt

    name, spec = info.filename.removesuffix(".npy"), declared.get(info.filename.removesuffix(".npy"))
    if not info.filename.endswith(".npy") or info.compress_type != zipfile.ZIP_STORED or room < 0:
        raise CheckpointError(f"holds {info.filename!r:.80}, not an uncompressed .npy array within the file")
    with archive.open(info) as member:
        read_header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(fmt.read_magic(member))
        if read_header is None:
            raise CheckpointError(f"holds array {name!r} in an unknown npy format version")
        shape, _, dtype = read_header(member)
        data, held = math.prod(shape) * dtype.itemsize, info.file_size - member.tell()
    if dtype.hasobject or data != held:
        raise CheckpointError(f"holds array {name!r} whose header announces {data} bytes of {dtype}, not {held}")
    want = _dtype(spec[1]) if spec else None
    void = want is not None and dtype.kind == want.kind == "V" and dtype.itemsize == want.itemsize
    if spec and (list(shape) != spec[0] or (dtype != want and not void)):
        raise CheckpointError(f"holds array {name!r} as {dtype} {shape}, its manifest says {spec[1]} {tuple(spec[0])}")
    with archive.open(info) as member:
        array = fmt.read_array(member, allow_pickle=False)
    return array.view(want) if void else array
