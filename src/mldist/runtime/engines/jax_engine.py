"""The JAX backend's engine: ``jax.distributed`` from mldist's placement, and Keras's data parallelism.

JAX finds its peers by itself only under Slurm, Open MPI and (opt-in) mpi4py, and
assumes one process per GPU. mldist already knows every launcher it supports, so
``start`` hands JAX the coordinator (rank 0's address from the cluster spec), the
process count and this process's id, picks the CPU collectives on CPU-only workers (Gloo,
unless the user chose; Gloo's event loop moved out of the step's way, :mod:`.jax_cpu`)
and one GPU per local rank where there are several, and sets Keras's
``DataParallel`` distribution over every process's devices. Keras then averages the
gradients of the global batch inside its compiled step; nothing else needs to.

The host collectives (``allreduce``, ``broadcast``, ``allgather`` on numpy arrays) serve
mldist's callbacks, checkpoints and preemption. They move raw bytes, so 64-bit values
stay exact while JAX runs with 32-bit defaults, and agree on a signature first, so a
mismatch raises :class:`mldist.errors.CollectiveMismatch` on every rank instead of hanging.

Example::

    eng = get("jax")                                   # after mldist.init() with KERAS_BACKEND=jax
    total, = eng.allreduce([np.ones(3)], "sum")
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...base import envvalues, processwide
from ...errors import CollectiveMismatch, ConfigError, MldistError
from ...placement import Placement, build_cluster_spec
from ...placement.proxies import worker_no_proxy
from ...placement.resources import ThreadPlan, choose_gpu
from ..context import STATE
from ..watch import jax_watch, stall
from . import jax_cpu
from .engine import WholeWorld, mpi_allgather_hosts

#: JAX's CUDA plugins; without one JAX runs on CPUs only.
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12")
_REDUCE: dict[str, Any] = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}
#: ``jax.distributed.initialize``'s own timeouts (seconds): all ranks joining, a silent peer, the exit barrier.
JAX_TIMEOUTS = {"initialization_timeout": 300, "heartbeat_timeout_seconds": 100, "shutdown_timeout_seconds": 300}


def jax_timeouts(env: Mapping[str, str], limit: float | None = None) -> dict[str, int]:
    """JAX's three timeouts for a worker: ``MLDIST_COLLECTIVE_TIMEOUT`` (whole seconds, rounded up) where
    it is shorter than JAX's default, so that a rank that never joins, a peer that went silent and the
    exit barrier's wait for a dead rank end no later than a stalled collective is named.

    ``0`` (the watch off) or a bad value (``mldist run`` and ``mldist.init()`` refuse it in one line): JAX's.

    Args:
        env: where the start-up hook reads it, before ``init``.
        limit: the seconds ``init`` read once into the context's settings (then ``env`` is not read).

    Example:
        >>> jax_timeouts({"MLDIST_COLLECTIVE_TIMEOUT": "20.5"})["heartbeat_timeout_seconds"]
        21
        >>> jax_timeouts({"MLDIST_COLLECTIVE_TIMEOUT": "20.5"}, 0.0) == JAX_TIMEOUTS  # the context's value wins
        True
        >>> jax_timeouts({}) == JAX_TIMEOUTS  # the default, 600 s, is longer than JAX's
        True
    """
    if limit is None:  # the start-up hook's call, before init read the settings into the context
        try:
            limit = envvalues.COLLECTIVE_TIMEOUT.read(env)
        except MldistError:
            limit = 0
    if not limit:
        return dict(JAX_TIMEOUTS)
    return {name: min(default, max(1, math.ceil(limit))) for name, default in JAX_TIMEOUTS.items()}


def has_cuda_plugin() -> bool:
    """Whether JAX can use NVIDIA GPUs here (a CUDA plugin is installed)."""
    for name in CUDA_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:  # the parent package of a dotted name is missing
            continue
    return False


def visible_gpus(env: Mapping[str, str], listed: Sequence[str]) -> int:
    """How many GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else the driver's list.

    Args:
        env: the environment.
        listed: entries of ``/proc/driver/nvidia/gpus`` (one per GPU).

    Example:
        >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, ["a", "b", "c", "d"]), visible_gpus({}, ["a"])
        (2, 1)
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"])
    return len(listed)


