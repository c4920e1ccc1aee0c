"""Everything mldist changes process-wide in a worker, in one list, and the one way to make each change.

A process-wide change outlives the call that makes it and reaches code that is not mldist's: an exit
handler, a signal handler, a filter on another library's logger, an environment variable the libraries
read, an import hook, a replaced attribute of Python or of a library. Each has an entry in
:data:`PATCHES` that names the target, the module that keeps its logic, why no public way serves,
and when it is installed (its switch); each is made by a function here (:func:`at_exit`,
:func:`on_signal`, :func:`set_env`, :func:`env_default`, :func:`update_env`, :func:`log_filter`,
:func:`import_hook`, :func:`excepthook`) that takes the entry's target and refuses one the table does
not list. Replacements of other libraries' attributes are installed by
:mod:`mldist.runtime.start.patches`, which records them here (:func:`record`). This module is at the
bottom of the tree (it imports nothing of mldist) so that every floor can use it; the launcher
(``launch/``, ``cli/``, ``tools/``) and :mod:`mldist.preempt`'s opt-in handlers are outside it.
tests/runtime/test_patches.py scans the rest of the tree for a change made any other way.

Example:
    >>> [p.target for p in PATCHES][:3]
    ['sys.excepthook', 'sys.exit, atexit', 'jax.distributed.initialize']
    >>> env = {"A": "user"}
    >>> env_default("os.environ: TensorFlow's log level", "A", "1", env), env
    (None, {'A': 'user'})
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Patch:
    """One process-wide change.

    Args:
        target: what is replaced or added to.
        logic: the module (or function) that keeps the replacement's logic.
        why: what goes wrong without it, and why no public way serves.
        switch: when it is installed, and what turns it off.
    """

    target: str
    logic: str
    why: str
    switch: str


_HOOK = "the start-up hook, in workers of 2+"
_TWO = "mldist.init() with 2+ workers"
_WATCH = f"{_TWO} and the collective watch on (MLDIST_COLLECTIVE_TIMEOUT=0 turns it off)"
_SLOW = f"{_WATCH}, the slow-rank line on (MLDIST_STRAGGLER_PERCENT=0 turns it off)"

PATCHES: tuple[Patch, ...] = (
    Patch(
        "sys.excepthook",
        "mldist.runtime.watch.failures.one_line_errors",
        "an uncaught exception is one line naming the rank (a known one without its traceback); with 2+ "
        "workers the rank then leaves, so that the others do not wait for it in a collective",
        "mldist.init(), in every worker; a hook the script sets after init() replaces it",
    ),
    Patch(
        "sys.exit, atexit",
        "mldist.runtime.watch.leave (sys_exit, Exit, at_exit)",
        "a sys.exit(n) on one rank ends the group naming the rank, where the others would wait in a "
        "collective or in MPI_Finalize; Python hands the exit code to no hook",
        _TWO,
    ),
    Patch(
        "jax.distributed.initialize",
        "mldist.runtime.engines.jax_engine.joined",
        "Keras's initialize() calls it again after mldist.init() formed JAX's group, and JAX allows one call",
        "mldist.init() on KERAS_BACKEND=jax with 2+ workers, when it formed JAX's group (not when the script did)",
    ),
    Patch(
        "autograph's conversion rules",
        "mldist.runtime.compat.never_convert",
        "autograph would rewrite mldist's collectives inside a user's tf.function, reading their source at "
        "trace time; no public call adds a package to its do-not-convert list",
        "mldist.init() on TensorFlow",
    ),
    Patch(
        "sys.meta_path: TensorFlow on import",
        "mldist.runtime.start.tf_start.later",
        "a script that calls mldist.init() before it imports TensorFlow gets the thread pools and autograph's "
        "rule when it does; importing TensorFlow in init would cost a numpy worker ~30,000 file-system calls",
        "mldist.init() on KERAS_BACKEND=tensorflow when the script has not imported TensorFlow or Keras",
    ),
    Patch(
        "PYTHONPATH: a sitecustomize",
        "mldist.runtime.start.startup.fill (runtime/hook/sitecustomize.py)",
        "the ranks of a batch job, which the launcher cannot reach one by one, get RANK, WORLD_SIZE, "
        "KERAS_DISTRIBUTION_* and the rest for scripts that never call mldist",
        "the workers of mldist's launchers; MLDIST_HOOK=0 turns the whole hook off (the note too)",
    ),
    Patch(
        "sys.meta_path: jax.distributed on import",
        "mldist.runtime.start.patches.AfterImport",
        "the two entries below must be made when the script imports JAX, and importing JAX in the hook "
        "would cost every worker that never uses it about a second; Python has no post-import hook",
        f"{_HOOK}; MLDIST_HOOK=0 turns the whole hook off",
    ),
    Patch(
        "jax._src.clusters: mldist's detector, first",
        "mldist.runtime.engines.jax_init.Finder (mldist.runtime.compat.add_jax_cluster)",
        "jax.distributed.initialize() with no arguments finds no group under mldist run, -H, PBS, Cobalt or "
        "Open MPI 5; JAX's detectors are private subclasses, and none reads JAX_NUM_PROCESSES or JAX_PROCESS_ID",
        f"{_HOOK}, when the script imports JAX; MLDIST_HOOK=0 turns it off",
    ),
    Patch(
        "jax.distributed.initialize: cluster defaults",
        "mldist.runtime.engines.jax_init.with_cluster_defaults",
        "JAX's own timeouts (300 s to join, 100 s for a silent peer, 300 s at the exit barrier) outlast a "
        "shorter MLDIST_COLLECTIVE_TIMEOUT, and its preemption service swallows the launcher's SIGTERM; "
        "initialize() takes both only as arguments, which Keras's initialize() and JAX's guide never pass",
        f"{_HOOK}, when the script imports JAX; a caller's own arguments and "
        "JAX_ENABLE_PREEMPTION_SERVICE win; MLDIST_HOOK=0 turns it off",
    ),
    Patch(
        "keras.optimizers.Optimizer.variables",
        "mldist.runtime.start.patches.VariableList",
        "Horovod's TF2 examples call opt.variables() (Keras 2's method) on Keras's own optimizers, which Keras 3 "
        "made a list property: the script's optimizer is not mldist's, so no class of mldist's can answer it "
        "(tf_keras keeps a callable list for the same reason; Keras 3 has none)",
        "the Horovod alias only (python -m mldist.horovod.alias, mldist.horovod.alias.install()), when the script "
        "imports Keras 3; other scripts keep Keras's property (mldist's own optimizers answer both spellings)",
    ),
    Patch(
        "keras.Model.compile: experimental_run_tf_function",
        "mldist.runtime.start.patches.keras2_variables",
        "Horovod's Keras examples pass compile(experimental_run_tf_function=False), a flag TensorFlow 2.2+ "
        "ignored and Keras 3 refuses (TypeError); it is taken and dropped, every other argument goes to Keras",
        "the Horovod alias only, with the entry above",
    ),
    Patch(
        "atexit: the group note",
        "mldist.runtime.start.startup.how_joined (mldist.base.joined)",
        "workers that never formed a group train one copy each and exit 0; the launcher says so in one line",
        f"{_HOOK}; MLDIST_GROUP_NOTE=0 turns the note alone off",
    ),
    Patch(
        "os.environ: the tools' variables",
        "mldist.runtime.start.startup.fill (mldist.placement.common.for_tools)",
        "RANK, WORLD_SIZE, KERAS_DISTRIBUTION_*, JAX_*, TF_CONFIG (with MLDIST_TF_CONFIG) and MPI's tuning for "
        "scripts and libraries that read them, never over a value already set; MLDIST_HOOK_PID tells the "
        "Python processes a worker starts in turn that they are not the worker",
        f"{_HOOK}; MLDIST_HOOK=0 turns the whole hook off",
    ),
    Patch(
        "sys.meta_path: Keras on import",
        "mldist.runtime.start.patches.keras2_variables",
        "the two Keras entries above must be made when the script imports Keras; importing Keras in the alias "
        "would cost every script that never uses it seconds",
        "the Horovod alias only, when Keras is not imported yet",
    ),
    Patch(
        "sys.meta_path: horovod",
        "mldist.horovod.alias.install",
        "an unchanged Horovod script's `import horovod.tensorflow.keras` loads mldist's Horovod API; no "
        "public way maps one package's name onto another's",
        "the Horovod alias only (python -m mldist.horovod.alias, mldist.horovod.alias.install())",
    ),
    Patch(
        "os.environ: OpenMP's threads",
        "mldist.runtime.start.worker.init (mldist.placement.resources.openmp_defaults)",
        "OMP_NUM_THREADS, KMP_BLOCKTIME (and KMP_AFFINITY where pinned) from the CPUs this rank owns: each "
        "runtime reads them once as it starts, so N ranks on a node would otherwise run N x cores threads",
        "mldist.init(), in every worker; a value the user set wins",
    ),
    Patch(
        "os.environ: TensorFlow's log level",
        "mldist.runtime.start.worker.init",
        "TF_CPP_MIN_LOG_LEVEL=1: TensorFlow's C++ start-up notes, once per rank, would bury the training's lines",
        "mldist.init(), in every worker; a value the user set wins",
    ),
    Patch(
        "os.environ: TensorFlow's pool sizes",
        "mldist.runtime.start.tf_start.later, mldist.runtime.start.worker._start_jax",
        "TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS from the thread plan, for a TensorFlow imported after "
        "init() (JAX's input pipeline, a late import): TensorFlow reads them once, as it starts",
        "mldist.init() where TensorFlow is not imported yet; a value the user set wins",
    ),
    Patch(
        "os.environ: MPI's tuning",
        "mldist.runtime.engines.engine.probe_mpi (mldist.placement.common.MPI_TUNING)",
        "Open MPI's non-blocking all-reduce and reduce algorithms for a worker a bare mpirun started (no hook): "
        "MPI reads its settings once, as it starts",
        "mldist.init() under an MPI launcher, before mpi4py is imported; a value the user set wins",
    ),
    Patch(
        "os.environ: TF_CONFIG",
        "mldist.runtime.engines.tf_engine.start (mldist.placement.cluster.ClusterSpec.tf_config)",
        "MultiWorkerMirroredStrategy finds its cluster in TF_CONFIG alone",
        "mldist.init() with 2+ workers on TensorFlow's collectives (ring, nccl), or mldist.strategy() on MPI",
    ),
    Patch(
        "os.environ: no_proxy",
        "mldist.placement.proxies.worker_no_proxy (tf_engine.start_for, jax_engine.start, worker._late_strategy)",
        "TensorFlow's and JAX's coordination speak gRPC, which would send the workers' own addresses to a "
        "site's HTTP proxy; gRPC reads no_proxy alone",
        "mldist.init() with 2+ workers on TensorFlow's collectives or JAX, and mldist.strategy() on MPI",
    ),
    Patch(
        "os.environ: XLA_FLAGS",
        "mldist.runtime.engines.jax_engine.xla_flags",
        "XLA's CPU threads from the thread plan: XLA reads XLA_FLAGS once, as JAX starts; the user's flags stay",
        "mldist.init() on KERAS_BACKEND=jax",
    ),
    Patch(
        "signal: SIGTERM back from TensorFlow",
        "mldist.runtime.engines.tf_engine.start",
        "TensorFlow's coordination service installs a SIGTERM handler that only logs, so a worker would ignore "
        "scancel, mldist run's forwarding and every launcher's stop until SIGKILL; the handler before it is "
        "put back",
        "mldist.init() with 2+ workers on TensorFlow's collectives, from the main thread",
    ),
    Patch(
        "signal: SIGTERM and SIGINT to their defaults while departing",
        "mldist.runtime.engines.mpi_exit.Departures.depart",
        "a stop signal must end a rank that waits for the others at exit at once; a Python flag handler "
        "(preemption's) would never run while it waits in MPI",
        f"{_TWO} on MPI, at exit with a code every rank takes together (0, 75), from the main thread",
    ),
    Patch(
        "atexit: MPI's departures",
        "mldist.runtime.engines.mpi_world._at_exit (mldist.runtime.engines.mpi_exit)",
        "a rank that ends first would hang the others in MPI_Finalize; at exit each rank tells the others "
        "and waits for them, and a code not taken together ends the group",
        f"{_TWO} on MPI",
    ),
    Patch(
        "atexit: the node's records freed",
        "mldist.base.nodes.Node.forget",
        "a rank's record is in node-local memory (/dev/shm), which outlives the process; the last rank of a "
        "node removes the folder (and a temporary folder's node file)",
        _WATCH,
    ),
    Patch(
        "atexit: the node file's last record",
        "mldist.base.nodes.Node._at_exit",
        "a record that waits for its timer (the node's file is rewritten once a second) goes in at exit, "
        "so that the last word of a rank is read",
        f"{_WATCH}, when a record waits for its turn",
    ),
    Patch(
        "atexit: the slow-rank tracker",
        "mldist.runtime.watch.straggler_watch.Tracker.finish",
        "a run that ends before the window fills still gets the line over the whole run, and the picture",
        f"{_SLOW}, on rank 0",
    ),
    Patch(
        "atexit: the slow-rank reporter",
        "mldist.runtime.watch.straggler_rounds.Reporter.finish",
        "the last round of waits reaches rank 0 before the engine's exit handler (registered earlier, so run "
        "later) ends the group",
        f"{_SLOW}, on engines that gather the waits aside (MPI, JAX)",
    ),
    Patch(
        "logging: TensorFlow's retracing warnings of mldist's collectives",
        "mldist.runtime.collect.collectives._QuietOwnTracing",
        "each collective is traced once per signature by design, but TensorFlow counts traces per source "
        "function and would call that excessive retracing in the user's log; only those lines are dropped",
        "the first collective traced on TensorFlow's engines",
    ),
    Patch(
        "atexit: Horovod's timeline",
        "mldist.horovod.settings._stop_at_exit",
        "HOROVOD_TIMELINE records to the end of the script, as Horovod's does: rank 0 writes the trace at exit",
        "hvd.init() with HOROVOD_TIMELINE set",
    ),
)

#: Every target of :data:`PATCHES`.
TARGETS = frozenset(p.target for p in PATCHES)
#: The targets installed in this process, in order.
_INSTALLED: list[str] = []


def record(target: str) -> None:
    """Note that ``target`` (an entry of :data:`PATCHES`) is installed in this process.

    Args:
        target: the entry's target; one the table does not list raises :class:`LookupError`.

    Example:
        >>> record("sys.excepthook"); "sys.excepthook" in installed()
        True
    """
    if target not in TARGETS:
        raise LookupError(f"{target!r} is not in mldist.base.processwide.PATCHES: add it, with its reason and switch")
    if target not in _INSTALLED:
        _INSTALLED.append(target)


def installed() -> tuple[str, ...]:
    """The :data:`PATCHES` targets installed in this process so far, in order.

    Example:
        >>> set(installed()) <= TARGETS
        True
    """
    return tuple(_INSTALLED)


def at_exit(target: str, fn: Callable[..., Any], *args: Any) -> None:
    """``atexit.register(fn, *args)`` for ``target`` (exit handlers run the last registered first).

    Args:
        target: its entry in :data:`PATCHES`.
        fn, args: the handler and its arguments.

    Example::

        at_exit("atexit: MPI's departures", _at_exit)
    """
    record(target)
    atexit.register(fn, *args)


def on_signal(target: str, sig: int, handler: Any) -> None:
    """``signal.signal(sig, handler)`` for ``target`` (from the main thread, as Python requires).

    Example::

        on_signal("signal: SIGTERM back from TensorFlow", signal.SIGTERM, previous)
    """
    import signal

    record(target)
    signal.signal(sig, handler)


def _environ(env: MutableMapping[str, str] | None) -> MutableMapping[str, str]:
    return os.environ if env is None else env


def set_env(target: str, name: str, value: str, env: MutableMapping[str, str] | None = None) -> None:
    """``env[name] = value`` for ``target``; ``env`` is this process's environment unless given (a test's dict).

    Example:
        >>> env = {}; set_env("os.environ: TF_CONFIG", "TF_CONFIG", "{}", env); env
        {'TF_CONFIG': '{}'}
    """
    record(target)
    _environ(env)[name] = value


def env_default(target: str, name: str, value: str, env: MutableMapping[str, str] | None = None) -> None:
    """``env.setdefault(name, value)`` for ``target``: a value already set (the user's) wins."""
    record(target)
    _environ(env).setdefault(name, value)


def update_env(target: str, values: Mapping[str, str], env: MutableMapping[str, str] | None = None) -> None:
    """``env.update(values)`` for ``target`` (nothing, and nothing recorded, when ``values`` is empty).

    Example:
        >>> env = {"a": "1"}; update_env("os.environ: no_proxy", {"no_proxy": "h"}, env); env
        {'a': '1', 'no_proxy': 'h'}
    """
    if values:
        record(target)
        _environ(env).update(values)


def log_filter(target: str, logger: str, kind: type[Any]) -> None:
    """A ``kind()`` filter on the logger named ``logger``, once (a filter of that kind already there: nothing).

    ``kind`` makes objects with a ``filter(record)`` method (a ``logging.Filter``, or any class: loggers take both).
    """
    import logging

    found = logging.getLogger(logger)
    if not any(isinstance(f, kind) for f in found.filters):
        record(target)
        found.addFilter(kind())


def import_hook(target: str, finder: Any) -> None:
    """``finder`` first in ``sys.meta_path`` for ``target`` (it may take itself out: :func:`drop_import_hook`)."""
    record(target)
    sys.meta_path.insert(0, finder)


def drop_import_hook(finder: Any) -> None:
    """Take ``finder`` (put there by :func:`import_hook`) out of ``sys.meta_path``, if it is there."""
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def excepthook(target: str, hook: Callable[..., Any]) -> None:
    """``sys.excepthook = hook`` for ``target``."""
    record(target)
    sys.excepthook = hook
