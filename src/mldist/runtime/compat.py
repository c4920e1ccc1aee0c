"""Every private TensorFlow/Keras/JAX/CPython access mldist needs, in one place.

A TensorFlow, Keras, JAX or Python upgrade that renames one of these breaks here, and
only here. Each function says what it reaches into and why there is no
public way. What mldist replaces process-wide is listed in :mod:`mldist.runtime.start.patches`.

Example::

    if compiling_with_xla():
        raise ConfigError("...")
"""

from __future__ import annotations

import sys
from typing import Any


def compiling_with_xla() -> bool:
    """Whether the graph being traced right now is compiled by XLA (``jit_compile=True``).

    TensorFlow has no public query; ``control_flow_util`` is what its own ops use.
    False in eager mode.
    """
    import tensorflow as tf

    if tf.executing_eagerly():
        return False
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def learning_rate_is_schedule(optimizer: Any) -> bool:
    """Whether a Keras optimizer's rate is a schedule (its public ``learning_rate`` hides that)."""
    import keras

    return isinstance(getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule)


def set_initial_epoch(model: Any, epoch: int | None) -> None:
    """Make the next ``fit`` start at ``epoch`` (None: as asked), as Keras's BackupAndRestore does."""
    model._initial_epoch = epoch


#: Modules of tf_keras (Keras 2) optimizer classes, as opposed to Keras 3 ones.
LEGACY_OPTIMIZER_MODULES = ("tf_keras", "keras.src.optimizers.legacy", "tensorflow")


def is_legacy_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a tf_keras (Keras 2) one rather than a Keras 3 one, by its module."""
    return legacy_optimizer_class(type(optimizer))


def legacy_optimizer_class(cls: type) -> bool:
    """Whether ``cls`` is a tf_keras (Keras 2) optimizer class: its own or a base class's module says so
    (a user's subclass of ``tf.keras.optimizers.Optimizer`` lives in the user's module)."""
    for base in cls.__mro__:  # the nearest class of a Keras package decides (Keras 3's bases reach TF's trackables)
        if base.__module__.startswith(LEGACY_OPTIMIZER_MODULES):
            return True
        if base.__module__.startswith("keras"):
            return False
    return False


def no_tape_recording() -> Any:
    """A context in which no active ``tf.GradientTape`` records (``tape.stop_recording`` without the tape).

    Calling a ``tf.function`` that runs MultiWorkerMirroredStrategy collectives while a tape
    records fails ("Mismatching tf.distribute.Strategy objects"); the collectives have no
    gradient of their own anyway (``mldist.horovod`` attaches one). TensorFlow has no public
    way to pause every tape.
    """
    from tensorflow.python.eager import record

    return record.stop_recording()


def never_convert(package: str) -> None:
    """Make autograph leave ``package``'s functions as written inside ``tf.function`` (idempotent).

    Autograph would otherwise rewrite mldist's collectives when a user's ``tf.function``
    calls them, re-reading their source from disk at trace time (an upgrade mid-run then
    traces the wrong function). Keras and TensorFlow sit on the same list; there is no
    public way to add a package to it.
    """
    from tensorflow.python.autograph.core import config

    if not any(getattr(rule, "_prefix", None) == package for rule in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (config.DoNotConvert(package), *config.CONVERSION_RULES)


def read_xspace(path: Any) -> Any:
    """A profile's XSpace (``*.xplane.pb``, what ``tf.profiler`` writes), parsed.

    TensorFlow ships the message class but no public reader; TensorBoard's profile plugin,
    the public converter, is a heavy extra dependency for reading one protobuf.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as fh:
        space.ParseFromString(fh.read())
    return space


def run_after(op: Any, previous: Any) -> None:
    """Make ``op`` run after ``previous`` (a control edge) in a TensorFlow 1 graph.

    ``tf.control_dependencies`` would also mark ``previous`` with an attribute, which
    TensorFlow warns about once a session has run it.
    """
    op._add_control_input(previous)


def build_optimizer(optimizer: Any, variables: list[Any]) -> None:
    """Make an optimizer's slots for ``variables`` now (Keras 3, tf_keras, tf_keras's legacy optimizers)."""
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras's legacy optimizers
        optimizer._create_all_weights(variables)
    elif hasattr(optimizer, "build"):
        optimizer.build(variables)


