"""``RunLog``: every epoch's metrics in the run directory, as a table, a plot and TensorBoard events.

Rank 0 writes, once per epoch:

- ``metrics.csv`` and ``metrics.jsonl`` (appended and flushed: one row per epoch with the
  epoch number from 1, Keras' metrics, ``epoch_seconds``, ``step_seconds`` and
  ``samples_per_second`` of all workers, estimated as rank 0's rate times the workers,
  since every rank runs the same steps in step);
- ``metrics.png``, loss and the other metrics (training solid, validation dashed) over
  the epochs so far (needs matplotlib, else one warning; none with MLDIST_PLOT=0), redrawn at an
  epoch's end once ``plot_every`` seconds (60) have passed since the last drawing, and when
  ``fit`` ends: a drawing takes rank 0 most of a second, and the other ranks wait for it;
- TensorBoard events under ``tensorboard/train`` and ``tensorboard/validation``
  (tags ``epoch_loss``, ``epoch_accuracy``, ...; see ``mldist tensorboard``).

Every rank writes ``rank-R.metrics.json``: its own samples/s, step time and last metrics,
which ``mldist run`` merges into ``summary.json`` at the end.

Where: ``run_dir="auto"`` (the default) uses ``$MLDIST_RUN_DIR``, set by ``mldist run``
for every rank; under ``mldist run --no-run-dir`` (``MLDIST_NO_RUN_DIR=1``) no rank writes
anything; without a launcher (``python train.py``, ``srun``, ``mpiexec``) rank 0 alone makes
``runs/<script>-<YYYYmmdd-HHMMSS>`` and the other ranks write nothing. A path writes there
on every rank; ``run_dir=None`` turns the callback off.

What each file holds, and how it is written, is :mod:`mldist.keras.epochs`; this module decides when.

Samples per second need the per-worker batch size: ``batch_size=`` if given, else the one
of the data ``fit`` was given (Keras' data adapter; ``mldist.data.shard`` datasets have it),
else only steps per second are reported.

Example::

    model.fit(ds, epochs=10, callbacks=mldist.keras.default_callbacks())   # RunLog included
    model.fit(ds, epochs=10, callbacks=[mldist.keras.RunLog("runs/exp1", batch_size=64)])
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import keras

from .. import runtime
from ..base import envvalues, rundir, training
from ..base.files import atomic_write
from ..base.rundir import METRICS_FILE, default_run_dir, now_iso, prepare_run_dir, write_json
from ..errors import ConfigError
from .epochs import TensorBoardWriters, append_row, epoch_row, plot_png, read_rows

#: ``run_dir`` value that follows ``$MLDIST_RUN_DIR`` (or makes a default directory on rank 0).
AUTO = "auto"


def resolve_run_dir(
    run_dir: str | os.PathLike[str] | None, rank: int, env: Mapping[str, str], argv: Sequence[str]
) -> Path | None:
    """Where RunLog writes on ``rank``, or None for nowhere (see the module's description).

    The one place that decides it: ``on_train_begin`` asks once per ``fit`` and keeps the answer.

    Args:
        run_dir: RunLog's ``run_dir`` ("auto", a path, or None).
        rank: this worker's rank.
        env: the environment: ``MLDIST_RUN_DIR``, or ``MLDIST_NO_RUN_DIR`` (``mldist run --no-run-dir``).
        argv: the script's command line (it names a default directory).

    Example:
        >>> resolve_run_dir("auto", 1, {"MLDIST_RUN_DIR": "/r/x"}, ["t.py"])
        PosixPath('/r/x')
        >>> resolve_run_dir("auto", 1, {}, ["t.py"]) is None, resolve_run_dir(None, 0, {}, ["t.py"])
        (True, None)
        >>> resolve_run_dir("auto", 0, {"MLDIST_NO_RUN_DIR": "1"}, ["t.py"]) is None
        True
    """
    if run_dir is None:
        return None
    if str(run_dir) != AUTO:
        return Path(run_dir)
    if given := envvalues.RUN_DIR.read(env):
        return Path(given)
    if envvalues.NO_RUN_DIR.read(env):  # mldist run --no-run-dir: no directory, not even rank 0's own
        return None
    return default_run_dir(argv) if rank == 0 else None


def speed(steps: int, seconds: float, batch_size: int | None) -> dict[str, float | None]:
    """Step time, steps/s and samples/s of one worker over ``steps`` steps in ``seconds``.

    Example:
        >>> speed(10, 2.0, 32)
        {'step_seconds': 0.2, 'steps_per_second': 5.0, 'samples_per_second': 160.0}
    """
    if steps < 1 or seconds <= 0:
        return {"step_seconds": None, "steps_per_second": None, "samples_per_second": None}
    rate = steps / seconds
    return {
        "step_seconds": round(seconds / steps, 6),
        "steps_per_second": round(rate, 3),
        "samples_per_second": round(rate * batch_size, 3) if batch_size else None,
    }


def fit_batch_size() -> int | None:
    """The per-worker batch size of the running ``fit``, from Keras' data adapter; None if unknown.

    Best effort: it looks for the ``epoch_iterator`` of Keras 3's ``fit`` up the call stack.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            adapter = getattr(frame.f_locals.get("epoch_iterator"), "data_adapter", None)
            try:
                size = getattr(adapter, "batch_size", None)
            except Exception:  # a data adapter that cannot tell
                size = None
            if isinstance(size, int) and size > 0:
                return size
            frame = frame.f_back
        return None
    finally:
        del frame


class RunLog(keras.callbacks.Callback):  # type: ignore[misc]
    """Write each epoch's metrics, a plot and TensorBoard events to the run directory.

    Put it after ``AverageMetrics`` (``default_callbacks()`` does) so it logs the averages.
    Writing problems (a full disk, no matplotlib) give one warning each; training goes on.

    Args:
        run_dir: "auto" (``$MLDIST_RUN_DIR``; nothing under ``mldist run --no-run-dir``; else
            ``runs/<script>-<time>`` on rank 0 only), a directory (every rank), or None (do nothing).
        batch_size: per-worker batch size for samples/s; default: found from ``fit``'s data.
        plot: draw metrics.png (rank 0); default: unless ``MLDIST_PLOT=0``.
        plot_every: least seconds between two drawings during training (it is drawn when fit ends).
        tensorboard: write TensorBoard events (rank 0).

    Example::

        model.fit(ds, epochs=5, callbacks=[*mldist.keras.default_callbacks()])  # includes RunLog()
        RunLog("runs/exp1", batch_size=64, plot=False)
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = AUTO,
        *,
        batch_size: int | None = None,
        plot: bool | None = None,
        plot_every: float = 60.0,
        tensorboard: bool = True,
    ) -> None:
        super().__init__()
        self.run_dir, self.batch_size, self.tensorboard = run_dir, batch_size, tensorboard
        self.plot = rundir.plot_wanted(os.environ) if plot is None else plot
        # Checked here: a string or NaN would otherwise fail (or never draw) at the first epoch's end.
        if isinstance(plot_every, bool) or not isinstance(plot_every, int | float) or not plot_every >= 0:
            raise ConfigError(f"plot_every={plot_every!r}: use a number of seconds >= 0 (0: after every epoch)")
        self.plot_every = float(plot_every)
        self._plotted_at = 0.0
        self._unplotted = False
        self.path: Path | None = None
        self.rows: list[dict[str, Any]] = []
        self.warned: set[str] = set()
        self._writers: TensorBoardWriters | None = None
        self._batch: int | None = None
        self._t0 = self._t_train = 0.0
        self._steps = 0
        self._epoch, self._progress_at = 0, 0.0
        self._epoch_seconds: float | None = None

    def _warn(self, what: str, exc: BaseException | str) -> None:
        if what not in self.warned:
            self.warned.add(what)
            print(f"mldist.keras.RunLog: no {what} ({exc}); training goes on", file=sys.stderr, flush=True)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        ctx = runtime.init()
        self._rank, self._size, self._chief = ctx.rank, ctx.size, ctx.is_chief
        found = resolve_run_dir(self.run_dir, ctx.rank, os.environ, sys.argv)
        self.path = None
        if found is None:
            return
        try:
            self.path = prepare_run_dir(found, "RunLog run_dir").resolve()
        except Exception as exc:
            self._warn("run directory", exc)
            return
        self._batch = self.batch_size or fit_batch_size()
        if not self._chief:
            return
        self.rows = read_rows(self.path)
        self._plotted_at, self._unplotted = time.perf_counter(), False
        if str(self.run_dir) == AUTO and not envvalues.RUN_DIR.read(os.environ):
            print(f"mldist.keras.RunLog: metrics, plot and TensorBoard events in {found}", flush=True)
        if self.tensorboard and self._writers is None:
            try:
                self._writers = TensorBoardWriters(self.path / "tensorboard")
            except Exception as exc:
                self._warn("TensorBoard events", exc)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._t0 = self._t_train = time.perf_counter()
        self._steps, self._epoch = 0, epoch + 1

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps = batch + 1
        self._t_train = time.perf_counter()
        if self._chief and self.path is not None and self._t_train - self._progress_at >= training.WRITE_EVERY:
            self._progress(logs or {})

    def _progress(self, logs: dict[str, Any], done: bool = False) -> None:
        """Rank 0: ``training.json`` (:mod:`mldist.base.training`), for ``mldist status``."""
        assert self.path is not None
        self._progress_at = time.perf_counter()
        mine = speed(self._steps, self._t_train - self._t0, self._batch)
        rate = mine["samples_per_second"]
        params = getattr(self, "params", None) or {}
        rec = training.record(
            self._epoch,
            params.get("epochs"),
            self._steps,
            params.get("steps"),
            mine["step_seconds"],
            None if rate is None else rate * self._size,
            logs,
            self._epoch_seconds,
            done,
        )
        try:
            write_json(self.path / training.FILE, rec)
        except OSError as exc:
            self._warn(training.FILE, exc)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.path is None:
            return
        seconds = time.perf_counter() - self._t0
        mine = speed(self._steps, self._t_train - self._t0, self._batch)
        report = {
            "rank": self._rank,
            "size": self._size,
            "host": socket.gethostname(),
            "epochs": epoch + 1,
            "steps": self._steps,
            "batch_size": self._batch,
            "epoch_seconds": round(seconds, 3),
            **mine,
            "metrics": epoch_row(epoch, logs or {}, {}),
            "updated": now_iso(),
        }
        try:
            write_json(self.path / METRICS_FILE.format(rank=self._rank), report)
        except OSError as exc:
            self._warn(f"rank-{self._rank}.metrics.json", exc)
        if self._chief:
            rate = mine["samples_per_second"]
            timing = {
                "epoch_seconds": round(seconds, 3),
                "step_seconds": mine["step_seconds"],
                "samples_per_second": None if rate is None else round(rate * self._size, 3),
            }
            self._chief_outputs(epoch, epoch_row(epoch, logs or {}, timing))
            self._epoch_seconds = seconds
            self._progress(logs or {})

    def _chief_outputs(self, epoch: int, row: dict[str, Any]) -> None:
        """Rank 0: the table rows, the plot and the TensorBoard scalars of one epoch."""
        assert self.path is not None
        self.rows.append(row)
        try:
            append_row(self.path, row)
        except OSError as exc:
            self._warn("metrics.csv/metrics.jsonl", exc)
        self._unplotted = self.plot
        if time.perf_counter() - self._plotted_at >= self.plot_every:
            self._draw()
        if self._writers is not None:
            try:
                self._writers.scalars(epoch, row)
            except Exception as exc:
                self._warn("TensorBoard events", exc)

    def _draw(self) -> None:
        """Rank 0: metrics.png of the rows so far, if any epoch ended since the last drawing."""
        if not self._unplotted or self.path is None:
            return
        self._plotted_at, self._unplotted = time.perf_counter(), False
        try:
            atomic_write(self.path / "metrics.png", plot_png(self.rows, self.path.name))
        except ImportError:
            self._warn("metrics.png", "matplotlib is not installed: pip install matplotlib")
        except Exception as exc:
            self._warn("metrics.png", exc)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._draw()
        if self._chief and self.path is not None:
            self._progress(logs or {}, done=True)
        if self._writers is not None:
            self._writers.close()
            self._writers = None
