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

from ..errors import ConfigError, RuntimeStateError
from ..placement import ClusterSpec, build_cluster_spec, detect, no_discovery
from ..placement.resources import ThreadPlan, choose_gpu, cpu_probe, openmp_defaults, proxy_settings, thread_plan
from . import failures

COMMUNICATIONS = ("auto", "ring", "nccl")


@dataclass(frozen=True)
class Context:
    """What ``init`` found and set for this process.

    Args:
        rank, size, local_rank, local_size: place in the job.
        launcher: detected launcher name.
        workers: ``host:port`` of every rank (empty with one worker).
        threads: the thread plan applied.
        gpu: index of the pinned GPU among those visible, or None.
        communication: "ring" or "nccl" with 2+ workers, else "none".
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

    @property
    def is_chief(self) -> bool:
        """True on rank 0, the rank that writes checkpoints and logs."""
        return self.rank == 0


_ctx: Context | None = None
_strategy: Any = None


def mpi_allgather_hosts(my_host: str) -> Sequence[str]:
    """Every rank's host name, gathered over MPI: for launchers that give ranks but no host list."""
    try:
        from mpi4py import MPI
    except ImportError:
        return no_discovery(my_host)  # raises, naming the fix
    return list(MPI.COMM_WORLD.allgather(my_host))


def _apply_threads(tf: Any, plan: ThreadPlan) -> None:
    try:
        tf.config.threading.set_intra_op_parallelism_threads(plan.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(plan.inter_op)
    except RuntimeError:
        warnings.warn(
            "mldist.init() came after TensorFlow started running ops; thread pools "
            "were left as they are. Call mldist.init() first.",
            stacklevel=3,
        )


def _pin_gpu(tf: Any, spec: ClusterSpec) -> int | None:
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


def init(communication: str | None = None) -> Context:
    """Detect the cluster, set threads, pin the GPU and start collectives.

    Idempotent: later calls return the first call's context.

    Args:
        communication: "auto" (NCCL on GPUs, RING on CPUs), "ring" or "nccl";
            default from ``MLDIST_COMMUNICATION`` or "auto".

    Example::

        ctx = init()
        if ctx.is_chief:
            print(f"training on {ctx.size} workers")
    """
    global _ctx, _strategy
    if _ctx is not None:
        return _ctx
    comm = (communication or os.environ.get("MLDIST_COMMUNICATION") or "auto").lower()
    if comm not in COMMUNICATIONS:
        raise ConfigError(f"communication={comm!r} is not one of {', '.join(COMMUNICATIONS)}")
    sys.excepthook = failures.one_line_errors
    spec = build_cluster_spec(detect(os.environ), os.environ, mpi_allgather_hosts)
    probe = cpu_probe()
    plan = thread_plan(os.environ, spec.local_size, probe)
    for key, value in openmp_defaults(plan, probe.pinned).items():
        os.environ.setdefault(key, value)
    hosts = sorted({w.rpartition(":")[0] for w in spec.workers})
    os.environ.update(proxy_settings(os.environ, hosts))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

    import tensorflow as tf

    _apply_threads(tf, plan)
    gpu = _pin_gpu(tf, spec)
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    strategy, used = None, "none"
    if spec.size > 1:
        from . import tf_engine

        strategy, used = tf_engine.start(tf, spec, comm, has_gpu)
    _strategy = strategy
    _ctx = Context(
        rank=spec.rank,
        size=spec.size,
        local_rank=spec.local_rank,
        local_size=spec.local_size,
        launcher=spec.launcher,
        workers=spec.workers if spec.size > 1 else (),
        threads=plan,
        gpu=gpu,
        communication=used,
    )
    return _ctx


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

    MultiWorkerMirrored for 2+ processes, Mirrored for one process with
    several GPUs, OneDevice for one GPU, the default strategy on CPU.

    Example::

        with mldist.strategy().scope():   # custom loops, legacy tf_keras
            model = build_model()
    """
    global _strategy
    init()
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
