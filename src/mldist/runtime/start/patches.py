"""Everything mldist changes process-wide in a worker, in one list: what, why, and the switch of each.

Replacing what another library (or Python) owns is a last resort: each entry of :data:`PATCHES` names
the target, the module that keeps the replacement's logic, why no public way serves, and when it is
installed (its switch). The functions below install the runtime's entries, each in one place, and
record it (:func:`installed`); ``mldist.init()`` calls them. The start-up hook's entries are
installed by the launcher (``PYTHONPATH``: :func:`mldist.base.joined.with_hook`) and
:mod:`mldist.runtime.start.startup`. Private reads (no replacement) are in :mod:`mldist.runtime.compat`.
tests/runtime/test_patches.py checks that no other module assigns to ``sys``, ``jax``, ``tf`` or
``keras`` attributes.

Example:
    >>> [p.target for p in PATCHES][:3]
    ['sys.excepthook', 'sys.exit, atexit', 'jax.distributed.initialize']
"""

from __future__ import annotations

import atexit
import functools
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .. import compat
from ..watch import failures, leave


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
        "mldist.init() with 2+ workers",
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
        "the start-up hook, in workers of 2+; MLDIST_HOOK=0 turns the whole hook off",
    ),
    Patch(
        "jax._src.clusters: mldist's detector, first",
        "mldist.runtime.engines.jax_init.Finder (mldist.runtime.compat.add_jax_cluster)",
        "jax.distributed.initialize() with no arguments finds no group under mldist run, -H, PBS, Cobalt or "
        "Open MPI 5; JAX's detectors are private subclasses, and none reads JAX_NUM_PROCESSES or JAX_PROCESS_ID",
        "the start-up hook, in workers of 2+, when the script imports JAX; MLDIST_HOOK=0 turns it off",
    ),
    Patch(
        "jax.distributed.initialize: cluster defaults",
        "mldist.runtime.engines.jax_init.with_cluster_defaults",
        "JAX's own timeouts (300 s to join, 100 s for a silent peer, 300 s at the exit barrier) outlast a "
        "shorter MLDIST_COLLECTIVE_TIMEOUT, and its preemption service swallows the launcher's SIGTERM; "
        "initialize() takes both only as arguments, which Keras's initialize() and JAX's guide never pass",
        "the start-up hook, in workers of 2+, when the script imports JAX; a caller's own arguments and "
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
        "the start-up hook, in workers of 2+; MLDIST_GROUP_NOTE=0 turns the note alone off",
    ),
)


#: The targets installed in this process, in order.
_INSTALLED: list[str] = []


def _record(target: str) -> None:
    if target not in _INSTALLED:
        _INSTALLED.append(target)


def installed() -> tuple[str, ...]:
    """The :data:`PATCHES` targets installed in this process so far, in order.

    Example:
        >>> set(installed()) <= {p.target for p in PATCHES}
        True
    """
    return tuple(_INSTALLED)


def one_line_errors() -> None:
    """``sys.excepthook``: :func:`mldist.runtime.watch.failures.one_line_errors` (see :data:`PATCHES`)."""
    sys.excepthook = failures.one_line_errors
    _record("sys.excepthook")


def exit_codes() -> None:
    """``sys.exit`` raises :class:`mldist.runtime.watch.leave.Exit`, and :func:`~mldist.runtime.watch.leave.at_exit`
    runs at exit (before the handlers registered earlier: the engine's)."""
    sys.exit = leave.sys_exit
    atexit.register(leave.at_exit)
    _record("sys.exit, atexit")


def jax_initialize_once(rank: int, size: int) -> None:
    """``jax.distributed.initialize``: a later call for this world does nothing
    (:func:`mldist.runtime.engines.jax_engine.joined`).

    Args:
        rank, size: the group mldist formed.
    """
    import jax

    from ..engines.jax_engine import joined

    jax.distributed.initialize = joined(jax.distributed.initialize, rank, size)
    _record("jax.distributed.initialize")


class AfterImport:
    """Runs ``then(module)`` once, right after the module ``name`` is first imported (never stops the import).

    Args:
        name: the module's full name.
        then: called with the module once it is executed.

    A finder and a loader by their methods alone: ``importlib.abc`` would cost every worker's start 4 ms.
    """

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: the other finders find it
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Then(spec.loader, self.then)  # type: ignore[assignment]
                return spec
        return None


class _Then:
    """A loader that executes the module with ``loader``, then calls ``then`` with it."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        module.__loader__ = self.loader  # as if this one had never been there
        try:
            self.then(module)
        except Exception as exc:  # the user's import goes on; say what mldist could not do
            print(f"mldist: could not prepare {module.__name__} for this worker ({exc})", file=sys.stderr)


def jax_own_initialize(marks: Marks) -> None:
    """When the script imports JAX: mldist's cluster detector first and ``jax.distributed.initialize``'s
    cluster defaults (:mod:`mldist.runtime.engines.jax_init`), its join marked; at once if JAX is imported already.

    Args:
        marks: what marks this worker's join before the start-up and removes the mark when it fails
            (:func:`mldist.runtime.start.startup.joining` and ``not_joining``, bound to this rank).
    """
    if any(isinstance(f, AfterImport) for f in sys.meta_path):
        return
    then = functools.partial(_jax_distributed, marks=marks)
    if "jax.distributed" in sys.modules:
        then(sys.modules["jax.distributed"])
    else:
        sys.meta_path.insert(0, AfterImport("jax.distributed", then))
        _record("sys.meta_path: jax.distributed on import")


@dataclass(frozen=True)
class Marks:
    """A worker's join marks (:func:`mldist.runtime.start.startup.joining`): ``before`` the start-up, ``failed`` after
    a start-up that raised. Handed in by the start-up hook, which imports this module (not the other way)."""

    before: Callable[[], None]
    failed: Callable[[], None]


def _marked(initialize: Callable[..., Any], marks: Marks) -> Callable[..., Any]:
    """``initialize`` with this rank's join marked first, as ``mldist.init()`` marks it: a script that calls
    JAX's or Keras's own initialize and a rank that never does end at once, in one line, instead of after
    JAX's 300 s."""

    @functools.wraps(initialize)
    def marked(*args: Any, **kwargs: Any) -> Any:
        marks.before()
        try:
            return initialize(*args, **kwargs)
        except BaseException:
            marks.failed()
            raise

    return marked