def xla_flags(current: str, plan: ThreadPlan) -> str:
    """``XLA_FLAGS`` with XLA's CPU thread pool sized to the plan when it is one thread.

    XLA sizes its pool to the whole node; ranks sharing a node would each start that many.

    Example:
        >>> xla_flags("", ThreadPlan(1, 1, 1, "x"))
        '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'
        >>> xla_flags("--xla_dump_to=/tmp/x", ThreadPlan(4, 4, 2, "x"))
        '--xla_dump_to=/tmp/x'
    """
    if plan.intra_op != 1 or "multi_thread_eigen" in current:
        return current
    return " ".join(filter(None, [current, "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"]))


def _gpu_ids(placement: Placement, env: Mapping[str, str]) -> tuple[list[int] | None, int | None]:
    """(JAX's ``local_device_ids``, the pinned GPU) for this rank; (None, None) on CPUs."""
    if not has_cuda_plugin():
        return None, None
    try:
        listed = os.listdir("/proc/driver/nvidia/gpus")
    except OSError:
        listed = []
    count = visible_gpus(env, listed)
    if count == 0:
        return None, None
    chosen = None if placement.local_size == 1 else choose_gpu(count, placement.local_rank, placement.local_size)
    return ([chosen] if chosen is not None else None), chosen


