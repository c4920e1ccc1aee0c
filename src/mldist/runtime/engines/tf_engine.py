"""The TensorFlow collective engine: MultiWorkerMirroredStrategy's RING (CPU) or NCCL (GPU).

Every rank starts TensorFlow's gRPC server on its port from the cluster spec;
collectives run through the strategy's replica context. ``collectives``
fuses tensors into 1-D buffers and calls :func:`allreduce`, :func:`broadcast`
and :func:`allgather`, the interface every engine module has.

Example::

    strategy, used = start(tf, spec, "ring", has_gpu=False)
    eng = engine("ring"); eng.allreduce([buffer], "sum")
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ...base import processwide
from ...errors import ConfigError, LaunchError, RuntimeStateError
from ...placement import ClusterSpec, Placement, build_cluster_spec
from ...placement.proxies import worker_no_proxy
from .. import compat
from ..context import STATE
from .engine import WholeWorld, mpi_allgather_hosts

T = TypeVar("T")


def check_port_free(address: str) -> None:
    """Raise LaunchError naming the port if this rank cannot bind it.

    Example:
        >>> check_port_free("localhost:0")
    """
    _, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", int(port)))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise LaunchError(
                f"port {port} for this worker ({address}) cannot be bound ({why}); "
                "set MLDIST_PORT_BASE to another range or stop what holds it"
            ) from None


def start(tf: Any, spec: ClusterSpec, communication: str, has_gpu: bool) -> tuple[Any, str]:
    """Start TensorFlow's collective runtime for this rank; the strategy and "ring" or "nccl".

    Args:
        tf: the tensorflow module.
        spec: every rank's address.
        communication: "ring" or "nccl" (decided by :func:`mldist.placement.engines.decide`).
        has_gpu: whether this worker sees a GPU.
    """
    impl = tf.distribute.experimental.CommunicationImplementation
    if communication == "nccl" and not has_gpu:
        raise ConfigError("communication='nccl' needs a GPU on every worker; use 'ring' on CPUs")
    check_port_free(spec.address)
    processwide.set_env("os.environ: TF_CONFIG", "TF_CONFIG", spec.tf_config())
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=impl.NCCL if communication == "nccl" else impl.RING
    )
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if previous is not None:
        # TensorFlow's coordination service installs a SIGTERM handler that only logs, so a
        # worker would ignore scancel, `mldist run`'s forwarding and every launcher's stop
        # until SIGKILL. Put back what was there (mldist.preempt installs its own later).
        processwide.on_signal("signal: SIGTERM back from TensorFlow", signal.SIGTERM, previous)
    return strategy, communication


def start_for(tf: Any, placement: Placement, communication: str) -> tuple[Any, tuple[str, ...]]:
    """Find every rank's address (over MPI where the launcher gives none), keep proxies off them, start."""
    spec = build_cluster_spec(placement, os.environ, mpi_allgather_hosts)
    processwide.update_env("os.environ: no_proxy", worker_no_proxy(os.environ, spec.workers))
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    strategy, _ = start(tf, spec, communication, has_gpu)
    return strategy, spec.workers


def _strategy() -> Any:
    strategy = STATE.strategy
    if strategy is None:
        raise RuntimeStateError("TensorFlow's collectives were not started: call mldist.init() first")
    return strategy


def _widen(t: Any) -> tuple[Any, Any]:
    """``t`` in a dtype TensorFlow's collectives take (float16/32/64, int32/64), and the way back.

    Lossless: bfloat16 rides as float32, small integers and bool as int32, uint32 as int64,
    uint64 as its int64 bits (sums wrap the same way), complex as (real, imag) on a last axis.
    """
    import tensorflow as tf

    d = t.dtype
    if d in (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64):
        return t, lambda x: x
    if d.is_complex:
        parts = tf.stack([tf.math.real(t), tf.math.imag(t)], axis=-1)
        return parts, lambda x: tf.complex(x[..., 0], x[..., 1])
    if d == tf.uint64:
        return tf.bitcast(t, tf.int64), lambda x: tf.bitcast(x, tf.uint64)
    wide = tf.float32 if d == tf.bfloat16 else tf.int64 if d == tf.uint32 else tf.int32
    return tf.cast(t, wide), lambda x: tf.cast(x, d)


def _sum(buffers: list[Any]) -> list[Any]:
    """One SUM collective per buffer, in graph."""
    import tensorflow as tf

    wide = [_widen(b) for b in buffers]
    buffers = [w for w, _ in wide]
    strategy = _strategy()
    with tf.device(strategy.extended.worker_devices[0]):
        placed = [tf.identity(t) for t in buffers]
    sum_op = tf.distribute.ReduceOp.SUM

    def reduce_each(*values: Any) -> list[Any]:
        ctx = tf.distribute.get_replica_context()
        return [ctx.all_reduce(sum_op, v) for v in values]

    summed = strategy.run(reduce_each, args=tuple(placed))
    return [back(x) for x, (_, back) in zip(summed, wide, strict=True)]


def _gather_equal(tensor: Any) -> Any:
    """Every rank's ``tensor`` (same shape on all) concatenated on axis 0, in rank order."""
    import tensorflow as tf

    wide, back = _widen(tensor)
    strategy = _strategy()
    with tf.device(strategy.extended.worker_devices[0]):
        placed = tf.identity(wide)
    return back(strategy.run(lambda v: tf.distribute.get_replica_context().all_gather(v, axis=0), args=(placed,)))