def _jax_distributed(module: ModuleType, marks: Marks) -> None:
    """:func:`jax_own_initialize`'s work, with ``jax.distributed`` (the module) just executed."""
    from ..engines import jax_init

    problem = compat.add_jax_cluster(jax_init.NAME, jax_init.Finder(os.environ))
    if problem:
        print(f"mldist: {problem}", file=sys.stderr)
    else:
        _record("jax._src.clusters: mldist's detector, first")
    defaults = jax_init.with_cluster_defaults(module.initialize, os.environ)  # type: ignore[attr-defined]
    module.initialize = _marked(defaults, marks)  # type: ignore[attr-defined]
    _record("jax.distributed.initialize: cluster defaults")


def tensorflow_on_import(then: Callable[[ModuleType], None]) -> None:
    """``then(tensorflow)`` once the script imports TensorFlow (:class:`AfterImport`); at once if it is imported.

    Args:
        then: what ``init`` would have done to TensorFlow (:func:`mldist.runtime.start.tf_start.later`).
    """
    if _TENSORFLOW in sys.modules:
        then(sys.modules[_TENSORFLOW])
    elif not any(isinstance(f, AfterImport) and f.name == _TENSORFLOW for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(_TENSORFLOW, then))
        _record("sys.meta_path: TensorFlow on import")


#: The module :func:`tensorflow_on_import` waits for (a module's name here, not the backend's).
_TENSORFLOW = "tensorflow"


class VariableList(list):  # type: ignore[type-arg]
    """An optimizer's variables: the list Keras 3 gives, which Keras 2's spelling ``opt.variables()`` may call too.

    Example:
        >>> found = VariableList([1, 2])
        >>> found() == found == [1, 2], isinstance(found, list)
        (True, True)
    """

    def __call__(self) -> list[Any]:
        return list(self)


def keras2_variables() -> None:
    """Keras 3 takes Horovod's Keras 2 spellings (see :data:`PATCHES`): its optimizers answer ``opt.variables()``
    as well as ``opt.variables``, ``Model.compile`` drops ``experimental_run_tf_function``; at once if Keras is
    imported, else when the script imports it."""
    if _KERAS in sys.modules:
        _callable_variables(sys.modules[_KERAS])
    elif not any(isinstance(f, AfterImport) and f.name == _KERAS for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenLoaded(_KERAS, _callable_variables))


class _WhenLoaded(AfterImport):
    """:class:`AfterImport` that waits for the load itself: TensorFlow looks Keras up first
    (``importlib.util.find_spec("keras")``, which loads nothing) and a look-up alone would use it up."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = super().find_spec(fullname, path, target)
        if fullname == self.name and fullname not in sys.modules and self not in sys.meta_path:
            sys.meta_path.insert(0, self)  # the import itself asks again
        return spec


def _callable_variables(module: ModuleType) -> None:
    base = module.optimizers.Optimizer  # type: ignore[attr-defined]
    own = base.__dict__.get("variables") or getattr(base, "variables", None)
    if not isinstance(own, property) or getattr(own.fget, "_mldist_keras2", False):
        return  # Keras 2's method, or done already

    def variables(self: Any) -> VariableList:
        return VariableList(own.fget(self))  # type: ignore[misc]

    variables._mldist_keras2 = True  # type: ignore[attr-defined]
    base.variables = property(variables, doc=own.__doc__)
    _record("keras.optimizers.Optimizer.variables")
    _compile_takes_tf2_flag(module.Model)  # type: ignore[attr-defined]


def _compile_takes_tf2_flag(model: type) -> None:
    own = model.compile  # type: ignore[attr-defined]
    if getattr(own, "_mldist_keras2", False):
        return

    @functools.wraps(own)
    def compile(self: Any, *args: Any, experimental_run_tf_function: Any = None, **kwargs: Any) -> Any:
        del experimental_run_tf_function  # TensorFlow 2.2+ ignored it too
        return own(self, *args, **kwargs)

    compile._mldist_keras2 = True  # type: ignore[attr-defined]
    model.compile = compile  # type: ignore[attr-defined]
    _record("keras.Model.compile: experimental_run_tf_function")


#: The module :func:`keras2_variables` waits for.
_KERAS = "keras"


def autograph_leaves_mldist() -> None:
    """Autograph leaves mldist's functions as written (:func:`mldist.runtime.compat.never_convert`)."""
    compat.never_convert("mldist")
    _record("autograph's conversion rules")