class JaxEngine(WholeWorld):
    """JAX's distributed runtime behind mldist's engine interface (numpy buffers, host side)."""

    name = "jax"
    in_place = False
    xla_safe = True  # the training step's all-reduce is XLA's own
    late_strategy = False
    waits_at_exit = True  # jax.distributed's shutdown barrier
    gathers_aside = True  # through its coordination service's keys (straggler_gather.KvAside)
    _device_ids: list[int] | None = None
    #: JAX's CPU collectives ("gloo", a user's choice) or "" on GPUs; Gloo loop threads moved to SCHED_IDLE.
    cpu_collectives = ""
    idled: tuple[int, ...] = ()
    #: Whether ``start`` formed JAX's group (False when the script formed it first: ``adopt``).
    formed = False

    @property
    def host(self) -> JaxEngine:
        """Itself: its collectives take and give numpy arrays."""
        return self

    def prepare(self, placement: Placement, plan: ThreadPlan, env: Mapping[str, str]) -> int | None:
        """Before JAX starts: thread and collective settings; the pinned GPU (or None)."""
        processwide.set_env("os.environ: XLA_FLAGS", "XLA_FLAGS", xla_flags(os.environ.get("XLA_FLAGS", ""), plan))
        ids, gpu = _gpu_ids(placement, env)
        self._device_ids = ids
        import jax

        if gpu is None:
            self.cpu_collectives = jax_cpu.implementation(env)
            jax.config.update("jax_cpu_collectives_implementation", self.cpu_collectives)  # type: ignore[no-untyped-call]
        # JAX's preemption service catches SIGTERM and does nothing with it: mldist.preempt
        # (save, then exit 75) or the default (end now) must see it.
        jax.config.update("jax_enable_preemption_service", False)  # type: ignore[no-untyped-call]
        return gpu

    def start(self, tf: Any, placement: Placement) -> tuple[None, tuple[str, ...]]:
        """Join the other processes (rank 0's address coordinates) and set Keras's distribution.

        ``tf`` is unused (the interface's). Returns no strategy and every rank's address.
        """
        import jax

        spec = build_cluster_spec(placement, os.environ, mpi_allgather_hosts)
        if jax.distributed.is_initialized():  # keras.distribution.initialize() came first: that group
            adopt(jax.process_index(), jax.process_count(), spec.rank, spec.size)
        else:
            # JAX's coordinator speaks gRPC, which would send it to a site's HTTP proxy.
            processwide.update_env("os.environ: no_proxy", worker_no_proxy(os.environ, spec.workers))
            settings = STATE.settings  # read once by init
            limits = jax_timeouts(os.environ, settings.collective_timeout if settings is not None else None)
            jax.distributed.initialize(
                coordinator_address=spec.workers[0],
                num_processes=spec.size,
                process_id=spec.rank,
                local_device_ids=self._device_ids,
                # Rank 0's coordinator listens on the address mldist chose for it, not on every interface
                # (JAX's default is [::]:port); its gRPC has no authentication.
                coordinator_bind_address=spec.workers[0] if spec.rank == 0 else None,
                initialization_timeout=limits["initialization_timeout"],
                heartbeat_timeout_seconds=limits["heartbeat_timeout_seconds"],
                shutdown_timeout_seconds=limits["shutdown_timeout_seconds"],
            )
            self.formed = True  # mldist.runtime.start.patches makes a later initialize() for this world do nothing
        set_data_parallel(spec.size)  # JAX's backend starts here, and Gloo's event loop with it
        stall.sample_with(jax_watch.Waits())  # every computation across processes is watched, not only fit's
        self._idle_event_loop(spec.rank)
        self._seed_alike(spec.rank)
        return None, spec.workers

    def _idle_event_loop(self, rank: int) -> None:
        """Gloo's event loop to SCHED_IDLE (see :mod:`mldist.runtime.engines.jax_cpu`); one line if it is not found."""
        if not jax_cpu.wants_idle_loop(self.cpu_collectives, os.environ):
            return
        self.idled = tuple(jax_cpu.idle_event_loops())
        if not self.idled and rank == 0:
            print(
                "mldist: Gloo's event-loop thread was not found; on a rank with one core each all-reduce of "
                f"JAX's step may wait a scheduler tick (~4 ms). {jax_cpu.IDLE_ENV}=0 silences this line",
                file=sys.stderr,
                flush=True,
            )

    def _seed_alike(self, rank: int) -> None:
        """One random seed, rank 0's, on every rank: Keras's DataParallel needs equal initial weights.

        Unseeded Keras initializers draw from Python's ``random``, which differs per process;
        a script that seeds alike itself afterwards keeps its own seed.
        """
        import random

        import keras

        mine = np.array([random.SystemRandom().randrange(1, 2**31 - 1)], np.int64)
        keras.utils.set_random_seed(int(self.broadcast([mine], 0, rank)[0][0]))

    # -- host collectives (numpy in, numpy out) ------------------------------------------------

    def _agree(self, what: str, arrays: Sequence[np.ndarray], root: int | None = None) -> np.ndarray:
        """Every rank's (byte count, signature); raises on every rank when they differ."""
        from jax.experimental import multihost_utils

        layout = repr([(a.shape[1:] if what == "allgather" else a.shape, a.dtype.str) for a in arrays])
        sig = zlib.crc32(f"{what}:{root}:{layout}".encode()) & 0x7FFFFFFF
        nbytes = sum(a.nbytes for a in arrays)
        seen = np.asarray(multihost_utils.process_allgather(np.array([nbytes, sig], np.int32)))
        differ = [r for r in range(len(seen)) if seen[r][1] != seen[0][1]]
        if what != "allgather":
            differ += [r for r in range(len(seen)) if seen[r][0] != seen[0][0] and r not in differ]
        if differ:
            ranks = ", ".join(map(str, sorted(differ)))
            raise CollectiveMismatch(
                f"{what}: rank(s) {ranks} passed other shapes, dtypes or roots than rank 0 "
                f"({layout} here); call collectives with the same arguments on every rank"
            )
        return seen

    def _gather_bytes(self, data: np.ndarray, width: int) -> np.ndarray:
        from jax.experimental import multihost_utils

        padded = np.zeros(width, np.uint8)
        padded[: data.size] = data
        return np.asarray(multihost_utils.process_allgather(padded))

    def allreduce(self, buffers: list[Any], op: str, layout: int = 0) -> list[Any]:
        """Element-wise "sum", "max", "min" or "prod" of each numpy array over the ranks."""
        arrays = [np.asarray(b, order="C") for b in buffers]
        token = stall.begin("allreduce")
        try:
            self._agree("allreduce", arrays)
            data = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays]) if arrays else np.zeros(0, np.uint8)
            rows = self._gather_bytes(data, data.size)
        finally:
            stall.end(token)
        out, offset = [], 0
        for a in arrays:
            parts = rows[:, offset : offset + a.nbytes].copy().view(a.dtype).reshape(len(rows), *a.shape)
            out.append(_REDUCE[op](parts, axis=0).astype(a.dtype))
            offset += a.nbytes
        return out

    def broadcast(self, buffers: list[Any], root: int, rank: int) -> list[Any]:
        """``root``'s numpy arrays on every rank."""
        from jax.experimental import multihost_utils

        arrays = [np.asarray(b, order="C") for b in buffers]
        token = stall.begin("broadcast")
        try:
            self._agree("broadcast", arrays, root)
            data = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays]) if arrays else np.zeros(0, np.uint8)
            got = np.asarray(multihost_utils.broadcast_one_to_all(data, is_source=rank == root))
        finally:
            stall.end(token)
        out, offset = [], 0
        for a in arrays:
            out.append(got[offset : offset + a.nbytes].copy().view(a.dtype).reshape(a.shape))
            offset += a.nbytes
        return out

    def allgather(self, value: Any, size: int) -> Any:
        """Every rank's numpy array concatenated on axis 0 (the first dimension may differ)."""
        array = np.asarray(value, order="C")
        token = stall.begin("allgather")
        try:
            seen = self._agree("allgather", [array])
            rows = self._gather_bytes(array.reshape(-1).view(np.uint8), int(seen[:, 0].max()))
        finally:
            stall.end(token)
        row = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
        parts = [rows[r, : seen[r][0]].copy().view(array.dtype).reshape(-1, *array.shape[1:]) for r in range(size)]
        return np.concatenate(parts, axis=0) if row else np.zeros((0, *array.shape[1:]), array.dtype)

    def abort(self, code: int) -> None:
        """JAX has no job-wide abort: the launcher ends the others when this process exits."""

    def watch_probe(self, tf: Any) -> tuple[None, Sequence[str]]:
        """No graph counters: the host collectives and StallWatch mark in Python."""
        return None, ()

    def aside(self, rank: int, size: int) -> Any:
        """The slow-rank rounds through ``jax.distributed``'s coordination service (its key-value store)."""
        from jax._src import distributed

        from ..watch.straggler_gather import KvAside

        return KvAside(distributed.global_state.client, rank, size)


