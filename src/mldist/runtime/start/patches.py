"""The runtime's replacements of what other libraries (or Python) own, installed as :data:`PATCHES` lists them.

Replacing what another library owns is a last resort: each entry of :data:`PATCHES`
(:mod:`mldist.base.processwide`, where every process-wide change of a worker is listed and made) names
the target, the module that keeps the replacement's logic, why no public way serves, and when it is
installed (its switch). The functions below install the runtime's entries, each in one place, and
record it (:func:`installed`); ``mldist.init()`` calls them. The start-up hook's entries are
installed by the launcher (``PYTHONPATH``: :func:`mldist.base.joined.with_hook`) and
:mod:`mldist.runtime.start.startup`. Private reads (no replacement) are in :mod:`mldist.runtime.compat`.
tests/runtime/test_patches.py checks that no other module assigns to ``sys``, ``jax``, ``tf`` or
``keras`` attributes, and that exit handlers, signal handlers, logger filters, environment writes and
import hooks go through :mod:`mldist.base.processwide`.

Example:
    >>> [p.target for p in PATCHES][:3]
    ['sys.excepthook', 'sys.exit, atexit', 'jax.distributed.initialize']
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...base import processwide
from ...base.processwide import PATCHES as PATCHES
from ...base.processwide import Patch as Patch
from ...base.processwide import installed as installed
from .. import compat
from ..watch import failures, leave


def one_line_errors() -> None:
    """``sys.excepthook``: :func:`mldist.runtime.watch.failures.one_line_errors` (see :data:`PATCHES`)."""
    processwide.excepthook("sys.excepthook", failures.one_line_errors)


def exit_codes() -> None:
    """``sys.exit`` raises :class:`mldist.runtime.watch.leave.Exit`, and :func:`~mldist.runtime.watch.leave.at_exit`
    runs at exit (before the handlers registered earlier: the engine's)."""
    sys.exit = leave.sys_exit
    processwide.at_exit("sys.exit, atexit", leave.at_exit)


def jax_initialize_once(rank: int, size: int) -> None:
    """``jax.distributed.initialize``: a later call for this world does nothing
    (:func:`mldist.runtime.engines.jax_engine.joined`).

    Args:
        rank, size: the group mldist formed.
    """
    import jax

    from ..engines.jax_engine import joined

    jax.distributed.initialize = joined(jax.distributed.initialize, rank, size)
    processwide.record("jax.distributed.initialize")


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
        processwide.drop_import_hook(self)  # once: the other finders find it
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
        processwide.import_hook("sys.meta_path: jax.distributed on import", AfterImport("jax.distributed", then))


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
        processwide.record("jax._src.clusters: mldist's detector, first")
    defaults = jax_init.with_cluster_defaults(module.initialize, os.environ)  # type: ignore[attr-defined]
    module.initialize = _marked(defaults, marks)  # type: ignore[attr-defined]
    processwide.record("jax.distributed.initialize: cluster defaults")


def tensorflow_on_import(then: Callable[[ModuleType], None]) -> None:
    """``then(tensorflow)`` once the script imports TensorFlow (:class:`AfterImport`); at once if it is imported.

    Args:
        then: what ``init`` would have done to TensorFlow (:func:`mldist.runtime.start.tf_start.later`).
    """
    if _TENSORFLOW in sys.modules:
        then(sys.modules[_TENSORFLOW])
    elif not any(isinstance(f, AfterImport) and f.name == _TENSORFLOW for f in sys.meta_path):
        processwide.import_hook("sys.meta_path: TensorFlow on import", AfterImport(_TENSORFLOW, then))


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
        processwide.import_hook(_KERAS_ON_IMPORT, _WhenLoaded(_KERAS, _callable_variables))


class _WhenLoaded(AfterImport):
    """:class:`AfterImport` that waits for the load itself: TensorFlow looks Keras up first
    (``importlib.util.find_spec("keras")``, which loads nothing) and a look-up alone would use it up."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = super().find_spec(fullname, path, target)
        if fullname == self.name and fullname not in sys.modules and self not in sys.meta_path:
            processwide.import_hook(_KERAS_ON_IMPORT, self)  # the import itself asks again
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
    processwide.record("keras.optimizers.Optimizer.variables")
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
    processwide.record("keras.Model.compile: experimental_run_tf_function")


#: The module :func:`keras2_variables` waits for, and its entry in :data:`PATCHES`.
_KERAS, _KERAS_ON_IMPORT = "keras", "sys.meta_path: Keras on import"


def autograph_leaves_mldist() -> None:
    """Autograph leaves mldist's functions as written (:func:`mldist.runtime.compat.never_convert`)."""
    compat.never_convert("mldist")
    processwide.record("autograph's conversion rules")
