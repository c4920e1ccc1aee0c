"""Preemption: turn SIGTERM/SIGUSR1 into "save at the next step boundary, then exit 75".

Slurm (``--signal``), PBS/Cobalt (the watcher in mldist's batch scripts) and
``mldist run`` deliver the signal to the workers, possibly during different
steps on different ranks. The handler only sets a flag; :func:`agreed`
sums the flags of all ranks in one all-reduce, so every rank decides to stop
at the same step (any rank's signal stops all).

Example::

    with mldist.preempt.watch():
        for step in ...:
            train_step()
            if step % 10 == 0 and mldist.preempt.agreed():
                save(); raise SystemExit(mldist.preempt.REQUEUE_CODE)
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from . import runtime
from .errors import REQUEUE_CODE
from .runtime import allreduce

__all__ = ["REQUEUE_CODE", "agreed", "install", "requested", "uninstall", "watch"]
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_received: list[int] = []


def _on_signal(signum: int, _frame: Any) -> None:
    if not _received:
        name = signal.Signals(signum).name
        ctx = runtime.current()
        who = f"rank {ctx.rank}" if ctx is not None else "worker"
        message = f"mldist: {who}: got {name}; saving at the next step boundary"
        print(message, file=sys.stderr, flush=True)
    _received.append(signum)


def requested() -> bool:
    """Whether this process got SIGTERM or SIGUSR1 while watching."""
    return bool(_received)


def agreed() -> bool:
    """Whether any rank got the signal (a collective: call it at the same step on every rank)."""
    import numpy as np

    if runtime.size() == 1:
        return requested()
    # A sum is one fused collective; "max" would go through two allgathers.
    return bool(int(allreduce(np.array(len(_received) > 0, np.int32), op="sum")))


def install() -> dict[int, Any]:
    """Install the SIGTERM/SIGUSR1 flag handlers; the old handlers, for :func:`uninstall`.

    Only the main thread may install signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _on_signal) for s in SIGNALS}


def uninstall(old: dict[int, Any]) -> None:
    """Put back the handlers that :func:`install` replaced.

    SIGUSR1's default (to end the process) is put back as "ignore": it is the time limit's warning,
    and one that comes after training ended (a job that finished inside its grace) must not turn the
    rank's exit 0 into a death by signal (138) and the job into FAILED; the limit itself still ends it.
    """
    for s, handler in old.items():
        signal.signal(s, signal.SIG_IGN if s == signal.SIGUSR1 and handler == signal.SIG_DFL else handler)


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Watch for SIGTERM/SIGUSR1 inside the ``with`` block (see :func:`agreed`)."""
    old = install()
    try:
        yield
    finally:
        uninstall(old)
