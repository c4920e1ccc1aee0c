"""Checkpoints that survive preemption: atomic, checksummed, rank 0 writes, rank 0 reads.

A checkpoint is a directory ``ckpt-<step>`` holding ``state.npz`` (every
variable of the saved objects) and ``manifest.json`` (step, extra state such
as epoch and data positions, versions, shapes, and the size and SHA-256 of
``state.npz``). It is written under a temporary name, fsynced and renamed, so
a checkpoint either exists whole or not at all. On restore rank 0 picks the
newest checkpoint that passes its checks (a damaged one is named in a warning
and skipped) and broadcasts it, so other nodes need not see the directory.

Example::

    mgr = mldist.CheckpointManager("ckpt", keep=3)
    step = mgr.restore(model=model, optimizer=optimizer)   # 0 when there is none
    for step in range(step + 1, 1001):
        train_step()
        if step % 100 == 0:
            mgr.save(step, model=model, optimizer=optimizer)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from . import runtime
from .errors import CheckpointError
from .files import atomic_write, fsync_dir
from .runtime import broadcast

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d+)$")
STATE, MANIFEST = "state.npz", "manifest.json"


def variables_of(obj: Any) -> list[Any]:
    """The variables to save for ``obj``: a tf.Variable, a list of them, or anything with ``.variables``.

    Args:
        obj: a Keras model, optimizer or layer, a ``tf.Module``, a variable or a list of variables.
    """
    if hasattr(obj, "assign") and hasattr(obj, "dtype"):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [v for o in obj for v in variables_of(o)]
    if hasattr(obj, "variables"):
        found = obj.variables
        return list(found() if callable(found) else found)
    raise CheckpointError(f"cannot checkpoint {type(obj).__name__}: pass a model, optimizer, module or variables")


def versions() -> dict[str, str]:
    """Versions recorded in every manifest."""
    from . import __version__

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
    """
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    state = buf.getvalue()
    manifest = {
        **manifest,
        "format": FORMAT,
        "step": step,
        "files": {STATE: {"bytes": len(state), "sha256": hashlib.sha256(state).hexdigest()}},
    }
    final = directory / f"ckpt-{step:010d}"
    tmp = directory / f".tmp-ckpt-{step:010d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    atomic_write(tmp / STATE, state)
    atomic_write(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
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
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(found)


def read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and verify one checkpoint: ``(manifest, arrays)``.

    Raises:
        CheckpointError: naming the damaged file, when anything is missing,
            truncated or does not match its checksum.
    """
    import numpy as np

    try:
        manifest = json.loads((path / MANIFEST).read_text())
        expected = manifest["files"][STATE]
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{path / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path / MANIFEST} is unreadable or incomplete ({exc})") from None
    try:
        state = (path / STATE).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path / STATE} is unreadable ({exc.strerror})") from None
    if len(state) != expected["bytes"]:
        raise CheckpointError(f"{path / STATE} is truncated: {len(state)} of {expected['bytes']} bytes")
    if hashlib.sha256(state).hexdigest() != expected["sha256"]:
        raise CheckpointError(f"{path / STATE} does not match its SHA-256 checksum (corrupted)")
    with np.load(io.BytesIO(state)) as npz:
        arrays = {k: npz[k] for k in npz.files}
    return manifest, arrays


def latest_valid(directory: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The newest checkpoint that passes :func:`read_checkpoint`; warns about each damaged newer one."""
    for _step, path in reversed(checkpoints(directory)):
        try:
            return read_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"mldist: skipping damaged checkpoint: {exc}", stacklevel=2)
    return None


