"""Waiting for other ranks on the MPI engine without taking a core from them.

A blocking MPI call busy-polls: a rank that reaches a collective first burns a whole core
until the last rank arrives (measured here: 4.95 CPU-s in a 5 s wait). On a node with more
ranks, threads or jobs than cores, that core is taken from the rank being waited for. The
engine therefore meets the others with a nonblocking call (the signature all-reduce before
each collective, the barrier before its communicators are made) and waits for it here: it
polls for a millisecond, the usual arrival skew of a training step, and then sleeps between
polls, 50 µs at first and doubling up to 2 ms. The data collective that follows runs blocking,
with every rank already there.

Example::

    from mpi4py import MPI
    both = np.zeros(10, np.int64)
    wait(MPI.COMM_WORLD.Iallreduce(MPI.IN_PLACE, both, MPI.MAX))
"""

from __future__ import annotations

import os
import time
from typing import Any

#: Poll without sleeping for this long: a peer that is about to arrive costs no latency.
SPIN_SECONDS = 0.001
#: The first sleep between polls after that, and the longest one.
FIRST_NAP = 0.00005
LONGEST_NAP = 0.002
#: The longest sleep while ranks meet at start-up (:func:`mldist.runtime.engines.mpi_world.start`): there the
#: first ranks wait seconds for the last to start, and a wake-up every 2 ms on each waiting rank took the
#: cores from the ranks still starting (64 ranks on 2 cores); 20 ms costs at most that once.
START_NAP = 0.02


def wait(request: Any, longest: float = LONGEST_NAP) -> None:
    """Wait until an MPI request completes: poll for :data:`SPIN_SECONDS`, then sleep between polls.

    Args:
        request: an ``mpi4py.MPI.Request`` of a nonblocking call (``Iallreduce``, ``Ibarrier``, ...).
        longest: the longest sleep between polls (:data:`START_NAP` where ranks meet at start-up).
    """
    if request.Test():
        return
    until = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < until:
        if request.Test():
            return
    nap = FIRST_NAP / 2
    # One line: a waiting rank's stack (a record, SIGQUIT's fold) is always here, never at the sleep one time
    # and at the poll the next, which split ranks waiting at one place into two folds.
    while not request.Test() and not time.sleep(nap := min(nap * 2, longest)):  # type: ignore[func-returns-value]
        pass


def drive(request: Any) -> None:
    """Wait for a data collective with every rank already there: poll, yielding the core between polls.

    Open MPI moves a transfer on only inside MPI calls, so the sleeping polls of :func:`wait` (up to
    :data:`LONGEST_NAP` apart) leave a network link idle between them: over a 1 Gbit/s link the CNN's
    1.4 MB all-reduce went 1347 -> 2387 images/s per worker when polled without naps. Yielding
    instead of sleeping lets backprop, when it has work, take the core first (the overlap), and keeps
    the transfer moving when it has none.

    Args:
        request: the ``mpi4py.MPI.Request`` of the data collective.
    """
    while not request.Test():
        os.sched_yield()
