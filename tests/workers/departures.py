"""Worker: every rank runs two all-reduces, then departs (``Departures.depart``); each prints ``SENT RANK COUNT``,
the departure messages it sent. ``mpirun -n N python departures.py``; no TensorFlow, no mldist.init()."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from mldist.runtime.engines.mpi_exit import Departures


class Counting:
    """The communicator, counting the point-to-point messages sent through it."""

    def __init__(self, comm: Any) -> None:
        self.comm, self.sent = comm, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    def Isend(self, *args: Any) -> Any:
        self.sent += 1
        return self.comm.Isend(*args)


world = MPI.COMM_WORLD
counting = Counting(world.Dup())
departures = Departures(counting, world.Get_rank(), world.Get_size())
for _ in range(2):
    departures.begin("allreduce(sum)")
    world.Allreduce(MPI.IN_PLACE, np.ones(4), MPI.SUM)
    departures.end()
departures.depart(0)
print("SENT", world.Get_rank(), counting.sent, flush=True)
