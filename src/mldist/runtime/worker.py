"""The worker runtime: ``mldist.init()`` and the process-wide context.

``init`` is the one place with side effects on the worker: it sets thread
pools and OpenMP variables, pins the GPU, keeps proxies away from gRPC and
starts TensorFlow's collective runtime (only when there are 2+ workers:
a 1-worker collective runtime costs throughput for nothing).

Example::

    import mldist
    ctx = mldist.init()
    print(ctx.rank, ctx.size, ctx.is_chief)   # "0 1 True" for a plain process
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, DetectionError, RuntimeStateError
from ..placement import ClusterSpec, Placement, build_cluster_spec, detect, no_discovery
from ..placement.resources import (
    ThreadPlan,
    choose_gpu,
    cpu_probe,
    idle_gpus_warning,
    openmp_defaults,
    proxy_settings,
    thread_plan,
)
from . import compat, engine, failures, stall, watchdog


@dataclass(frozen=True)
class Context:
    """What ``init`` found and set for this process.

    Args:
        rank, size, local_rank, local_size: place in the job.
        launcher: detected launcher name.
        workers: ``host:port`` of every rank (empty with one worker).
        threads: the thread plan applied.
        gpu: index of the pinned GPU among those visible, or None.
        communication: the engine of 2+ workers ("mpi", "ring" or "nccl"), else "none".
        mpi_library: the MPI library's version line when the engine is "mpi", else "".
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str
    workers: tuple[str, ...]
    threads: ThreadPlan
    gpu: int | None
    communication: str
    mpi_library: str = ""

    @property
    def is_chief(self) -> bool:
        """True on rank 0, the rank that writes checkpoints and logs."""
        return self.rank == 0


_ctx: Context | None = None
_strategy: Any = None
_spec: ClusterSpec | None = None  # kept for a strategy started later (MPI engine + mldist.strategy())


def mpi_allgather_hosts(my_host: str) -> Sequence[str]:
    """Every rank's host name, gathered over MPI: for launchers that give ranks but no host list.

    Raises DetectionError naming both views and the fix when mpi4py's world is not the
    launcher's (a PyPI MPI under aprun or srun sees a world of one process per rank).
    """
    try:
        from mpi4py import MPI
    except ImportError:
        return no_discovery(my_host)  # raises, naming the fix
    world = MPI.COMM_WORLD
    placement = detect(os.environ)
    mpi = engine.MpiWorld(world.Get_rank(), world.Get_size(), MPI.Get_library_version().splitlines()[0].strip())
    if problem := engine.mpi_problem(placement.rank, placement.size, placement.launcher, mpi):
        raise DetectionError(
            f"cannot find the other workers' hosts over MPI: {problem}; "
            "or set MLDIST_WORKERS=host:port,... (every rank's address) in every rank"
        )
    return list(world.allgather(my_host))


