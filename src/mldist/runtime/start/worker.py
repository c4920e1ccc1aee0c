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

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Mapping
from typing import Any, cast

from ...base import envvalues, processwide
from ...errors import ConfigError, MldistError, UnsupportedError
from ...placement import Placement, backend, build_cluster_spec, detect, engines
from ...placement.proxies import worker_no_proxy
from ...placement.resources import ThreadPlan, cpu_probe, idle_gpus_warning, openmp_defaults, thread_plan
from ..context import STATE, Context, Settings, context, current, is_chief, local_rank, local_size, rank, size
from ..engines import engine
from ..watch import leave, stall, watchdog
from . import patches, startup, tf_start

__all__ = [
    "Context",
    "context",
    "current",
    "init",
    "is_chief",
    "local_rank",
    "local_size",
    "rank",
    "size",
    "strategy",
    "warn_idle_gpus",
]


def _say(message: str, rank: int) -> None:
    if rank == 0:
        print(f"mldist: {message}", file=sys.stderr, flush=True)


def gather_here(
    placement: Placement,
    requested: str | None,
    has_gpu: bool,
    given: engines.Handed | None,
    env: Mapping[str, str] = os.environ,
    keras: str | None = None,
) -> engines.Facts:
    """The facts of this worker's decision (:func:`mldist.placement.engines.decide`), gathered once.

    Joins the MPI world first when the decision needs it (see ``needs_mpi_probe``). ``init``,
    ``mldist env`` and ``mldist doctor`` all gather through here.

    Args:
        placement: this worker's place in the job.
        requested: the user's engine setting, or None for ``MLDIST_COMMUNICATION``.
        has_gpu: whether the worker sees a GPU.
        given: the launcher's decision (:func:`mldist.placement.handed.handed_in`, decoded once), or None.
        env: the environment.
        keras: the Keras backend when Keras is already imported (it wins), else None (from ``env``).
    """
    return engines.gather(
        requested,
        env,
        rank=placement.rank,
        size=placement.size,
        launcher=placement.launcher,
        gpu=has_gpu,
        mpi=lambda: engine.probe_mpi(env),
        loaded_backend=keras,
        handed=given,
    )


def _decision(placement: Placement, comm: str, has_gpu: bool, keras: str) -> engines.Decision:
    """``init``'s decision, with the launcher's as ``init`` decoded it (:attr:`Settings.handed`)."""
    given = STATE.settings.handed if STATE.settings is not None else None
    return engines.decide(gather_here(placement, comm, has_gpu, given, keras=keras))


def _collectives(tf: Any, placement: Placement, decision: engines.Decision) -> tuple[Any, tuple[str, ...]]:
    """Start and watch the ``decision``'s engine of 2+ workers; (strategy, workers).

    ``tf`` is the tensorflow module, or None where the engine starts without it (see ``Engine.host``).
    """
    if placement.size == 1:
        return None, ()
    sent = STATE.settings.handed if STATE.settings is not None else None
    if line := engines.announcement(sent.decision.name if sent is not None else None, decision):
        _say(line, placement.rank)
    eng = engine.get(decision.name)
    strategy, workers = eng.start(tf, placement)
    STATE.engine = eng
    timeout = STATE.settings.collective_timeout if STATE.settings is not None else 0.0
    if timeout > 0:
        stall.start(placement.rank, eng.name, os.environ, *eng.watch_probe(tf), size=placement.size, timeout=timeout)
    patches.exit_codes()  # after the engine's own exit handler: atexit runs the last registered first
    return strategy, workers