class CheckpointManager:
    """Save and restore training state; rank 0 writes and reads, every rank gets the state.

    Args:
        directory: where ``ckpt-<step>`` directories go (only rank 0 needs it).
        keep: how many of the newest checkpoints to keep (older ones are deleted).

    Example::

        mgr = mldist.CheckpointManager("ckpt", keep=3)
        start = mgr.restore(model=model, optimizer=opt)
        mgr.save(step, model=model, optimizer=opt)
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep}: keep at least 1 checkpoint")
        self.directory = Path(directory)
        self.keep = keep
        #: The ``extra`` dict of the checkpoint last restored (empty if none).
        self.restored_extra: dict[str, Any] = {}

    def save(self, step: int, *, extra: dict[str, Any] | None = None, **objects: Any) -> Path | None:
        """Save ``objects`` as checkpoint ``step`` (rank 0 writes; other ranks return None).

        Args:
            step: the step number (names the checkpoint; restore returns it).
            extra: JSON-able state to keep with it (epoch, data positions, ...).
            objects: name -> model, optimizer, module or variables.
        """
        ctx = runtime.init()
        if not ctx.is_chief:
            return None
        arrays: dict[str, Any] = {}
        shapes: dict[str, list[list[Any]]] = {}
        for name, obj in objects.items():
            values = [v.numpy() for v in variables_of(obj)]
            shapes[name] = [[list(a.shape), str(a.dtype)] for a in values]
            arrays.update({f"{name}.{i}": a for i, a in enumerate(values)})
        manifest = {"extra": extra or {}, "objects": shapes, "size": ctx.size, "versions": versions()}
        path = write_checkpoint(self.directory, step, arrays, manifest)
        for _old_step, old in checkpoints(self.directory)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def restore(self, **objects: Any) -> int:
        """Load the newest valid checkpoint into ``objects`` on every rank; its step, or 0 if none.

        Args:
            objects: the same names as given to :meth:`save`.
        """
        import numpy as np
        import tensorflow as tf

        ctx = runtime.init()
        variables = {name: variables_of(obj) for name, obj in objects.items()}
        found = latest_valid(self.directory) if ctx.is_chief else None
        header = ""
        if found is not None:
            manifest, arrays = found
            try:
                _check_shapes(manifest, arrays, variables)
                header = json.dumps({"step": manifest["step"], "extra": manifest.get("extra", {})})
            except CheckpointError as exc:
                header = json.dumps({"error": str(exc)})  # every rank raises it, none waits forever
        if ctx.size > 1:
            header = _broadcast_text(header)
        if not header:
            self.restored_extra = {}
            return 0
        info = json.loads(header)
        if "error" in info:
            raise CheckpointError(info["error"])
        flat = [v for name in variables for v in variables[name]]
        if ctx.is_chief:
            values = [arrays[f"{name}.{i}"] for name in variables for i in range(len(variables[name]))]
        else:
            values = [np.zeros(tuple(v.shape), tf.as_dtype(v.dtype).as_numpy_dtype) for v in flat]
        if ctx.size > 1 and flat:
            values = [t.numpy() for t in broadcast([tf.constant(a) for a in values], root=0)]
        for var, value in zip(flat, values, strict=True):
            var.assign(value)
        self.restored_extra = info["extra"]
        return int(info["step"])


def _check_shapes(manifest: dict[str, Any], arrays: dict[str, Any], variables: dict[str, list[Any]]) -> None:
    for name, vs in variables.items():
        saved = manifest.get("objects", {}).get(name)
        if saved is None:
            raise CheckpointError(f"checkpoint step {manifest['step']} has no {name!r}; it has {list(arrays)[:3]}...")
        now = [list(v.shape) for v in vs]
        if [s for s, _ in saved] != now:
            raise CheckpointError(
                f"checkpoint step {manifest['step']}: {name!r} has {len(saved)} variables of other shapes than now "
                f"({len(now)}); the model changed: use a new checkpoint directory"
            )


def _broadcast_text(text: str) -> str:
    """Rank 0's ``text`` on every rank (length first, then the bytes as int32)."""
    import numpy as np
    import tensorflow as tf

    data = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)
    n = int(broadcast(tf.constant(len(data), tf.int64), root=0))
    mine = data if runtime.is_chief() else np.zeros(n, np.int32)
    if n == 0:
        return ""
    got = broadcast(tf.constant(mine), root=0).numpy()
    return bytes(got.astype(np.uint8).tolist()).decode()
