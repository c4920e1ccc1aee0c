"""A training job at a glance: the progress rank 0 keeps in the run directory, and its one-line summary.

``mldist.keras.RunLog`` (rank 0) rewrites ``training.json`` in the run directory about every
second of a ``fit`` and at each epoch's end: epoch and step of the total, the rate, the latest
loss and metrics, the last epoch's time and when it wrote. ``mldist status`` reads it (files
only: no server, no network) and :func:`describe` turns it into words, with the time left
and how long ago the job last wrote, so a stuck job shows as stuck.

Example:
    >>> rec = {"epoch": 2, "epochs": 4, "step": 5, "steps": 10, "step_seconds": 0.5, "samples_per_second": 256.0,
    ...        "metrics": {"loss": 0.25, "accuracy": 0.9}, "epoch_seconds": 5.0, "updated_unix": 100.0, "done": False}
    >>> describe(rec, now=103.0)
    'epoch 2/4 step 5/10, 256 samples/s, loss 0.25 accuracy 0.9, 5.0 s/epoch, 12.5 s left (written 3 s ago)'
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import untrusted
from .untrusted import AMOUNT, COUNT, FLAG, METRIC, TEXT, UNIX_TIME, map_of

#: The file in the run directory.
FILE = "training.json"
#: Seconds between two writes during an epoch.
WRITE_EVERY = 1.0
#: How many metrics the line shows (loss first).
SHOWN_METRICS = 4
#: What each field of ``training.json`` may hold (a reader checks them before it formats any).
FIELDS = {
    "epoch": COUNT,
    "epochs": COUNT,
    "step": COUNT,
    "steps": COUNT,
    "step_seconds": AMOUNT,
    "samples_per_second": AMOUNT,
    "metrics": map_of(METRIC),
    "epoch_seconds": AMOUNT,
    "updated": TEXT,
    "updated_unix": UNIX_TIME,
    "done": FLAG,
}


def record(
    epoch: int,
    epochs: int | None,
    step: int,
    steps: int | None,
    step_seconds: float | None,
    samples_per_second: float | None,
    metrics: Mapping[str, Any],
    epoch_seconds: float | None,
    done: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """What ``training.json`` holds (epoch from 1; ``step`` steps done in it; None where unknown)."""
    when = time.time() if now is None else now
    numbers = {k: round(float(v), 6) for k, v in metrics.items() if isinstance(v, (int, float))}
    return {
        "epoch": epoch,
        "epochs": epochs,
        "step": step,
        "steps": steps,
        "step_seconds": None if step_seconds is None else round(step_seconds, 6),
        "samples_per_second": None if samples_per_second is None else round(samples_per_second, 3),
        "metrics": numbers,
        "epoch_seconds": None if epoch_seconds is None else round(epoch_seconds, 3),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
        "updated_unix": round(when, 3),
        "done": done,
    }


def read(run_dir: str | Path) -> dict[str, Any] | None:
    """The run directory's ``training.json``, or None when there is none (yet) or it cannot be used."""
    try:
        return load(run_dir)
    except untrusted.Unusable:
        return None


def load(run_dir: str | Path) -> dict[str, Any] | None:
    """The run directory's ``training.json`` with its fields checked; None when there is none (yet).

    Raises :class:`mldist.base.untrusted.Unusable` (its line names the file and why) for one that
    cannot be read (another user's) or is damaged (cut short, a loss of ``"0.31"``).

    Example:
        >>> load("/nonexistent") is None
        True
    """
    return untrusted.load(Path(run_dir) / FILE, FIELDS)


def progress_line(run_dir: str | Path, ended: bool, now: float | None = None) -> str | None:
    """:func:`describe` of the run directory's ``training.json``, the line of :func:`load`'s refusal, or None.

    Example:
        >>> progress_line("/nonexistent", ended=False) is None
        True
    """
    try:
        rec = load(run_dir)
    except untrusted.Unusable as exc:
        return str(exc)
    return None if rec is None else describe(rec, now=now, ended=ended)


def seconds_left(rec: Mapping[str, Any]) -> float | None:
    """The time left: the steps left at the current step time, else the epochs left at the last epoch's time.

    Example:
        >>> seconds_left({"epoch": 1, "epochs": 3, "step": 2, "steps": 4, "step_seconds": 1.0})
        10.0
        >>> seconds_left({"epoch": 2, "epochs": 3, "step": 2, "steps": None, "epoch_seconds": 30.0})
        30.0
    """
    epoch, epochs = rec.get("epoch"), rec.get("epochs")
    if rec.get("done"):
        return 0.0
    if not isinstance(epoch, int) or not isinstance(epochs, int):
        return None
    steps, step, pace = rec.get("steps"), rec.get("step") or 0, rec.get("step_seconds")
    if isinstance(steps, int) and isinstance(pace, (int, float)):
        return round(((epochs - epoch) * steps + max(steps - step, 0)) * pace, 3)
    per_epoch = rec.get("epoch_seconds")
    return round((epochs - epoch) * per_epoch, 3) if isinstance(per_epoch, (int, float)) else None


def clock(seconds: float) -> str:
    """A duration in words: ``12.5 s``, ``4m05s``, ``2h03m``.

    Example:
        >>> clock(12.5), clock(245), clock(7380)
        ('12.5 s', '4m05s', '2h03m')
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _of(done: Any, total: Any) -> str:
    return f"{done}/{total}" if total else f"{done}"


def describe(rec: Mapping[str, Any], now: float | None = None, ended: bool = False) -> str:
    """The job's progress in one line: where, how fast, how well, how long, and how fresh.

    Args:
        rec: ``training.json``'s content.
        now: the time (default: now).
        ended: the job is over: a ``fit`` that did not finish stopped where it was.
    """
    parts = [f"epoch {_of(rec.get('epoch'), rec.get('epochs'))} step {_of(rec.get('step'), rec.get('steps'))}"]
    if isinstance(rate := rec.get("samples_per_second"), (int, float)):
        parts.append(f"{rate:,.0f} samples/s")
    metrics = rec.get("metrics") or {}
    shown = sorted(metrics, key=lambda k: (k != "loss", k))[:SHOWN_METRICS]
    if shown:
        parts.append(" ".join(f"{k} {metrics[k]:.4g}" for k in shown))
    if isinstance(per_epoch := rec.get("epoch_seconds"), (int, float)):
        parts.append(f"{per_epoch:.1f} s/epoch")
    if rec.get("done"):
        return ", ".join(parts) + ", finished"
    if ended:
        return ", ".join(parts) + f", stopped there ({rec.get('updated', 'time unknown')})"
    left = seconds_left(rec)
    tail = f"{clock(left)} left" if left is not None else "time left unknown"
    written = rec.get("updated_unix")
    if isinstance(written, (int, float)):
        ago = max((time.time() if now is None else now) - written, 0.0)
        tail += f" (written {ago:.0f} s ago)"
    return ", ".join([*parts, tail])