def _check_soft_placement(value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigError(f"allow_soft_placement={value!r}: give True, False or None (leave TensorFlow's default)")


def _refuse_bad_values(env: Mapping[str, str]) -> Settings:
    """The contract's values, read once; end this worker with one line and exit 2 if a value of
    :data:`~mldist.base.envvalues.WORKER_SETTINGS` (or the launcher's decision) is bad.

    ``mldist run`` refuses such a value before it starts any worker; this is for workers started
    some other way (a bare ``mpirun`` or ``srun``). Rank 0 says its line at once. No group exists
    yet, so no rank can know that the others read the same value: the others wait
    :data:`OTHERS_WAIT` seconds first, by when a launcher has ended them for rank 0's exit (one line
    in all), and still say theirs where it has not (a value only some ranks were given).
    """
    try:
        envvalues.check(env)
        return Settings.read(env)  # with the launcher's decision, should a worker's environment have mangled it
    except ConfigError as exc:
        where: int | None = None
        with contextlib.suppress(MldistError):  # the rank, if the launcher's variables give one of 2+
            placement = detect(env)
            where = placement.rank if placement.size > 1 else None
        if where:
            time.sleep(OTHERS_WAIT)
        leave.tell(leave.error_line(str(exc), where))
        raise SystemExit(2) from None


#: Seconds a rank other than 0 waits before it says a bad value's line (see ``_refuse_bad_values``).
OTHERS_WAIT = 3.0


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
    if STATE.ctx is not None:
        return STATE.ctx
    comm = engines.requested_engine(communication, os.environ)
    soft = _check_soft_placement(allow_soft_placement)
    # A bad MLDIST_* value stops here, before any side effect; read once: the runtime takes them from here.
    STATE.settings = _refuse_bad_values(os.environ)
    patches.one_line_errors()
    keras = backend.check_supported(_keras_backend())
    leave.remember_stderr()
    watchdog.watch_launcher(os.environ)
    placement = detect(os.environ)
    probe = cpu_probe(os.environ)
    plan = thread_plan(
        os.environ, placement.local_size, probe, intra_op=intra_op, inter_op=inter_op, size=placement.size
    )
    for key, value in openmp_defaults(plan, probe.pinned).items():
        processwide.env_default("os.environ: OpenMP's threads", key, value)
    processwide.env_default("os.environ: TensorFlow's log level", "TF_CPP_MIN_LOG_LEVEL", "1")
    gpu, decision, workers = _join(keras, placement, comm, plan, soft)
    STATE.ctx = Context(
        rank=placement.rank,
        size=placement.size,
        local_rank=placement.local_rank,
        local_size=placement.local_size,
        launcher=placement.launcher,
        workers=workers,
        threads=plan,
        gpu=gpu,
        decision=decision,
        settings=STATE.settings,
    )
    return STATE.ctx


def _keras_backend() -> str:
    """The Keras backend: Keras's own answer once it is imported, else what it will read."""
    loaded = sys.modules.get("keras")
    config = getattr(loaded, "config", None)
    name = config.backend() if config is not None and hasattr(config, "backend") else None
    return backend.keras_backend(os.environ, backend.read_config(os.environ), loaded=name)


Started = tuple[int | None, engines.Decision, tuple[str, ...]]


def _start_tensorflow(placement: Placement, comm: str, plan: ThreadPlan, soft: bool | None) -> Started:
    """TensorFlow's threads and GPU, then the engine; (GPU, decision, workers)."""
    import tensorflow as tf

    patches.autograph_leaves_mldist()
    tf_start.apply_threads(tf, plan, soft)
    gpu = tf_start.pin_gpu(tf, placement)
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    decision = _decision(placement, comm, has_gpu, "tensorflow")
    STATE.strategy, workers = _collectives(tf, placement, decision)
    return gpu, decision, workers


def _start_tensorflow_if_used(placement: Placement, comm: str, plan: ThreadPlan, soft: bool | None) -> Started:
    """On Keras's TensorFlow backend: TensorFlow's start where the script uses it, else the engine without it.

    The script uses TensorFlow when it (or Keras) is imported by the time ``init`` runs, or where GPUs
    are listed; a numpy or mpi4py script under the MPI engine (or alone) never imports it. RING and
    NCCL are TensorFlow's own collectives: a decision for them starts TensorFlow as before.
    """
    if tf_start.uses_tensorflow(sys.modules, os.environ):
        return _start_tensorflow(placement, comm, plan, soft)
    decision = _decision(placement, comm, False, "tensorflow")
    if placement.size > 1 and engine.get(decision.name).host is None:
        return _start_tensorflow(placement, comm, plan, soft)
    tf_start.later(plan, soft)
    _, workers = _collectives(None, placement, decision)
    return None, decision, workers


def _start_jax(placement: Placement, comm: str, plan: ThreadPlan, soft: bool | None) -> Started:
    """JAX's threads, collectives and GPU, ``jax.distributed`` and Keras's distribution (2+ workers).

    TensorFlow may still run the input pipeline (``mldist.data``): it reads its pool sizes from
    the environment when it starts. ``allow_soft_placement`` is TensorFlow's and does not apply.
    """
    tf_start.pool_sizes(plan)
    from ..engines.jax_engine import JaxEngine, set_data_parallel

    eng = cast(JaxEngine, engine.get("jax"))
    gpu = eng.prepare(placement, plan, os.environ)
    decision = _decision(placement, comm, gpu is not None, "jax")
    _, workers = _collectives(None, placement, decision)
    if placement.size == 1:
        set_data_parallel(1)
    if eng.formed:  # not when the script formed JAX's group first: its own initialize() was that one
        patches.jax_initialize_once(placement.rank, placement.size)
    return gpu, decision, workers


#: How ``init`` starts a worker, by Keras backend (:data:`mldist.placement.backend.SUPPORTED`).
_STARTS = {"tensorflow": _start_tensorflow_if_used, "jax": _start_jax}


def _join(keras: str, placement: Placement, comm: str, plan: ThreadPlan, soft: bool | None) -> Started:
    """Start the worker on ``keras``'s backend (:data:`_STARTS`), its join marked first: MPI's and JAX's
    start-up wait for every rank, so a group that half formed ends there
    (:func:`mldist.runtime.start.startup.joining`)."""
    if placement.size > 1:
        startup.joining(os.environ, placement.rank)
    try:
        return _STARTS[keras](placement, comm, plan, soft)
    except BaseException:  # the script may catch the error and go on alone: no mark of a join left behind
        startup.not_joining(os.environ, placement.rank)
        raise


_warned_idle_gpus = False


def warn_idle_gpus() -> None:
    """Warn once when one process per node sees several GPUs and averages outside a strategy scope.

    ``DistributedOptimizer`` and ``DistributedGradientTape`` call it.
    """
    global _warned_idle_gpus
    ctx = init()
    if _warned_idle_gpus or ctx.decision.traits.averages_in_step:  # DataParallel uses every device it is given
        return
    import tensorflow as tf

    gpus = len(tf.config.list_logical_devices("GPU"))
    message = idle_gpus_warning(gpus, ctx.local_size, tf.distribute.has_strategy())
    if message:
        _warned_idle_gpus = True
        warnings.warn(message, stacklevel=3)


def strategy() -> Any:
    """The tf.distribute strategy that matches this process (calls ``init``).

    MultiWorkerMirrored for 2+ processes (with the MPI engine it starts
    TensorFlow's collectives too, for tf.distribute code), Mirrored for one process with
    several GPUs, OneDevice for one GPU, the default strategy on CPU.

    Example::

        with mldist.strategy().scope():   # custom loops, legacy tf_keras
            model = build_model()
    """
    ctx = init()
    if not ctx.decision.traits.runs_tensorflow:
        raise UnsupportedError(
            f"mldist.strategy() is TensorFlow's tf.distribute; on KERAS_BACKEND={ctx.backend} mldist.init() "
            "already set keras.distribution.DataParallel over every process: build the model without a scope"
        )
    if STATE.strategy is None and engine.running().late_strategy:
        STATE.strategy = _late_strategy()
    if STATE.strategy is None:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) > 1:
            STATE.strategy = tf.distribute.MirroredStrategy()
        elif len(gpus) == 1:
            STATE.strategy = tf.distribute.OneDeviceStrategy(gpus[0].name)
        else:
            STATE.strategy = tf.distribute.get_strategy()
    return STATE.strategy


def _late_strategy() -> Any:
    """MultiWorkerMirroredStrategy for tf.distribute code on a run whose own collectives use MPI.

    It starts TensorFlow's gRPC server (see docs/concepts/security.md); mldist's
    collectives keep using MPI. TensorFlow allows this only before it ran any op.
    """
    import tensorflow as tf

    from ..engines import tf_engine

    spec = build_cluster_spec(detect(os.environ), os.environ, engine.mpi_allgather_hosts)
    processwide.update_env("os.environ: no_proxy", worker_no_proxy(os.environ, spec.workers))
    try:
        return tf_engine.start(tf, spec, "ring", has_gpu=context().gpu is not None)[0]
    except RuntimeError as exc:
        raise ConfigError(
            f"mldist.strategy() came after TensorFlow started running ops ({str(exc).splitlines()[0]}); "
            "call it right after mldist.init(), or use mldist.keras.DistributedOptimizer instead"
        ) from None
