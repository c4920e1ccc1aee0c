"""Horovod's process sets on the MPI engine: ``add_process_set``, ``remove_process_set``, ``init(process_sets=)``.

A set is an MPI sub-communicator of the engine's world (:mod:`mldist.runtime.engines.subsets`);
adding and removing one is collective (every rank calls it, in the same order), as in
Horovod. Collectives take ``process_set=``; a rank outside the set gets a ConfigError.

Example::

    evens = hvd.add_process_set([0, 2])
    if evens.included():
        total = hvd.allreduce(x, op=hvd.Sum, process_set=evens)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, UnsupportedError
from ..runtime.engines import subsets
from ..runtime.engines.engine import NO_SUBGROUPS, running
from . import basics
from .basics import ProcessSet, global_process_set

_REGISTERED: dict[int, ProcessSet] = {0: global_process_set}


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (collective: every rank calls it with the same ranks); the set, with its id."""
    ctx = basics.context()
    if not (eng := running()).subgroups:
        raise UnsupportedError(NO_SUBGROUPS.format(name=eng.name))
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if not ps.ranks or any(not 0 <= r < ctx.size for r in ps.ranks):
        raise ConfigError(f"{ps!r}: give ranks from 0 to {ctx.size - 1}")
    if ps.process_set_id is not None or any(ps == known for known in _REGISTERED.values()):
        raise ValueError(f"{ps!r} is already registered (Horovod refuses duplicate process sets too)")
    key = max(_REGISTERED) + 1
    ps.subset = eng.subgroup(key, tuple(ps.ranks))
    ps.process_set_id = key
    _REGISTERED[key] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set (collective); False when it was not registered (or is the global set)."""
    key = process_set.process_set_id
    if not key or _REGISTERED.get(key) is not process_set:
        return False
    subsets.free(process_set.subset)
    del _REGISTERED[key]
    process_set.process_set_id, process_set.subset = None, None
    return True


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Horovod's ``hvd.init``: start mldist (:func:`mldist.horovod.basics.init`), then register
    ``process_sets`` in order (a list of sets), or none yet ("dynamic": add them later).

    Example::

        hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])])
    """
    basics.init(comm)
    if process_sets in (None, "dynamic"):
        return
    for ps in process_sets:
        if ps is not global_process_set and ps.process_set_id is None:
            add_process_set(ps)


def registered(process_set_id: int) -> ProcessSet:
    """The set with this id; ConfigError naming the registered ids otherwise."""
    if process_set_id not in _REGISTERED:
        raise ConfigError(f"process_set_id={process_set_id} is not registered (ids: {sorted(_REGISTERED)})")
    return _REGISTERED[process_set_id]
