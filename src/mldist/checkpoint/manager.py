"""The distributed checkpoint manager: rank 0 writes and reads, every rank gets the state.

:class:`CheckpointManager` saves the variables of named objects (models, optimizers,
modules) in the format of :mod:`.format` on rank 0 and keeps the newest ``keep``.
On restore rank 0 picks the newest checkpoint that passes its checks and fits the
variables (a damaged one is named in a one-line warning and skipped) and broadcasts
it to the other ranks.

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
from ..runtime import broadcast
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

    Example::

        mgr = mldist.CheckpointManager("ckpt", keep=3)
        start = mgr.restore(model=model, optimizer=opt)
        mgr.save(step, model=model, optimizer=opt)
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, check_extra: ExtraCheck | None = None) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep}: keep at least 1 checkpoint")
        self.directory = Path(directory)
        self.keep = keep
        self.check_extra = check_extra
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

        ctx = runtime.init()
        variables = {name: variables_of(obj) for name, obj in objects.items()}
        header, arrays = "", {}
        if ctx.is_chief:
            model = {n: [[[*map(int, v.shape)], _dtype_name(v.dtype)] for v in vs] for n, vs in variables.items()}
            try:
                found = latest_valid(self.directory, model, self.check_extra)
            except CheckpointError as exc:
                found, header = None, json.dumps({"error": str(exc)})  # every rank raises it, none waits forever
            if found is not None:
                header, arrays = json.dumps({"step": found[0]["step"], "extra": found[0]["extra"]}), found[1]
            elif not header and checkpoints(self.directory):
                _warn(f"no usable checkpoint in {self.directory}; starting from step 0")
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
            values = [np.zeros(tuple(v.shape), _dtype(_dtype_name(v.dtype))) for v in flat]
        if ctx.size > 1 and flat:
            values = [np.asarray(t) for t in broadcast(values, root=0)]
        for var, value in zip(flat, values, strict=True):
            var.assign(value)
        self.restored_extra = info["extra"]
        return int(info["step"])


def _broadcast_text(text: str) -> str:
    """Rank 0's ``text`` on every rank (length first, then the bytes as int32)."""
    import numpy as np

    data = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)
    n = int(broadcast(np.array(len(data), np.int64), root=0))
    mine = data if runtime.is_chief() else np.zeros(n, np.int32)
    if n == 0:
        return ""
    got = np.asarray(broadcast(mine, root=0))
    return bytes(got.astype(np.uint8).tolist()).decode()
