"""Collectives over a subset of the ranks (Horovod's process sets), on the MPI engine.

A :class:`Subset` names some world ranks and holds their MPI sub-communicator (None on
ranks outside it). Collectives built while :func:`within` is active run over that
communicator: sizes, ranks and roots are the subset's, and each traced call is cached
per subset. TensorFlow's engines have no sub-groups here: they refuse a subset.

Example::

    with within(subset):                  # subset = running().subgroup(1, (0, 2)) on the MPI engine
        total = mldist.allreduce(tf.ones([2]), op="sum")   # ranks 0 and 2 only
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Subset:
    """World ranks (sorted) and their communicator (None on a rank outside).

    Example:
        >>> Subset(1, (0, 2), None).index(2)
        1
    """

    key: int
    ranks: tuple[int, ...]
    comm: Any

    def size(self) -> int:
        return len(self.ranks)

    def index(self, world_rank: int) -> int:
        """``world_rank``'s rank within the subset."""
        return self.ranks.index(world_rank)


_ACTIVE: list[Subset] = []


@contextlib.contextmanager
def within(subset: Subset | None) -> Iterator[None]:
    """Build collectives over ``subset`` inside the block (None: the whole world)."""
    if subset is None:
        yield
        return
    _ACTIVE.append(subset)
    try:
        yield
    finally:
        _ACTIVE.pop()


def active() -> Subset | None:
    """The subset collectives are being built for, or None for the whole world."""
    return _ACTIVE[-1] if _ACTIVE else None


def key() -> int:
    """The active subset's key, 0 for the world: part of every cached collective's key."""
    return _ACTIVE[-1].key if _ACTIVE else 0


def split(comm: Any, key: int, ranks: tuple[int, ...]) -> Subset:
    """The subset of ``ranks`` (ranks of ``comm``) with its own communicator; collective over ``comm``."""
    from mpi4py import MPI

    me = comm.Get_rank()
    sub = comm.Split(0 if me in ranks else MPI.UNDEFINED, me)
    return Subset(key, tuple(sorted(ranks)), None if sub == MPI.COMM_NULL else sub)


def free(subset: Subset) -> None:
    """Release a subset's communicator (collective over its ranks)."""
    if subset.comm is not None:
        subset.comm.Free()
