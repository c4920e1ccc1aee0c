"""The MPI engine on numpy arrays: collectives without TensorFlow, for numpy and mpi4py scripts.

:mod:`mldist.runtime.engines.mpi_engine` runs its collectives inside TensorFlow's graph (``numpy_function``
ops on its progress thread); a script that never imported TensorFlow calls these instead, on the
calling thread, over the same communicators with the same checks: every rank agrees on a signature
first (a mismatch raises :class:`mldist.errors.CollectiveMismatch` on every rank), the stalled-collective
watch and the departures see each call, and a Horovod process set's communicator is used while one
runs. Arrays keep their shape and dtype; the caller's arrays are never written.

The runtime gets the MPI engine from here (:func:`engine`), with these as its ``host`` collectives.

Example::

    total, = HOST.allreduce([np.arange(3.0)], "sum")     # after mldist.init() on 2+ MPI ranks
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from . import mpi_join, mpi_wait, subsets
from .mpi_engine import MpiEngine, _agree, _aligned, _describe, _output, _reduce_in_place
from .mpi_world import World, each_ranks, watched

Arrays = list[np.ndarray[Any, Any]]
#: 16-bit floats summed by their own MPI operation (their bits travel as uint16).
_OWN_SUM = ("float16", "bfloat16")


def _wire(a: np.ndarray[Any, Any], op: str) -> tuple[str, np.ndarray[Any, Any]]:
    """(kind, a writable 1-D copy MPI can reduce): as
    :func:`mldist.runtime.engines.mpi_engine._wire` does to tensors."""
    flat = np.array(a, order="C").reshape(-1)
    if op == "sum" and a.dtype.name in _OWN_SUM:
        return f"sum_{a.dtype.name}", flat.view(np.uint16)
    if a.dtype.name in _OWN_SUM:
        return op, flat.astype(np.float32)
    return op, flat.astype(np.int32) if a.dtype == np.bool_ else flat


def _unwire(r: np.ndarray[Any, Any], like: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if like.dtype == np.bool_:
        back: np.ndarray[Any, Any] = r != 0
    else:
        back = r.view(like.dtype) if r.dtype == np.uint16 and like.dtype.name in _OWN_SUM else r.astype(like.dtype)
    shaped: np.ndarray[Any, Any] = back.reshape(like.shape)
    return shaped


def _over(body: Callable[..., Arrays], what: str) -> Callable[..., Arrays]:
    """``body`` run as a watched collective over the active process set's communicator, else the world's."""
    subset = subsets.active()
    return watched(body, what, None if subset is None else subset.comm)


def _layout(arrays: Arrays) -> int:
    return zlib.crc32(repr([a.shape for a in arrays]).encode()) & 0x7FFFFFFF or 1


def allreduce(arrays: Arrays, op: str, layout: int = 0) -> Arrays:
    """Element-wise "sum", "max", "min" or "prod" of each array over the ranks: new arrays, same shapes and dtypes."""
    wired = [_wire(a, op) for a in arrays]
    shapes = layout or _layout(arrays)

    def run(*flat: np.ndarray[Any, Any]) -> Arrays:
        out = []
        for (kind, _), a in zip(wired, flat, strict=True):
            if not _agree(kind, shapes, [a], _describe(f"allreduce({op})", [a])):
                return list(flat)
            out.append(_reduce_in_place(a, mpi_join.operations()[kind]))
        return out

    reduced = _over(run, f"allreduce({op})")(*(w for _, w in wired))
    return [_unwire(r, a) for r, a in zip(reduced, arrays, strict=True)]


def broadcast(arrays: Arrays, root: int, rank: int) -> Arrays:
    """``root``'s arrays on every rank (raw bytes: exact for every dtype)."""
    sent = [np.array(a, order="C").reshape(-1).view(np.uint8) for a in arrays]

    def run(*flat: np.ndarray[Any, Any]) -> Arrays:
        out = [_output(a.size, a.dtype) for a in flat]
        if not _agree("broadcast", root, flat, _describe(f"broadcast(root={root})", flat)):
            return out
        for a, o in zip(flat, out, strict=True):
            if rank == root:
                np.copyto(o, a)
            mpi_wait.drive(World.active.Ibcast(o, root))  # (nonblocking: see mpi_wait.drive)
        return out

    got = _over(run, "broadcast")(*sent)
    return [g.copy().view(a.dtype).reshape(a.shape) for g, a in zip(got, arrays, strict=True)]


def allgather(value: np.ndarray[Any, Any], size: int) -> np.ndarray[Any, Any]:
    """Every rank's array concatenated on axis 0 in rank order; the first dimension may differ."""
    from mpi4py import MPI

    a = np.ascontiguousarray(value)
    inner = [int(d) for d in a.shape[1:]]

    def run(mine: np.ndarray[Any, Any]) -> Arrays:
        shape = zlib.crc32(np.array(inner, np.int64).tobytes())  # the row count may differ
        what = f"allgather of {a.dtype.name}{list(a.shape)}"
        if not _agree("allgather", shape, [mine[:0].reshape(-1)], lambda: what):
            return [np.array(mine)]
        rows = each_ranks(World.active, mine.shape[0], np.int64)
        row_bytes = int(np.prod(inner, dtype=np.int64)) * mine.itemsize
        out = _aligned(int(rows.sum()) * row_bytes, np.dtype(np.uint8))
        counts = rows * row_bytes
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        # Blocking: libnbc's nonblocking all-gather is linear (a connection to every peer), Open MPI's blocking
        # one a ring or neighbour exchange; every rank is here already (the counts' all-reduce above).
        World.active.Allgatherv(mine.view(np.uint8).reshape(-1), [out, counts, displs, MPI.BYTE])
        return [out.view(mine.dtype).reshape(int(rows.sum()), *inner)]

    (gathered,) = _over(run, "allgather")(a)
    out: np.ndarray[Any, Any] = gathered.copy()
    return out


class MpiHost:
    """:func:`allreduce`, :func:`broadcast` and :func:`allgather` as the engine's ``host`` collectives."""

    allreduce = staticmethod(allreduce)
    broadcast = staticmethod(broadcast)
    allgather = staticmethod(allgather)


#: The MPI engine's collectives on numpy arrays.
HOST = MpiHost()


class MpiEngineWithHost(MpiEngine):
    """The MPI engine with its collectives on numpy arrays (:data:`HOST`)."""

    host = HOST


def engine(name: str) -> MpiEngine:
    """The engine object for :func:`mldist.runtime.engines.engine.get`."""
    return MpiEngineWithHost()