def _apply_threads(tf: Any, plan: ThreadPlan, soft_placement: bool | None) -> None:
    try:
        tf.config.threading.set_intra_op_parallelism_threads(plan.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(plan.inter_op)
        if soft_placement is not None:  # the guides' ConfigProto(allow_soft_placement=True)
            tf.config.set_soft_device_placement(soft_placement)
    except RuntimeError:
        warnings.warn(
            "mldist.init() came after TensorFlow started running ops; thread pools "
            "were left as they are. Call mldist.init() first.",
            stacklevel=3,
        )


def _pin_gpu(tf: Any, spec: Placement) -> int | None:
    gpus = tf.config.list_physical_devices("GPU")
    # One process per node keeps all its GPUs (MirroredStrategy uses them).
    keep_all = spec.local_size == 1 and len(gpus) > 1
    chosen = None if keep_all else choose_gpu(len(gpus), spec.local_rank, spec.local_size)
    try:
        if chosen is not None:
            tf.config.set_visible_devices([gpus[chosen]], "GPU")
        for gpu in [gpus[chosen]] if chosen is not None else gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        warnings.warn(
            "mldist.init() came after TensorFlow initialised its GPUs; every GPU stays "
            "visible. Call mldist.init() before building models.",
            stacklevel=3,
        )
    return chosen


def _say(message: str, rank: int) -> None:
    if rank == 0:
        print(f"mldist: {message}", file=sys.stderr, flush=True)


#: What starting an engine gives: the strategy (or None), the engine's name, worker addresses, MPI library.
Started = tuple[Any, str, tuple[str, ...], str]


def _start_engine(tf: Any, placement: Placement, requested: str, has_gpu: bool) -> Started:
    """Choose and start the collective engine for 2+ workers."""
    mpi = engine.probe_mpi(os.environ) if requested in ("auto", "mpi") and not has_gpu else None
    choice = engine.choose(requested, placement.rank, placement.size, placement.launcher, has_gpu, mpi)
    if choice.reason:
        _say(f"using TensorFlow's RING collectives, not MPI: {choice.reason}", placement.rank)
    if choice.name == "mpi":
        assert isinstance(mpi, engine.MpiWorld)
        engine.module("mpi").start()
        return None, "mpi", (), mpi.library
    global _spec
    _spec = spec = build_cluster_spec(placement, os.environ, mpi_allgather_hosts)
    os.environ.update(proxy_settings(os.environ, sorted({w.rpartition(":")[0] for w in spec.workers})))
    strategy, used = engine.module(choice.name).start(tf, spec, choice.name, has_gpu)
    return strategy, used, spec.workers, ""


def _collectives(tf: Any, placement: Placement, comm: str, has_gpu: bool) -> Started:
    """The engine of 2+ workers, its collectives watched for stalls (:mod:`stall`); none for one."""
    if placement.size == 1:
        return None, "none", (), ""
    started = _start_engine(tf, placement, comm, has_gpu)
    if stall.collective_timeout(os.environ) > 0:
        stall.start(placement.rank, started[1], os.environ, *engine.module(started[1]).watch_probe(tf))
    return started


def _communication(requested: str | None) -> str:
    comm = (requested or os.environ.get("MLDIST_COMMUNICATION") or "auto").lower()
    if comm not in engine.COMMUNICATIONS:
        raise ConfigError(f"communication={comm!r} is not one of {', '.join(engine.COMMUNICATIONS)}")
    return comm


def _check_soft_placement(value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigError(f"allow_soft_placement={value!r}: give True, False or None (leave TensorFlow's default)")


def init(
    communication: str | None = None,
    *,
    inter_op: int | None = None,
    intra_op: int | None = None,
    allow_soft_placement: bool | None = None,
) -> Context:
    """Detect the cluster, set threads, pin the GPU and start collectives.

    Idempotent: later calls return the first call's context (their arguments are ignored).

    Args:
        communication: "auto" (NCCL on GPUs, MPI on CPUs under an MPI launcher, else RING),
            "mpi", "ring" or "nccl"; default from ``MLDIST_COMMUNICATION`` or "auto".
        inter_op, intra_op: TensorFlow's thread pool sizes; default from ``MLDIST_INTER_OP``/
            ``MLDIST_INTRA_OP``, else the plan from the CPUs this rank owns.
        allow_soft_placement: True lets ops without a kernel for the chosen device run on the
            CPU (``tf.config.set_soft_device_placement``); None leaves TensorFlow's default.

    Example::

        ctx = init(intra_op=8, inter_op=2)
        if ctx.is_chief:
            print(f"training on {ctx.size} workers")
    """
    global _ctx, _strategy
    if _ctx is not None:
        return _ctx
    comm = _communication(communication)
    soft = _check_soft_placement(allow_soft_placement)
    stall.collective_timeout(os.environ)  # a bad MLDIST_COLLECTIVE_TIMEOUT stops here, before any side effect
    sys.excepthook = failures.one_line_errors
    watchdog.watch_launcher(os.environ)
    placement = detect(os.environ)
    probe = cpu_probe()
    plan = thread_plan(os.environ, placement.local_size, probe, intra_op=intra_op, inter_op=inter_op)
    for key, value in openmp_defaults(plan, probe.pinned).items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

    import tensorflow as tf

    compat.never_convert("mldist")
    _apply_threads(tf, plan, soft)
    gpu = _pin_gpu(tf, placement)
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    _strategy, used, workers, library = _collectives(tf, placement, comm, has_gpu)
    _ctx = Context(
        rank=placement.rank,
        size=placement.size,
        local_rank=placement.local_rank,
        local_size=placement.local_size,
        launcher=placement.launcher,
        workers=workers,
        threads=plan,
        gpu=gpu,
        communication=used,
        mpi_library=library,
    )
    return _ctx


_warned_idle_gpus = False


def warn_idle_gpus() -> None:
    """Warn once when one process per node sees several GPUs and averages outside a strategy scope.

    ``DistributedOptimizer`` and ``DistributedGradientTape`` call it.
    """
    global _warned_idle_gpus
    ctx = init()
    if _warned_idle_gpus:
        return
    import tensorflow as tf

    gpus = len(tf.config.list_logical_devices("GPU"))
    message = idle_gpus_warning(gpus, ctx.local_size, tf.distribute.has_strategy())
    if message:
        _warned_idle_gpus = True
        warnings.warn(message, stacklevel=3)


def current() -> Context | None:
    """The context of ``init``, or None before it ran (for messages that name the rank)."""
    return _ctx


def context() -> Context:
    """The context of ``init``; raises if ``init`` has not run."""
    if _ctx is None:
        raise RuntimeStateError("mldist is not initialised: call mldist.init() first")
    return _ctx


def strategy() -> Any:
    """The tf.distribute strategy that matches this process (calls ``init``).

    MultiWorkerMirrored for 2+ processes (with the MPI engine it starts
    TensorFlow's collectives too, for tf.distribute code), Mirrored for one process with
    several GPUs, OneDevice for one GPU, the default strategy on CPU.

    Example::

        with mldist.strategy().scope():   # custom loops, legacy tf_keras
            model = build_model()
    """
    global _strategy
    ctx = init()
    if _strategy is None and ctx.communication == "mpi":
        _strategy = _late_strategy()
    if _strategy is None:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) > 1:
            _strategy = tf.distribute.MirroredStrategy()
        elif len(gpus) == 1:
            _strategy = tf.distribute.OneDeviceStrategy(gpus[0].name)
        else:
            _strategy = tf.distribute.get_strategy()
    return _strategy


def _late_strategy() -> Any:
    """MultiWorkerMirroredStrategy for tf.distribute code on a run whose own collectives use MPI.

    It starts TensorFlow's gRPC server (see the README's Security section); mldist's
    collectives keep using MPI. TensorFlow allows this only before it ran any op.
    """
    import tensorflow as tf

    global _spec
    ctx = context()
    _spec = _spec or build_cluster_spec(detect(os.environ), os.environ, mpi_allgather_hosts)
    os.environ.update(proxy_settings(os.environ, sorted({w.rpartition(":")[0] for w in _spec.workers})))
    from . import tf_engine

    try:
        return tf_engine.start(tf, _spec, "ring", has_gpu=ctx.gpu is not None)[0]
    except RuntimeError as exc:
        raise ConfigError(
            f"mldist.strategy() came after TensorFlow started running ops ({str(exc).splitlines()[0]}); "
            "call it right after mldist.init(), or use mldist.keras.DistributedOptimizer instead"
        ) from None


def rank() -> int:
    """Global rank of this process (after ``init``)."""
    return context().rank


def size() -> int:
    """Number of worker processes (after ``init``)."""
    return context().size


def local_rank() -> int:
    """Rank of this process on its node (after ``init``)."""
    return context().local_rank


def local_size() -> int:
    """Number of worker processes on this node (after ``init``)."""
    return context().local_size


def is_chief() -> bool:
    """True on rank 0 (after ``init``)."""
    return context().is_chief
