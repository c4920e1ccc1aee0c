"""Horovod's ``join`` on the MPI engine: a rank out of data answers the others' all-reduces.

A rank that calls :func:`join_rounds` stops issuing collectives and, round after round,
joins the others' agreement all-reduce with a "joined" signature (the smallest int64, so
MAX ignores it) and a flag. Active ranks that see the flag send the collective's layout
(dtypes and sizes) from the lowest active rank; the joined ranks then take part in the
data all-reduce with the operation's identity (0 for sums, so an average over the world
counts them as zeros, as in Horovod's own test of join). Other collectives (broadcast,
allgather) fail on the active ranks while a rank has joined, as in Horovod. When a round
finds no active rank, every rank has joined; they return the rank that joined last.

Example::

    last = join_rounds(comm, rank, begin, end)    # in a rank that ran out of batches
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import mpi_wait

#: What a joined rank puts in the agreement all-reduce: the smallest int64 (ignored by MAX).
JOINED = np.iinfo(np.int64).min
#: The agreement all-reduce's values (mpi_engine._signature): kind, arg, count, crc, their negations,
#: "joined", -rank.
SIGNATURE = 10


def power_of_two_below(size: int) -> int:
    """The largest power of two not above ``size``: Open MPI's Rabenseifner all-reduce needs that many elements.

    Example:
        >>> power_of_two_below(2), power_of_two_below(24), power_of_two_below(64)
        (2, 16, 64)
    """
    return 1 << (size.bit_length() - 1)


def slots(size: int) -> int:
    """The agreement all-reduce's length on ``size`` ranks: :data:`SIGNATURE`, padded (with zeros) to
    :func:`power_of_two_below`, so that it never falls back to a ring of ``2 x (size - 1)`` steps.

    Example:
        >>> slots(2), slots(64)
        (10, 64)
    """
    return max(SIGNATURE, power_of_two_below(size))


def allreduce(comm: Any, send: Any, out: np.ndarray[Any, Any], op: Any, poll: Callable[[Any], None]) -> None:
    """One data all-reduce into ``out``, every rank already there (they met in the agreement all-reduce).

    Nonblocking, its request handed to ``poll`` (which keeps it moving). Below
    :func:`power_of_two_below` elements, where Open MPI's Rabenseifner (mldist's setting, see
    ``mldist.placement.common.MPI_TUNING``) would fall back to a ring of ``2 x (size - 1)`` steps, the
    buffer goes padded with zeros to that length (each element is reduced alone: the pad never reaches
    the real ones). It went blocking before, and a blocking call busy-polls every rank: the first one over
    16 test hosts x 2 ranks on 2 cores took 31 s of a 50 s run, 0.1 s nonblocking. Every rank pads alike
    (same count).

    Example::

        allreduce(comm, MPI.IN_PLACE, buffer, MPI.SUM, mpi_wait.drive)
    """
    from mpi4py import MPI

    least = power_of_two_below(comm.Get_size())
    if out.size >= least:
        poll(comm.Iallreduce(send, out, op))
        return
    padded = np.zeros(least, out.dtype)
    padded[: out.size] = (out if send is MPI.IN_PLACE else np.asarray(send)).reshape(-1)
    poll(comm.Iallreduce(MPI.IN_PLACE, padded, op))
    np.copyto(out, padded[: out.size].reshape(out.shape))


#: Agreement codes of the all-reduces joined ranks answer (see mpi_engine._KINDS).
REDUCE_CODES = {1: "sum", 2: "max", 3: "min", 6: "prod", 7: "sum_float16", 8: "sum_bfloat16"}
_KINDS_OF_BUFFER = ("float16", "float32", "float64", "complex64", "complex128", "int8", "uint8", "int16")
_DTYPES: dict[int, np.dtype[Any]] = {
    np.dtype(name).num: np.dtype(name) for name in (*_KINDS_OF_BUFFER, "uint16", "int32", "uint32", "int64", "uint64")
}


#: MPI's operation of each all-reduce kind, made on first use (:func:`operations`).
_OPERATIONS: dict[str, Any] = {}


def _sum16(dtype: Callable[[], Any]) -> Callable[[Any, Any, Any], None]:
    """A user-defined MPI sum of 16-bit floats carried as their bits: each pair added in float32, rounded
    back to nearest even (what summing in float32 and casting gives for 2 ranks, bit for bit).

    ``dtype`` gives the numpy dtype when the first sum runs: bfloat16's (ml_dtypes) takes a numpy script
    seconds to load on a busy node, and only bfloat16 values need it.
    """

    def add(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        a = np.frombuffer(inbuf, dtype())
        b = np.frombuffer(inoutbuf, a.dtype)
        b[...] = (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)

    return add


@functools.cache
def _bfloat16() -> np.dtype[Any]:
    import ml_dtypes

    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dtype


def operations() -> dict[str, Any]:
    """MPI's operation for each all-reduce kind: "sum", "max", "min", "prod", and "sum_float16" and
    "sum_bfloat16", which add 16-bit floats sent as 16 bits (MPI has no such sum; Horovod brings its own too).

    Example::

        comm.Allreduce(MPI.IN_PLACE, bits, operations()["sum_bfloat16"])
    """
    if not _OPERATIONS:
        from mpi4py import MPI

        _OPERATIONS.update(sum=MPI.SUM, max=MPI.MAX, min=MPI.MIN, prod=MPI.PROD)
        _OPERATIONS["sum_float16"] = MPI.Op.Create(_sum16(lambda: np.dtype(np.float16)), commute=True)
        _OPERATIONS["sum_bfloat16"] = MPI.Op.Create(_sum16(_bfloat16), commute=True)
    return _OPERATIONS


def identity(op: str, dtype: np.dtype[Any]) -> Any:
    """The value that leaves ``op`` unchanged: what a joined rank contributes.

    Example:
        >>> identity("sum", np.dtype(np.float32)), identity("max", np.dtype(np.int8))
        (0, -128)
    """
    if op.startswith("sum") or op == "prod":  # sum_float16/sum_bfloat16: 0 bits are +0.0
        return 1 if op == "prod" else 0
    info: Any = np.finfo(dtype) if dtype.kind in "fc" else np.iinfo(dtype)
    return info.min if op == "max" else info.max


def layout(comm: Any, sender: int, arrays: Sequence[np.ndarray[Any, Any]] | None) -> list[tuple[int, int]]:
    """``sender``'s ``(dtype number, size)`` per buffer, on every rank (two broadcasts; collective)."""
    mine = np.array([x for a in arrays or () for x in (a.dtype.num, a.size)], np.int64)
    count = np.array([mine.size], np.int64)
    comm.Bcast(count, sender)
    body = mine if comm.Get_rank() == sender else np.empty(int(count[0]), np.int64)
    comm.Bcast(body, sender)
    return [(int(body[i]), int(body[i + 1])) for i in range(0, body.size, 2)]