#: What each index in the "which" counter names; appended while tracing.
WATCHED: list[str] = []
_counters: tuple[Any, ...] = ()  # collectives started, finished, the last started's index: CPU variables


def watch_probe(tf: Any) -> tuple[Callable[[], tuple[int, int, int]], list[str]]:
    """Make the stalled-collective watch's counters (after ``start``) and the function that reads them.

    Two variable updates per collective cost microseconds where host callbacks cost a Python call each.
    """
    global _counters
    with tf.device("/cpu:0"):
        _counters = tuple(tf.Variable(0, dtype=tf.int64, trainable=False, name=f"mldist_{n}") for n in _COUNTERS)

    def probe() -> tuple[int, int, int]:
        started, finished, which = (int(v.numpy()) for v in _counters)
        return started, finished, which

    return probe, WATCHED


_COUNTERS = ("collectives_started", "collectives_finished", "collective_last")


def _watched(what: str, fn: Callable[[list[Any]], T], inputs: list[Any]) -> T:
    """``fn(inputs)`` between counter updates that mark the collective in flight (:mod:`stall`).

    "started" is counted before any of ``inputs`` reaches the collective, "finished" once all
    of its outputs exist. Under XLA (``jit_compile``) variable updates become visible only at
    the end of the compiled step, so there (and with the watch off) the collective runs unmarked.
    """
    import tensorflow as tf

    if not _counters or compat.compiling_with_xla():
        return fn(inputs)
    started, finished, which = _counters
    if what not in WATCHED:
        WATCHED.append(what)
    with tf.device("/cpu:0"):
        begin = tf.group(started.assign_add(1), which.assign(WATCHED.index(what)))
    with tf.control_dependencies([begin]):
        inputs = [tf.identity(t) for t in inputs]
    out = fn(inputs)
    with tf.control_dependencies(tf.nest.flatten(out)), tf.device("/cpu:0"):
        finished.assign_add(1)  # stateful: runs without a consumer
    return out


def allreduce(buffers: list[Any], op: str, layout: int = 0) -> list[Any]:
    """Reduce 1-D buffers across ranks: "sum" is one collective each; "max"/"min"/"prod" gather then reduce."""
    import tensorflow as tf

    if op == "sum":
        return _watched("allreduce(sum)", _sum, buffers)
    reduce_fn = {"max": tf.reduce_max, "min": tf.reduce_min, "prod": tf.reduce_prod}[op]

    def gather_reduce(values: list[Any]) -> list[Any]:
        return [reduce_fn(tf.reshape(_gather_equal(b[tf.newaxis]), [-1, b.shape[0]]), axis=0) for b in values]

    return _watched(f"allreduce({op})", gather_reduce, buffers)


def broadcast(buffers: list[Any], root: int, rank: int) -> list[Any]:
    """``root``'s buffers on every rank: a sum to which only ``root`` contributes (exact for every dtype)."""
    import tensorflow as tf

    return _watched("broadcast", _sum, [v if rank == root else tf.zeros_like(v) for v in buffers])


def allgather(value: Any, size: int) -> Any:
    """Every rank's ``value`` concatenated on axis 0; the first dimension may differ (padded, then masked)."""
    return _watched("allgather", lambda values: _allgather(values[0], size), [value])


def _allgather(value: Any, size: int) -> Any:
    import tensorflow as tf

    n = tf.shape(value)[0]
    counts = _gather_equal(tf.reshape(n, [1]))
    longest = tf.maximum(tf.reduce_max(counts), 1)  # gathering empty tensors crashes TensorFlow's collective
    pad = [[0, longest - n]] + [[0, 0]] * (value.shape.rank - 1)
    rows = tf.reshape(_gather_equal(tf.pad(value, pad)), tf.concat([[size, longest], tf.shape(value)[1:]], 0))
    return tf.boolean_mask(rows, tf.sequence_mask(counts, longest))


class TfEngine(WholeWorld):
    """TensorFlow's engines behind the runtime's engine interface (:class:`mldist.runtime.engines.engine.Engine`)."""

    in_place = False  # TensorFlow's collectives return new tensors
    host = None  # its collectives are TensorFlow ops: numpy arrays go in as tensors
    late_strategy = False  # the strategy is the engine
    waits_at_exit = False
    # The collectives are this module's functions.
    allreduce = staticmethod(allreduce)
    broadcast = staticmethod(broadcast)
    allgather = staticmethod(allgather)
    watch_probe = staticmethod(watch_probe)

    def __init__(self, name: str) -> None:
        self.name = name
        #: XLA compiles NCCL's collectives (GPU); RING's CPU collectives it does not.
        self.xla_safe = name == "nccl"

    def start(self, tf: Any, placement: Placement) -> tuple[Any, tuple[str, ...]]:
        """See :func:`start_for`."""
        return start_for(tf, placement, self.name)

    def abort(self, code: int) -> None:
        """Nothing to abort: TensorFlow's peers notice a dead worker (about 10 s) or the launcher stops them."""


def engine(name: str) -> TfEngine:
    """The engine object for :func:`mldist.runtime.engines.engine.get`."""
    return TfEngine(name)
