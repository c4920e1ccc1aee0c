"""``mldist.keras.Checkpoint``: resume ``fit`` where it stopped, and save on preemption.

Example::

    model.fit(ds, epochs=20, callbacks=[*mldist.keras.default_callbacks(),
                                       mldist.keras.Checkpoint("ckpt", save_freq="epoch", keep=3)])
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import keras

from .. import data, preempt, runtime
from ..base.files import replace_durably
from ..checkpoint import CheckpointManager, SaveFailed
from ..checkpoint.format import checkpoints, not_saved
from ..checkpoint.manager import variables_of
from ..errors import ConfigError
from ..runtime import allreduce, compat
from ..runtime.watch.leave import leave

#: Exit code (EX_IOERR) of a training that ended with its last state on no disk: every save since some step
#: failed (a full disk), and so did the final model. A rerun resumes from the newest checkpoint on disk.
UNSAVED_CODE = 74


def _say(message: str) -> None:
    if runtime.is_chief():
        print(f"mldist: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """Keras without the multi-process distribution inside the block: for work one rank does alone.

    On ``KERAS_BACKEND=jax`` every variable Keras creates under ``mldist.init()``'s distribution
    is a collective of all processes, and ``model.save`` creates some (a fresh optimizer), so a
    save on rank 0 alone would wait for the others forever. On TensorFlow it changes nothing.

    Example::

        if mldist.is_chief():
            with mldist.keras.single_process():
                model.save("final.keras")
    """
    previous = keras.distribution.distribution()
    if previous is None:
        yield
        return
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def _whole(value: object, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _extra_problem(extra: dict[str, Any]) -> str | None:
    """What is wrong with a checkpoint's ``extra`` for :class:`Checkpoint`, or None (a fault skips it as damaged).

    Example:
        >>> _extra_problem({"epoch": "2"})
        "extra.epoch is '2', not a usable value"
    """
    positions, stream = extra.get("positions", []), extra.get("train_stream", -1)
    exact = _whole(stream)  # then the exact-resume fields are used
    position, steps, size = extra.get("train_position"), extra.get("steps_per_epoch"), extra.get("size")
    checks = {
        "epoch": _whole(extra.get("epoch")),
        "positions": isinstance(positions, list) and all(map(_whole, positions)),
        "train_stream": _whole(stream, -1),
        "train_position": _whole(position) or (position is None and not exact),
        "steps_per_epoch": _whole(steps, 1) or (steps is None and not exact),
        "size": size is None or _whole(size, 1),
    }
    bad = [key for key, ok in checks.items() if not ok]
    return f"extra.{bad[0]} is {extra.get(bad[0])!r:.40}, not a usable value" if bad else None


class Checkpoint(keras.callbacks.Callback):  # type: ignore[misc]
    """Save weights, optimizer state, epoch, step and data position; resume from the newest valid one.

    Only rank 0 writes (atomically, with a manifest and checksums, keeping the
    last ``keep``); on start rank 0 reads the newest valid checkpoint and every
    rank gets it. ``fit`` then continues from the interrupted epoch; when the
    input comes from ``mldist.data.shard``/``shard_files`` it continues from the
    exact batch (the data stream skips the batches already trained on, and the
    run stops after the same total number of steps as an uninterrupted one).

    On SIGTERM or SIGUSR1 the workers agree (every ``check_every`` steps and at
    each epoch end), save, and exit with code 75 so that ``mldist run``, Slurm
    ``--requeue`` or mldist's PBS/Cobalt scripts start them again. At the end
    of training rank 0 also writes the whole model to ``directory/final_model``.

    Resuming with a different number of workers restores weights, optimizer
    state and epoch; the interrupted epoch then starts over with the new sharding.

    Args:
        directory: checkpoint directory (rank 0's; other ranks need not see it).
        save_freq: ``"epoch"``, or save every N steps.
        keep: how many checkpoints to keep.
        final_model: file name of the ``.keras`` model saved at the end (None: none).
        check_every: steps between preemption checks (one tiny all-reduce each).

    Example::

        cb = mldist.keras.Checkpoint("ckpt", save_freq=500, keep=3)
        model.fit(ds, epochs=10, callbacks=[*mldist.keras.default_callbacks(), cb])
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        save_freq: str | int = "epoch",
        keep: int = 3,
        *,
        final_model: str | None = "model.keras",
        check_every: int = 10,
    ) -> None:
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq >= 1):
            raise ConfigError(f"save_freq={save_freq!r}: use 'epoch' or a number of steps >= 1")
        if check_every < 1:
            raise ConfigError(f"check_every={check_every} must be at least 1")
        if final_model is not None and not final_model.endswith(".keras"):
            raise ConfigError(f"final_model={final_model!r} must end in .keras")
        self.manager = CheckpointManager(directory, keep=keep, check_extra=_extra_problem)
        self.save_freq = save_freq
        self.final_model = final_model
        self.check_every = check_every
        #: Step of the checkpoint restored at the start of training (0: none).
        self.restored_step = 0
        self._handlers: dict[int, Any] = {}
        self._step = self._saved_at = -1
        self._epoch = self._start = self._since = 0
        self._remaining: int | None = None
        self._train: data.Stream | None = None
        self._marks: list[int] = []
        #: The step of the first save that failed since the last one that worked (None: the last one worked).
        self._unsaved: int | None = None

    # -- state --------------------------------------------------------------------------------

    def _objects(self) -> dict[str, Any]:
        optimizer = getattr(self.model, "optimizer", None)
        return {"model": self.model, **({"optimizer": optimizer} if optimizer is not None else {})}

    def _extra(self) -> dict[str, Any]:
        train = self._train
        return {
            "epoch": self._epoch,
            "train_stream": data.STREAMS.index(train) if train in data.STREAMS else -1,
            "train_position": self._start + self._since if train is not None else None,
            "steps_per_epoch": train.steps if train is not None else None,
            "positions": [int(s.position.numpy()) for s in data.STREAMS],
            "size": runtime.size(),
        }

    def _save(self) -> None:
        if self._saved_at == self._step:
            return
        try:
            path = self.manager.save(self._step, extra=self._extra(), **self._objects())
        except SaveFailed as exc:  # a full disk: training goes on, and the next save tries again
            self._saved_at, self._unsaved = self._step, self._unsaved or self._step
            print(
                f"mldist: {exc}; {self._newest()}; training goes on and the next save tries again",
                file=sys.stderr,
                flush=True,
            )
            return
        self._saved_at, self._unsaved = self._step, None
        if path is not None:
            _say(f"saved checkpoint {path}")

    def _newest(self) -> str:
        """Where a rerun would resume: the newest checkpoint on this rank's disk (read, not verified)."""
        found = checkpoints(self.manager.directory)
        return f"the newest on disk is {found[-1][1]}" if found else "no checkpoint is on disk yet"

    def _restore(self) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)  # its variables must exist to be loaded
        step = self.restored_step = self._step = self.manager.restore(**self._objects())
        if not step:
            return
        extra = self.manager.restored_extra
        epoch = int(extra["epoch"])
        positions = extra.get("positions", [])
        if len(positions) == len(data.STREAMS):
            for stream, position in zip(data.STREAMS, positions, strict=True):
                stream.position.assign(position)
        index, steps = int(extra.get("train_stream", -1)), extra.get("steps_per_epoch")
        if 0 <= index < len(data.STREAMS):
            stream = data.STREAMS[index]
            if extra.get("size") == runtime.size() and steps == stream.steps:
                # Exact resume: the stream continues at the next batch, and fit runs the
                # steps an uninterrupted run still had (Keras itself counts whole epochs).
                stream.position.assign(int(extra["train_position"]))
                epoch = step // steps
                if self.params.get("epochs"):
                    self._remaining = int(self.params["epochs"]) * steps - step
                _say(f"resuming from checkpoint step {step}: epoch {epoch}, batch {step % steps}")
            else:
                stream.position.assign(epoch * stream.steps)
                _say(
                    f"resuming from checkpoint step {step} written by {extra.get('size')} workers: epoch "
                    f"{epoch} starts over with this run's {runtime.size()} workers"
                )
        else:
            _say(f"resuming from checkpoint step {step} at the start of epoch {epoch}")
        self._epoch = epoch
        # The mechanism Keras's own BackupAndRestore uses: fit starts at this epoch.
        compat.set_initial_epoch(self.model, epoch)

    # -- callbacks ----------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._step = self._saved_at = -1
        self._epoch = self._start = self._since = 0
        self._remaining = None
        self._train = None
        self._marks = []
        self._restore()
        self._saved_at = self._step
        self._handlers = preempt.install()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._marks = [int(s.position.numpy()) for s in data.STREAMS]
        self._since = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._since == 0:
            self._find_train_stream()
        self._step += 1
        self._since += 1
        if self._remaining is not None:
            self._remaining -= 1
            if self._remaining <= 0:
                self.model.stop_training = True
        if isinstance(self.save_freq, int) and self._step % self.save_freq == 0:
            self._save()
        if self._step % self.check_every == 0 or runtime.size() == 1:
            self._check_preemption()

    def _find_train_stream(self) -> None:
        # The epoch's training iterator has started: its stream moved on by one epoch.
        self._train = None
        if len(self._marks) == len(data.STREAMS):
            for stream, mark in zip(data.STREAMS, self._marks, strict=True):
                if int(stream.position.numpy()) == mark + stream.steps:
                    self._train, self._start = stream, mark
                    return

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.model.stop_training or self._remaining == 0:
            self._epoch = epoch + 1
        if self.save_freq == "epoch" or self._remaining == 0:
            self._save()
        self._check_preemption()

    def _check_preemption(self) -> None:
        if not preempt.agreed():
            return
        self._save()
        if runtime.size() > 1:
            allreduce(keras.ops.zeros(()), op="sum")  # nobody exits before rank 0 wrote
        done = "checkpoint saved" if self._unsaved is None else "checkpoint NOT saved (above)"
        _say(f"{done} at step {self._step}; exiting with {preempt.REQUEUE_CODE} to be requeued")
        sys.stdout.flush()
        raise SystemExit(preempt.REQUEUE_CODE)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        preempt.uninstall(self._handlers)
        compat.set_initial_epoch(self.model, None)
        if self.final_model and runtime.is_chief():
            self._save_final(self.final_model)
        elif self._unsaved is not None and runtime.is_chief():
            self._unsaved_end(f"every checkpoint since step {self._unsaved} failed")

    def _save_final(self, name: str) -> None:
        """Rank 0: the whole model as ``directory/name``; a full disk leaves nothing half-written and ends the
        job with :data:`UNSAVED_CODE` in one line."""
        directory = self.manager.directory
        tmp = directory / f".tmp-{os.getpid()}-{name}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with single_process():
                self.model.save(tmp)  # Keras wants the .keras suffix, so not files.atomic_write
            replace_durably(tmp, directory / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            size = sum(int(v.numpy().nbytes) for o in self._objects().values() for v in variables_of(o))
            self._unsaved_end(not_saved("the final model", directory / name, size, exc, about="about "))

    def _unsaved_end(self, why: str) -> None:
        """End a training whose last state is on no disk: one line, exit code :data:`UNSAVED_CODE`."""
        leave(
            f"training ended but its last state is not on disk: {why}; {self._newest()}: free space there, "
            "then run again to resume from it",
            UNSAVED_CODE,
        )
