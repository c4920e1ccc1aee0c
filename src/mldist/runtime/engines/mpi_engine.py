"""The MPI collective engine's collectives: mpi4py calls inside the graph, through ``tf.numpy_function``.

No TensorFlow server and no compiled op: each fused buffer becomes two
stateful ``numpy_function`` ops: a start op hands the tensor's memory to this rank's
progress thread (:mod:`mldist.runtime.engines.mpi_progress`), which calls ``MPI_Allreduce``, ``MPI_Bcast`` or
``MPI_Allgatherv`` on it, and a finish op takes the result. Each bucket's start op
needs only its own gradients, so its all-reduce runs while backprop computes the
rest. TensorFlow orders stateful ops in program order and one thread issues them,
so every rank issues the same MPI calls in the same order; they run eagerly, in
``tf.function`` and in Keras ``fit`` (not under XLA).

All-reduces write into their (owned) input buffers: TensorFlow takes the
result back without a copy. Before each call every rank joins one tiny
``MPI_Iallreduce(MAX)`` of a signature and its negation (kind, op or root, buffer count, sizes, dtypes):
ranks that disagree all raise :class:`mldist.errors.CollectiveMismatch` naming what
each rank passed, instead of hanging or reducing mismatched memory. float16/bfloat16 travel as their
16 bits and are summed pairwise in float32 (a user-defined MPI operation: compression halves the bytes);
their max/min/prod go in float32, bool as int32; broadcast and allgather move raw bytes.

The engine's world (its communicators, the departures, the abort and Horovod's join) is
:mod:`mldist.runtime.engines.mpi_world`; this module moves the bytes.

Example::

    start()                                   # mldist.init() does this (mpi_world.start)
    total, = allreduce([tf.constant([1.0, 2.0])], "sum")
"""

from __future__ import annotations

import functools
import sys
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import CollectiveMismatch
from ...placement import Placement
from .. import compat
from ..watch.failures import Deferred
from . import mpi_join, mpi_tiers, mpi_wait, subsets
from .mpi_progress import PROGRESS
from .mpi_world import World, abort, aside, each_ranks, join, start, watched, world

_KINDS = {"sum": 1, "max": 2, "min": 3, "broadcast": 4, "allgather": 5, "prod": 6, "sum_float16": 7, "sum_bfloat16": 8}
_ALIGN = 64  # TensorFlow adopts a returned array without a copy when its data is aligned so