def answer(comm: Any, code: int, shapes: list[tuple[int, int]], mpi_ops: dict[str, Any]) -> None:
    """A joined rank's part in an all-reduce: the identity of the operation, in each buffer's layout."""
    from mpi4py import MPI

    op = REDUCE_CODES[code]
    for num, size in shapes:
        dtype = _DTYPES[num]
        # The engine's own call (blocking and nonblocking collectives never match each other).
        allreduce(comm, MPI.IN_PLACE, np.full(size, identity(op, dtype), dtype), mpi_ops[op], mpi_wait.wait)


def join_rounds(comm: Any, rank: int, begin: Callable[[], None], end: Callable[[], None]) -> int:
    """Answer the other ranks' all-reduces until every rank has joined; the rank that joined last.

    ``begin``/``end`` mark each round as a collective in flight (departures, stall watch).
    """
    from mpi4py import MPI

    mpi_ops = operations()
    joined_at = time.time()
    while True:
        begin()
        try:
            both = np.zeros(slots(comm.Get_size()), np.int64)
            both[:SIGNATURE] = JOINED
            both[8] = 1
            mpi_wait.wait(comm.Iallreduce(MPI.IN_PLACE, both, MPI.MAX))  # matches the engine's signature
            if both[0] == JOINED:  # no active rank is left: everyone has joined
                last = comm.allreduce((joined_at, rank), op=MPI.MAX)  # a reduction: O(log N), not N to each rank
                return int(last[1])
            agreed = np.array_equal(both[:4], -both[4:8])
            if agreed and int(both[0]) in REDUCE_CODES:
                answer(comm, int(both[0]), layout(comm, int(-both[9]), None), mpi_ops)
        finally:
            end()