def adopt(index: int, count: int, rank: int, size: int) -> None:
    """Take the JAX group a script formed before ``mldist.init()`` when it is this world; else raise.

    Example:
        >>> adopt(1, 2, 1, 2)
        >>> adopt(0, 1, 1, 2)
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: JAX's group was formed before mldist.init() as process 0 of 1, but this ...
    """
    if (index, count) != (rank, size):
        raise ConfigError(
            f"JAX's group was formed before mldist.init() as process {index} of {count}, but this worker is "
            f"rank {rank} of {size}; let mldist.init() form it (call it first), or give "
            "jax.distributed.initialize() this launcher's world"
        )


def joined(initialize: Callable[..., None], rank: int, size: int) -> Callable[..., None]:
    """``jax.distributed.initialize`` once mldist formed the group: a call for this world does nothing
    (:mod:`mldist.runtime.start.patches` installs it).

    Scripts written for Keras call ``keras.distribution.initialize()``, which calls JAX's, which
    allows one call per process. After ``mldist.init()`` that call finds its group formed; one
    that names another world still fails, with both worlds named.

    Example:
        >>> again = joined(lambda **kw: None, 1, 2)
        >>> again(num_processes=2, process_id=1)
        >>> again(num_processes=4, process_id=1)
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: jax.distributed.initialize(num_processes=4, process_id=1) after mldist.init() ...
    """

    def initialize_once(*args: Any, **kwargs: Any) -> None:
        asked = kwargs.get("num_processes", args[1] if len(args) > 1 else None)
        me = kwargs.get("process_id", args[2] if len(args) > 2 else None)
        if (asked is not None and int(asked) != size) or (me is not None and int(me) != rank):
            raise ConfigError(
                f"jax.distributed.initialize(num_processes={asked}, process_id={me}) after mldist.init() formed "
                f"the group as rank {rank} of {size}; call it with this launcher's world, or not at all"
            )

    initialize_once.__wrapped__ = initialize  # type: ignore[attr-defined]
    initialize_once.__doc__ = initialize.__doc__
    return initialize_once


def set_data_parallel(processes: int) -> None:
    """Keras's ``DataParallel`` over every process's devices, each process feeding its own part.

    ``auto_shard_dataset=False``: mldist shards the input itself (``mldist.data.shard``), and
    Keras refuses numpy input in multi-process mode otherwise.
    """
    import keras

    devices = keras.distribution.list_devices()
    if processes > 1 or len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False))


def engine(name: str) -> JaxEngine:
    """The engine instance (see :func:`mldist.runtime.engines.engine.get`)."""
    return JaxEngine()
