"""How MPI ranks leave: together at the end, and never leaving another rank waiting.

``MPI_Finalize`` waits for every rank, so a rank whose script ended while another
still needs it in a collective would hang both. Here each rank counts the
collectives it has run; when its script ends (exit 0, or 75 to be requeued) it
tells how many it ran (every rank tells rank 0, which tells every rank: 2 (N - 1)
messages), then waits for all of them to end too (one non-blocking barrier), as
MPI_Finalize would. A rank that is in, or enters, a collective that a departed
rank it heard of never ran ends at once with one line naming that rank (a daemon
thread looks every :data:`POLL_SECONDS` while a collective is in flight; the
engine looks before each one). Non-zero exits do not come here: :mod:`leave` ends the job.

Example::

    dep = Departures(comm.Dup(), rank=0, size=2)
    dep.begin("allreduce(sum)"); ...; dep.end()      # around every collective
    dep.depart(0)                                      # at exit: tell, then wait for the others
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import numpy as np

from ...base import processwide
from ..watch.leave import leave

TAG = 75
POLL_SECONDS = 0.2
_WAIT_SECONDS = 0.02
#: Its entry in mldist.base.processwide.PATCHES: the stop signals' defaults while a rank departs.
_DEFAULTS = "signal: SIGTERM and SIGINT to their defaults while departing"


def departed_message(rank: int, code: int, ran: int, what: str) -> str:
    """The line of a rank that needs ``rank`` in its collective number ``ran + 1`` or later.

    Example:
        >>> departed_message(1, 0, 12, "allreduce(sum)")[:49]
        'rank 1 has finished (exit code 0) after 12 collec'
    """
    plural = "" if ran == 1 else "s"
    return (
        f"rank {rank} has finished (exit code {code}) after {ran} collective{plural}, but this rank still needs it "
        f"in {what}; every rank must run the same collectives (the same steps and epochs: "
        "mldist.data.shard gives every rank the same number of batches)"
    )


#: The rank every departing rank tells, and that tells every rank of its own departure.
HUB = 0


def told(rank: int, size: int) -> list[int]:
    """The ranks ``rank`` tells of its departure (and hears from): the hub every rank, a rank the hub.

    Example:
        >>> told(0, 4), told(2, 4)
        ([1, 2, 3], [0])
    """
    return [peer for peer in range(size) if peer != rank] if rank == HUB else [HUB]


class Departures:
    """The ranks that have left, and this rank's collectives in flight.

    Args:
        comm: a private communicator (a ``Dup`` of the engine's) for the departure messages.
        rank, size: this rank and the world's size.
    """

    def __init__(self, comm: Any, rank: int, size: int) -> None:
        self.comm, self.rank, self.size = comm, rank, size
        #: Collectives started on this rank, and the one in flight (None between collectives).
        self.started = 0
        self.inflight: str | None = None
        self.left: dict[int, tuple[int, int]] = {}  # rank -> (exit code, collectives it ran)
        self._lock = threading.Lock()
        self._sent: list[Any] = []
        self._payload = np.zeros(2, np.int64)

    def poll(self) -> dict[int, tuple[int, int]]:
        """Receive every departure that has arrived; all departures known so far."""
        from mpi4py import MPI

        with self._lock:
            status = MPI.Status()
            while self.comm.Iprobe(MPI.ANY_SOURCE, TAG, status):
                got = np.zeros(2, np.int64)
                self.comm.Recv(got, status.Get_source(), TAG)
                self.left[status.Get_source()] = (int(got[0]), int(got[1]))
            return dict(self.left)

    def _check(self, number: int, what: str) -> None:
        """Leave if a departed rank ran fewer than ``number`` collectives (it will never join this one)."""
        for rank, (code, ran) in sorted(self.poll().items()):
            if ran < number:
                leave(departed_message(rank, code, ran, what))

    def begin(self, what: str) -> None:
        """Mark the next collective as started (checked against the departures first)."""
        self.started += 1
        if self.left or self.comm.Iprobe(tag=TAG):
            self._check(self.started, what)
        self.inflight = what

    def end(self) -> None:
        """Mark the collective in flight as finished."""
        self.inflight = None

    def watch(self) -> None:
        """Start the daemon thread that ends this rank when a collective waits for a departed rank."""
        threading.Thread(target=self._watch, name="mldist-departures", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            what, number = self.inflight, self.started
            if what is not None:
                self._check(number, what)

    def depart(self, code: int) -> None:
        """Tell the others this rank ran its last collective, then wait until every rank has departed.

        A rank tells the hub (rank :data:`HUB`) alone, and the hub tells every rank: 2 (N - 1) messages in all,
        not N (N - 1). The hub names a rank that left while it runs collectives the rank never ran; a rank
        still running collectives after the hub left hears it from the hub. Then one non-blocking barrier: every
        rank has departed when it completes.
        """
        from mpi4py import MPI

        # A stop signal must end the wait at once (a Python flag handler, e.g. preemption's, would not).
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                processwide.on_signal(_DEFAULTS, sig, signal.SIG_DFL)
        self._payload[:] = (code, self.started)
        self._sent = [self.comm.Isend(self._payload, peer, TAG) for peer in told(self.rank, self.size)]
        barrier = self.comm.Ibarrier()
        while not barrier.Test():
            self.poll()
            time.sleep(_WAIT_SECONDS)
        while len(self.poll()) < len(told(self.rank, self.size)):  # sent before the barrier: on their way
            time.sleep(_WAIT_SECONDS)
        MPI.Request.Waitall(self._sent)