def _aligned(count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    raw = np.empty(count * dtype.itemsize + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + count * dtype.itemsize].view(dtype)


#: Output arrays by (elements, dtype), reused once TensorFlow has dropped the tensor made from them.
_POOL: dict[tuple[int, str], list[np.ndarray[Any, Any]]] = {}
_POOL_DEPTH = 4
# References to a pooled array that is free again: the pool's list, the loop variable, getrefcount's argument.
_FREE_REFS = 3


def _output(count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """An aligned array for a result: a pooled one nobody holds any more, else a new one.

    TensorFlow adopts a returned array without copying and keeps a reference while
    the tensor lives. Reusing addresses matters: the MPI library's shared-memory path
    is about twice as fast on memory it has seen before (8 MB: 8.7 ms vs 17.9 ms here).
    """
    arrays = _POOL.setdefault((count, dtype.str), [])
    for array in arrays:
        if sys.getrefcount(array) <= _FREE_REFS:
            return array
    array = _aligned(count, dtype)
    if len(arrays) < _POOL_DEPTH:
        arrays.append(array)
    return array


#: Signature (and its negation) by call layout: built once per layout, copied per call.
_SIGNATURES: dict[tuple[Any, ...], np.ndarray[Any, Any]] = {}


def _signature(kind: str, arg: int, arrays: Sequence[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """``[kind, arg, count, crc(layout)]``, its negation, "not joined" and ``-rank``: one MAX all-reduce
    gives the maximum and minimum, whether a rank has joined, and the lowest active rank."""
    me, size = World.active.Get_rank(), World.active.Get_size()
    key = (kind, arg, me, size, *((a.dtype.num, a.size) for a in arrays))
    if key not in _SIGNATURES:
        layout = np.array(key[4:], np.int64).tobytes()
        sig = np.array([_KINDS[kind], arg, len(arrays), zlib.crc32(layout)], np.int64)
        padding = np.zeros(mpi_join.slots(size) - mpi_join.SIGNATURE, np.int64)  # (Rabenseifner's minimum)
        _SIGNATURES[key] = np.concatenate([sig, -sig, [0, -me], padding])
    both: np.ndarray[Any, Any] = _SIGNATURES[key].copy()
    return both


def _agree(kind: str, arg: int, arrays: Sequence[np.ndarray[Any, Any]], what: Callable[[], str]) -> bool:
    """True if all ranks pass the same signature; else every rank raises CollectiveMismatch naming them all
    (or, in an eager call, leaves it to :class:`~mldist.runtime.watch.failures.Deferred` and returns False).

    One 80-byte ``MPI_Iallreduce`` per collective (a few microseconds on a node): it is what
    turns a mismatch into one line on every rank instead of a hang or reduced garbage, and where
    the first ranks wait for the last without busy-polling (:mod:`mldist.runtime.engines.mpi_wait`).
    """
    from mpi4py import MPI

    both = _signature(kind, arg, arrays)
    mpi_wait.wait(World.active.Iallreduce(MPI.IN_PLACE, both, MPI.MAX))  # where ranks wait for each other
    agreed = np.array_equal(both[:4], -both[4:8])
    World.joined = bool(both[8])
    if both[8]:  # a rank has joined (hvd.join): it answers all-reduces, nothing else
        return _with_joined(kind, arrays, agreed, int(-both[9]))
    if agreed:
        return True
    everyone = World.active.allgather(what())  # all ranks take this path together
    listed = "; ".join(f"rank {r}: {w}" for r, w in enumerate(everyone))
    line = (
        f"workers passed tensors of different shapes or dtypes to one collective ({listed}); "
        "every rank must run the same steps on same-shaped batches"
    )
    # Every rank raises alike, so a caller that catches it may go on; uncaught, it ends the rank in one line.
    if Deferred.note(line):
        return False  # an eager call raises it when its graph returns; skip the data collective
    raise CollectiveMismatch(line)


def _with_joined(kind: str, arrays: Sequence[np.ndarray[Any, Any]], agreed: bool, sender: int) -> bool:
    """With a rank joined: send an all-reduce's layout to it (True), or fail as Horovod does (raise/False)."""
    if agreed and _KINDS[kind] in mpi_join.REDUCE_CODES:
        mpi_join.layout(World.active, sender, arrays)
        return True
    line = (
        f"{kind} while a rank has joined (hvd.join): only all-reduces go on until every rank has joined"
        if agreed
        else "workers passed tensors of different shapes or dtypes to one collective while a rank has joined"
    )
    if Deferred.note(line):
        return False
    raise CollectiveMismatch(line)


def _describe(kind: str, arrays: Sequence[np.ndarray[Any, Any]]) -> Callable[[], str]:
    return lambda: f"{kind} of " + ", ".join(f"{a.dtype.name}[{a.size}]" for a in arrays)


#: The last collective op built in each TensorFlow 1 graph (see :func:`_after_previous`).
_LAST_IN_GRAPH: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _chain(tf: Any, op: Any) -> None:
    """In a TensorFlow 1 graph, run ``op`` after the collective built before it.

    ``tf.function`` already runs stateful ops in program order; a v1 graph (``Session.run``
    of many collectives at once) would run independent ones in any order, differently on
    each rank. Chaining them in build order gives every rank the same order.
    """
    if tf.executing_eagerly() or tf.inside_function():
        return
    graph = tf.compat.v1.get_default_graph()
    if (last := _LAST_IN_GRAPH.get(graph)) is not None:
        compat.run_after(op, last)
    _LAST_IN_GRAPH[graph] = op


#: The name of the missing variable whose read fails a TensorFlow 1 graph's collective (compat.failing_when).
_DISAGREED = "mldist: the ranks passed different shapes or dtypes to one collective (the line above names them)"


def _call(
    fns: list[Callable[..., list[np.ndarray[Any, Any]]]], groups: list[list[Any]], name: str, what: str
) -> list[list[Any]]:
    """One collective per group of tensors (``fns[i]`` on ``groups[i]``), through the progress thread: the results.

    Every group's start op reads only that group's tensors, and all start ops come before the first
    finish op: a group's collective starts as soon as its tensors exist.
    """
    import tensorflow as tf

    subset = subsets.active()
    v1_graph = not (tf.executing_eagerly() or tf.inside_function())
    runs = [watched(fn, what, None if subset is None else subset.comm) for fn in fns]
    if v1_graph:
        runs = [_deferring(run) for run in runs]
    # Autograph would otherwise convert the callbacks and run the converted code at every step.
    plain = tf.autograph.experimental.do_not_convert
    tokens = []
    for run, inputs in zip(runs, groups, strict=True):
        token = tf.numpy_function(
            plain(functools.partial(PROGRESS.start_with, run)), inputs, tf.int64, stateful=True, name="mpi_start"
        )
        _chain(tf, token.op)
        tokens.append(token)
    results = []
    for token, inputs in zip(tokens, groups, strict=True):
        out = tf.numpy_function(plain(PROGRESS.finish), [token], [t.dtype for t in inputs], stateful=True, name=name)
        outs = list(out) if isinstance(out, list | tuple) else [out]
        _chain(tf, outs[0].op)
        results.append(outs)
    if not v1_graph:
        return results
    # Ranks that disagreed: Horovod's FailedPreconditionError when the graph runs.
    flat = [t for outs in results for t in outs]
    with tf.control_dependencies(flat):
        flag = tf.numpy_function(_disagreed, [], tf.bool, stateful=True, name=f"{name}_agreed")
    checked = iter(compat.failing_when(flag, flat, _DISAGREED))
    return [[next(checked) for _ in outs] for outs in results]


def _deferring(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` with a mismatch kept for :func:`_disagreed` instead of raised (a ``numpy_function`` would turn
    it into ``InvalidArgumentError``)."""

    def deferred(*args: Any) -> Any:
        Deferred.active += 1
        try:
            return run(*args)
        finally:
            Deferred.active -= 1

    return deferred


def _disagreed() -> np.bool_:
    """After a TensorFlow 1 graph's collective: whether the ranks disagreed (the line said on stderr)."""
    found = Deferred.take()
    if found:
        print(f"mldist: error: {found}", file=sys.stderr, flush=True)
    return np.bool_(found is not None)


def _kind(op: str, t: Any) -> str:
    """The all-reduce kind of buffer ``t``: ``op``, or "sum_float16"/"sum_bfloat16" (their own MPI sum)."""
    name = t.dtype.name
    return f"sum_{name}" if op == "sum" and name in ("float16", "bfloat16") else op


def _wire(t: Any, kind: str = "") -> Any:
    """A dtype MPI can reduce: 16-bit floats as their bits for their own sum, else in float32; bool as int32."""
    import tensorflow as tf

    if kind.startswith("sum_"):
        return tf.bitcast(t, tf.uint16)

    if t.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(t, tf.float32)
    return tf.cast(t, tf.int32) if t.dtype == tf.bool else t


def _bits(t: Any) -> Any:
    """The same bytes in a dtype numpy and MPI carry (16-bit floats, bool)."""
    import tensorflow as tf

    if t.dtype == tf.bool:
        return tf.cast(t, tf.uint8)
    return tf.bitcast(t, tf.uint16) if t.dtype in (tf.float16, tf.bfloat16) else t


def _unbits(t: Any, dtype: Any) -> Any:
    import tensorflow as tf

    if dtype == tf.bool:
        return tf.not_equal(t, 0)
    return tf.bitcast(t, dtype) if dtype in (tf.float16, tf.bfloat16) else t


def _reduce_in_place(a: np.ndarray[Any, Any], mpi_op: Any) -> np.ndarray[Any, Any]:
    """The all-reduced ``a``, written into ``a`` itself when TensorFlow handed over writable memory.

    Returning (a view of) an input tensor's own memory costs TensorFlow no copy; a new
    array would be copied into a tensor (about 0.3 ms per 1.4 MB here).
    """
    from mpi4py import MPI

    send, out = (MPI.IN_PLACE, a) if a.flags.writeable and a.flags.c_contiguous else (a, _output(a.size, a.dtype))
    # Nonblocking, driven by polls that yield the core (each poll moves the transfer on): a blocking
    # MPI_Allreduce busy-polls a core that backprop needs. Loopback, 2 workers of 1 core, MobileNetV2,
    # 4 MB buckets, ms a step: quiet machine 196 against 187 blocking (271 against 264); with other jobs
    # on the cores 320 against 534. Sleeping polls left a real link idle (mpi_wait.drive). A joined rank
    # answers with the flat call (mpi_join.answer).
    mpi_tiers.allreduce(send, out, mpi_op, mpi_wait.drive)  # flat, or in tiers over nodes (mpi_world.arrange)
    return out


def allreduce(buffers: list[Any], op: str, layout: int = 0) -> list[Any]:
    """Reduce 1-D buffers element-wise across ranks ("sum", "max", "min" or "prod"), one MPI_Allreduce each.

    ``layout`` (the shapes flattened into them) is part of what the ranks must agree on.

    The buffers must be the call's own (:func:`mldist.runtime.collect.collectives.owned`): the result is
    written into them.
    """
    import tensorflow as tf

    def reducing(kind: str) -> Callable[..., list[np.ndarray[Any, Any]]]:
        def run(*arrays: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
            if not _agree(kind, layout, arrays, _describe(f"allreduce({op})", arrays)):
                return list(arrays)
            mpi_op = mpi_join.operations()[kind]
            return [_reduce_in_place(a, mpi_op) for a in arrays]

        return run

    kinds = [_kind(op, b) for b in buffers]
    groups = [[_wire(b, kind)] for b, kind in zip(buffers, kinds, strict=True)]  # one collective per bucket
    runs = [reducing(kind) for kind in kinds]
    reduced = [outs[0] for outs in _call(runs, groups, f"mpi_allreduce_{op}", f"allreduce({op})")]
    results = []
    for r, b, kind in zip(reduced, buffers, kinds, strict=True):
        r.set_shape(b.shape)
        if kind.startswith("sum_"):
            results.append(tf.bitcast(r, b.dtype))
        else:
            results.append(tf.not_equal(r, 0) if b.dtype == tf.bool else tf.cast(r, b.dtype))
    return results


def broadcast(buffers: list[Any], root: int, rank: int) -> list[Any]:
    """``root``'s 1-D buffers on every rank (raw bytes: exact for every dtype)."""

    def run(*arrays: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
        out = [_output(a.size, a.dtype) for a in arrays]
        if not _agree("broadcast", root, arrays, _describe(f"broadcast(root={root})", arrays)):
            return out
        for a, o in zip(arrays, out, strict=True):
            if rank == root:
                np.copyto(o, a)  # never hand TensorFlow back an alias of its own tensor
            mpi_wait.drive(World.active.Ibcast(o.view(np.uint8), root))  # (nonblocking: see drive)
        return out

    (received,) = _call([run], [[_bits(b) for b in buffers]], "mpi_broadcast", "broadcast")
    for r, b in zip(received, buffers, strict=True):
        r.set_shape(b.shape)
    return [_unbits(r, b.dtype) for r, b in zip(received, buffers, strict=True)]


def allgather(value: Any, size: int) -> Any:
    """Every rank's ``value`` concatenated on axis 0 in rank order; the first dimension may differ."""
    import tensorflow as tf
    from mpi4py import MPI

    dtype, inner = value.dtype, [int(d) for d in value.shape[1:]]

    def run(a: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
        # The row count may differ: agree on dtype and inner shape only.
        shape = zlib.crc32(np.array(inner, np.int64).tobytes())
        if not _agree("allgather", shape, [a[:0].reshape(-1)], lambda: f"allgather of {a.dtype.name}{list(a.shape)}"):
            return [np.array(a)]
        rows = each_ranks(World.active, a.shape[0], np.int64)
        row_bytes = int(np.prod(inner)) * a.itemsize
        out = _aligned(int(rows.sum()) * row_bytes, np.dtype(np.uint8))
        counts = rows * row_bytes
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        # Blocking: libnbc's all-gather is linear (mpi_world.each_ranks); every rank is here (the counts, above).
        World.active.Allgatherv(np.ascontiguousarray(a).view(np.uint8).reshape(-1), [out, counts, displs, MPI.BYTE])
        return [out.view(a.dtype).reshape(int(rows.sum()), *inner)]

    ((gathered,),) = _call([run], [[_bits(value)]], "mpi_allgather", "allgather")
    gathered.set_shape(tf.TensorShape([None, *inner]))
    return _unbits(gathered, dtype)


class MpiEngine:
    """The MPI engine behind the runtime's engine interface (:class:`mldist.runtime.engines.engine.Engine`)."""

    name = "mpi"
    in_place = True
    subgroups = True  # MPI sub-communicators
    joins = True
    xla_safe = False  # XLA cannot compile a numpy_function
    late_strategy = True  # tf.distribute code gets TensorFlow's own collectives beside MPI
    waits_at_exit = True  # MPI_Finalize
    gathers_aside = True  # MPI_Igather on a communicator of its own (mpi_world.World.aside)
    # The collectives, the abort and the join are this module's functions.
    allreduce = staticmethod(allreduce)
    broadcast = staticmethod(broadcast)
    allgather = staticmethod(allgather)
    abort = staticmethod(abort)
    join = staticmethod(join)
    aside = staticmethod(aside)

    def subgroup(self, key: int, ranks: tuple[int, ...]) -> subsets.Subset:
        """The ranks' MPI sub-communicator (collective: every rank of the world calls it)."""
        return subsets.split(world(), key, ranks)

    def start(self, tf: Any, placement: Placement) -> tuple[Any, tuple[str, ...]]:
        """Duplicate ``COMM_WORLD``; no strategy, no addresses (no TensorFlow server)."""
        start(one_node=placement.size if placement.size == placement.local_size else 0)
        return None, ()

    def watch_probe(self, tf: Any) -> tuple[None, tuple[str, ...]]:
        """No graph counters: this engine marks its collectives in its callbacks (:mod:`stall`)."""
        return None, ()


def engine(name: str) -> MpiEngine:
    """The engine object for :func:`mldist.runtime.engines.engine.get`."""
    return MpiEngine()
