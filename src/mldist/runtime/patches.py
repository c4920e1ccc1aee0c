"""Everything mldist changes process-wide in a worker, in one list: what, why, and the switch of each.

Replacing what another library (or Python) owns is a last resort: each entry of :data:`PATCHES` names
the target, the module that keeps the replacement's logic, why no public way serves, and when it is
installed (its switch). The functions below install the runtime's entries, each in one place, and
record it (:func:`installed`); ``mldist.init()`` calls them. The start-up hook's entries are
installed by the launcher (``PYTHONPATH``: :func:`mldist.base.joined.with_hook`) and
:mod:`mldist.runtime.startup`. Private reads (no replacement) are in :mod:`mldist.runtime.compat`.
tests/runtime/test_patches.py checks that no other module assigns to ``sys``, ``jax``, ``tf`` or
``keras`` attributes.

Example:
    >>> [p.target for p in PATCHES][:3]
    ['sys.excepthook', 'sys.exit, atexit', 'jax.distributed.initialize']
"""

from __future__ import annotations

import atexit
import sys
from dataclasses import dataclass

from . import compat, failures, leave


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
        "mldist.runtime.failures.one_line_errors",
        "an uncaught exception is one line naming the rank (a known one without its traceback); with 2+ "
        "workers the rank then leaves, so that the others do not wait for it in a collective",
        "mldist.init(), in every worker; a hook the script sets after init() replaces it",
    ),
    Patch(
        "sys.exit, atexit",
        "mldist.runtime.leave (sys_exit, Exit, at_exit)",
        "a sys.exit(n) on one rank ends the group naming the rank, where the others would wait in a "
        "collective or in MPI_Finalize; Python hands the exit code to no hook",
        "mldist.init() with 2+ workers",
    ),
    Patch(
        "jax.distributed.initialize",
        "mldist.runtime.jax_engine.joined",
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
        "PYTHONPATH: a sitecustomize",
        "mldist.runtime.startup.fill (runtime/hook/sitecustomize.py)",
        "the ranks of a batch job, which the launcher cannot reach one by one, get RANK, WORLD_SIZE, "
        "KERAS_DISTRIBUTION_* and the rest for scripts that never call mldist",
        "the workers of mldist's launchers; MLDIST_HOOK=0 turns the whole hook off (the note too)",
    ),
    Patch(
        "atexit: the group note",
        "mldist.runtime.startup.how_joined (mldist.base.joined)",
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
    """``sys.excepthook``: :func:`mldist.runtime.failures.one_line_errors` (see :data:`PATCHES`)."""
    sys.excepthook = failures.one_line_errors
    _record("sys.excepthook")


def exit_codes() -> None:
    """``sys.exit`` raises :class:`mldist.runtime.leave.Exit`, and :func:`~mldist.runtime.leave.at_exit`
    runs at exit (before the handlers registered earlier: the engine's)."""
    sys.exit = leave.sys_exit
    atexit.register(leave.at_exit)
    _record("sys.exit, atexit")


def jax_initialize_once(rank: int, size: int) -> None:
    """``jax.distributed.initialize``: a later call for this world does nothing
    (:func:`mldist.runtime.jax_engine.joined`).

    Args:
        rank, size: the group mldist formed.
    """
    import jax

    from .jax_engine import joined

    jax.distributed.initialize = joined(jax.distributed.initialize, rank, size)
    _record("jax.distributed.initialize")


def autograph_leaves_mldist() -> None:
    """Autograph leaves mldist's functions as written (:func:`mldist.runtime.compat.never_convert`)."""
    compat.never_convert("mldist")
    _record("autograph's conversion rules")
