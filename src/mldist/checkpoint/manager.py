"""The distributed checkpoint manager: rank 0 writes and reads, every rank gets the state.

:class:`CheckpointManager` saves the variables of named objects (models, optimizers,
modules) in the format of :mod:`.format` on rank 0 and keeps the newest ``keep``.
On restore rank 0 picks the newest checkpoint that passes its checks and fits the
variables (a damaged one is named in a one-line warning and skipped) and broadcasts
it to the other ranks. With ``copies`` (an elastic world's commits, :class:`mldist.keras.Elastic`)
the first worker of every host keeps a copy there too (in memory: ``/dev/shm``), and on
restore the lowest rank that holds the newest checkpoint of all is the one that reads it.

Example::

    mgr = mldist.CheckpointManager("ckpt", keep=3)
    step = mgr.restore(model=model, optimizer=optimizer)   # 0 when there is none
    for step in range(step + 1, 1001):
        train_step()
        if step % 100 == 0:
            mgr.save(step, model=model, optimizer=optimizer)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .. import runtime
from ..errors import CheckpointError
from ..runtime import allgather, broadcast
from . import commits
from .format import ExtraCheck, _dtype, _warn, checkpoints, latest_valid, versions, write_checkpoint


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


def _dtype_name(dtype: Any) -> str:
    """The name of a TensorFlow, Keras (a string) or numpy dtype: "float32"."""
    return str(getattr(dtype, "name", dtype))


class CheckpointManager:
    """Save and restore training state; rank 0 writes and reads, every rank gets the state.

    Args:
        directory: where ``ckpt-<step>`` directories go (only rank 0 needs it).
        keep: how many of the newest checkpoints to keep (older ones are deleted).
        check_extra: on restore, what is wrong with a candidate's ``extra`` (None: nothing); a
            checkpoint with a fault is skipped as damaged.
        copies: a folder on every host where its first worker keeps a copy of each checkpoint too,
            or None (only rank 0's ``directory``).

    Example::

        mgr = mldist.CheckpointManager("ckpt", keep=3)
        start = mgr.restore(model=model, optimizer=opt)
        mgr.save(step, model=model, optimizer=opt)
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int = 3,
        check_extra: ExtraCheck | None = None,
        copies: Path | None = None,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep}: keep at least 1 checkpoint")
        self.directory = Path(directory)
        self.keep = keep
        self.check_extra = check_extra
        self.copies = copies
        #: Where the checkpoint last restored was read: "disk", a host's name, or "" (none).
        self.restored_from = ""
        #: The ``extra`` dict of the checkpoint last restored (empty if none).
        self.restored_extra: dict[str, Any] = {}

    def save(self, step: int, *, extra: dict[str, Any] | None = None, **objects: Any) -> Path | None:
        """Save ``objects`` as checkpoint ``step`` (rank 0 writes; other ranks return None).

        Args:
            step: the step number (names the checkpoint; restore returns it).
            extra: JSON-able state to keep with it (epoch, data positions, ...).
            objects: name -> model, optimizer, module or variables.

        Raises :class:`~mldist.checkpoint.format.SaveFailed` on the rank that could not write it (a full
        disk): one line naming the path, the size it needs and the space free there; the older checkpoints
        stand and nothing of this one is left.
        """
        ctx = runtime.init()
        places = [self.directory] if ctx.is_chief else []
        if self.copies is not None and ctx.local_rank == 0:
            places.append(self.copies)
        if not places:
            return None
        arrays: dict[str, Any] = {}
        shapes: dict[str, list[list[Any]]] = {}
        for name, obj in objects.items():
            values = [v.numpy() for v in variables_of(obj)]
            shapes[name] = [[list(a.shape), str(a.dtype)] for a in values]
            arrays.update({f"{name}.{i}": a for i, a in enumerate(values)})
        manifest = {"extra": extra or {}, "objects": shapes, "size": ctx.size, "versions": versions()}
        disk = None
        for place in places:
            if place == self.copies:
                commits.own_folder(place)
            path = write_checkpoint(place, step, arrays, manifest)
            disk = path if place == self.directory else disk
            for _old_step, old in checkpoints(place)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return disk

    def restore(self, **objects: Any) -> int:
        """Load the newest valid checkpoint into ``objects`` on every rank; its step, or 0 if none.

        Args:
            objects: the same names as given to :meth:`save`.
        """
        import numpy as np  # mldist without extras (no numpy) imports this module

        ctx = runtime.init()
        variables = {name: variables_of(obj) for name, obj in objects.items()}
        model = {n: [[[*map(int, v.shape)], _dtype_name(v.dtype)] for v in vs] for n, vs in variables.items()}
        header, arrays, where = self._newest(ctx.is_chief, model)
        root = 0
        if self.copies is not None and ctx.size > 1:  # the lowest rank that holds the newest checkpoint reads it
            step = json.loads(header)["step"] if header and "step" in header else -1
            steps = [int(s) for s in np.asarray(allgather(np.array([step], np.int64))).ravel()]
            root = commits.newest([(s, None) for s in steps]) or 0
        if ctx.size > 1:
            header = _broadcast_text(header, root)
            where = _broadcast_text(where, root)
        if not header:
            self.restored_extra, self.restored_from = {}, ""
            return 0
        info = json.loads(header)
        if "error" in info:
            raise CheckpointError(info["error"])
        flat = [v for name in variables for v in variables[name]]
        if ctx.rank == root:
            values = [arrays[f"{name}.{i}"] for name in variables for i in range(len(variables[name]))]
        else:
            values = [np.zeros(tuple(v.shape), _dtype(_dtype_name(v.dtype))) for v in flat]
        if ctx.size > 1 and flat:
            values = [np.asarray(t) for t in broadcast(values, root=root)]
        for var, value in zip(flat, values, strict=True):
            var.assign(value)
        self.restored_extra, self.restored_from = info["extra"], where
        return int(info["step"])

    def _newest(self, chief: bool, model: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        """(header, arrays, where) of the newest valid checkpoint this rank can read: its host's copy,
        rank 0 also the disk; header "" for none, or the JSON of an error every rank raises."""
        places = [(self.copies, commits.host_name(os.environ))] if self.copies is not None else []
        places += [(self.directory, "disk")] if chief else []
        best: tuple[str, dict[str, Any], str] = ("", {}, "")
        step = -1
        for place, where in places:
            try:
                found = latest_valid(place, model, self.check_extra)
            except CheckpointError as exc:
                if place == self.directory:  # every rank raises it, none waits forever
                    return json.dumps({"error": str(exc)}), {}, where
                continue  # a host's copy of another model: the disk decides
            if found is not None and int(found[0]["step"]) > step:
                step = int(found[0]["step"])
                best = (json.dumps({"step": step, "extra": found[0]["extra"]}), found[1], where)
            elif found is None and place == self.directory and checkpoints(place) and step < 0:
                _warn(f"no usable checkpoint in {place}; starting from step 0")
        return best


def _broadcast_text(text: str, root: int = 0) -> str:
    """``root``'s ``text`` on every rank (length first, then the bytes as int32)."""
    import numpy as np

    data = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)
    n = int(broadcast(np.array(len(data), np.int64), root=root))
    mine = data if runtime.rank() == root else np.zeros(n, np.int32)
    if n == 0:
        return ""
    got = np.asarray(broadcast(mine, root=root))
    return bytes(got.astype(np.uint8).tolist()).decode()