def failing_when(flag: Any, outputs: list[Any], text: str) -> list[Any]:
    """``outputs`` of a TensorFlow 1 graph, whose evaluation raises ``FailedPreconditionError`` where
    ``flag`` (a boolean tensor computed after them) is true.

    Horovod's collectives raise that type when ranks disagree, in graphs too. A ``py_function``
    turns every Python exception into ``InvalidArgumentError`` or ``UnknownError``, and no public op
    fails with a chosen code and text; reading a resource variable that does not exist fails with
    ``FailedPreconditionError``, so the variable's name carries ``text``.
    """
    import tensorflow as tf

    def fail() -> Any:
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name=text)
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)

    gate = tf.cond(flag, fail, lambda: tf.constant(0.0))
    with tf.control_dependencies([gate]):
        return [tf.identity(o) for o in outputs]


def jax_formed_group() -> bool:
    """Whether ``jax.distributed`` formed a group of 2+ in this process (read only if JAX is imported).

    JAX's public ``process_count()`` would start a backend (at exit, too); its private global state
    keeps the coordinator's address and the process count, even after JAX's own shutdown at exit.
    """
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    return bool(getattr(state, "coordinator_address", None)) and (getattr(state, "num_processes", None) or 0) > 1


def add_jax_cluster(name: str, finder: Any) -> str:
    """Make ``finder`` JAX's first cluster detector: ``jax.distributed.initialize()`` with no arguments
    then asks it first. "" when done; else one line saying what moved (nothing is registered).

    JAX registers a detector by subclassing its private ``jax._src.clusters.ClusterEnv`` (the
    subclass joins ``ClusterEnv._cluster_types``, tried in order); there is no public way.

    Args:
        name: the detector's name (``cluster_detection_method=name`` picks it alone).
        finder: an object with ``present()``, ``address(timeout)``, ``count()``, ``index()`` and ``local()``.
    """
    try:
        from jax._src import clusters

        base = clusters.ClusterEnv
        found = base._cluster_types
        needed = ("is_env_present", "get_coordinator_address", "get_process_count", "get_process_id")
        if not isinstance(found, list) or not all(hasattr(base, n) for n in needed):
            raise AttributeError("ClusterEnv._cluster_types or its methods")
    except (ImportError, AttributeError) as exc:
        import jax

        return (
            f"JAX {jax.__version__} moved its cluster detectors ({exc}); jax.distributed.initialize() with no "
            "arguments will not find this worker's group: call mldist.init(), or pass it this worker's "
            "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID"
        )
    if any(getattr(c, "name", None) == name for c in found):
        return ""

    class Detector(base):  # type: ignore[misc, valid-type]
        @classmethod
        def is_env_present(cls) -> bool:
            return bool(finder.present())

        @classmethod
        def get_coordinator_address(cls, timeout_secs: int | None, override_coordinator_port: str | None = None) -> str:
            address = str(finder.address(timeout_secs))
            return f"{address.rpartition(':')[0]}:{override_coordinator_port}" if override_coordinator_port else address

        @classmethod
        def get_process_count(cls) -> int:
            return int(finder.count())

        @classmethod
        def get_process_id(cls) -> int:
            return int(finder.index())

        @classmethod
        def get_local_process_id(cls) -> int | None:
            return finder.local()  # type: ignore[no-any-return]

    Detector.name = name
    Detector.__qualname__ = Detector.__name__ = f"{name.capitalize()}Cluster"
    if Detector in found:  # joined at the end by __init_subclass__: first instead
        found.remove(Detector)
    found.insert(0, Detector)
    return ""


def tf_formed_cluster() -> bool:
    """Whether a tf.distribute strategy started TensorFlow's collectives over a cluster in this process
    (read only if TensorFlow is imported).

    The eager context keeps the server definition the strategy gave it; no public call reads it.
    """
    eager = sys.modules.get("tensorflow.python.eager.context")
    return eager is not None and getattr(eager.context_safe(), "_collective_ops_server_def", None) is not None


def freed_by_the_interpreter() -> bool:
    """Whether the caller of the caller (an ``__del__``) runs with no Python frame below: freed from C.

    The exception that ends the interpreter is freed so, after the main module's last frame is gone;
    one that Python code caught is freed with that code's frames on the stack. ``sys._getframe`` is
    CPython's; there is no public way to ask.

    Example:
        >>> freed_by_the_interpreter()  # a doctest's frames are on the stack
        False
    """
    try:
        sys._getframe(2)
    except ValueError:
        return True
    return False
