"""What mldist's start-up hook does in each worker (see ``runtime/hook/sitecustomize.py``).

Two things, both for scripts that never call mldist:

- The variables other tools read (:mod:`mldist.placement.common`: ``RANK`` and the rest,
  Keras's ``KERAS_DISTRIBUTION_*``, ``TF_CONFIG`` when asked), from mldist's placement, where
  the launcher could not set them per rank (the ranks of a batch job, started by srun,
  mpiexec, aprun or PALS). Never over a value already set.
- At exit, a note on whether this worker joined a group, and how (:mod:`mldist.base.joined`):
  the launcher says one line when the workers never formed one (``MLDIST_GROUP_NOTE=0``: no note).

The hook imports this module only in a Python that a launcher's variables make a worker
(``sitecustomize.py`` looks first, reading the environment alone). Nothing here imports TensorFlow
or JAX; importing mldist costs a worker that never imports it itself about 60 ms at start, more
on a loaded machine (one that does pays it anyway); any other Python, about a millisecond.

Example::

    begin(os.environ)   # the hook does this at start-up
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from ..base import envvalues, joined, progress
from ..base.envparse import Setting
from ..errors import MldistError
from ..placement import common
from ..placement.cluster import assign_ports, build_cluster_spec, port_base
from ..placement.detect import detect
from . import compat

#: The worker's own pid, for the Python processes it starts in turn (they inherit PYTHONPATH).
_FIRST = envvalues.HOOK_PID.name


def begin(environ: MutableMapping[str, str]) -> None:
    """In a worker of two or more: fill in the tools' variables, and note at exit how it joined.

    Args:
        environ: the process's environment (``os.environ``), updated in place.
    """
    if environ.get(_FIRST, str(os.getpid())) != str(os.getpid()):
        return  # a Python the worker started (multiprocessing's spawn, a tool): the worker speaks for itself
    environ[_FIRST] = str(os.getpid())
    rank = fill(environ)
    where = progress.folder(environ)
    if rank is not None and where is not None and _wanted(envvalues.GROUP_NOTE, environ):
        # Registered before any library's: runs after their exit handlers (JAX's shutdown included).
        atexit.register(_note, where, rank)


def _wanted(setting: Setting[bool], environ: MutableMapping[str, str]) -> bool:
    """A yes/no setting, its default when the value is bad: the hook never stops a program
    (``mldist run`` and ``mldist.init()`` refuse the value in one line).

    Example:
        >>> note = envvalues.GROUP_NOTE
        >>> _wanted(note, {"MLDIST_GROUP_NOTE": "0"}), _wanted(note, {"MLDIST_GROUP_NOTE": "?"}), _wanted(note, {})
        (False, True, True)
    """
    try:
        return setting.read(environ)
    except MldistError:
        return setting.default


def fill(environ: MutableMapping[str, str]) -> int | None:
    """Set the tools' variables this worker lacks, from mldist's placement; its rank, or None outside
    a group of two or more (then nothing is set).

    ``TF_CONFIG`` needs every rank's address, Keras's variables rank 0's: where only asking the
    other ranks would give them (mpiexec without a host list), they stay unset.

    Example:
        >>> env = {"MLDIST_RANK": "1", "MLDIST_SIZE": "2", "MLDIST_WORKERS": "h:1,h:2"}
        >>> fill(env), env["KERAS_DISTRIBUTION_PROCESS_ID"], env["WORLD_SIZE"]
        (1, '1', '2')
    """
    try:
        me = detect(environ)
    except MldistError:
        return None
    if me.size < 2:
        return None
    workers: tuple[str, ...] = ()
    coordinator = ""
    try:
        workers = build_cluster_spec(me, environ).workers
    except MldistError:  # hosts but no rank layout (PALS): rank 0 is on the first node, where its port is
        if me.hosts:
            coordinator = f"{me.hosts[0]}:{assign_ports(me.job_key, me.size, port_base(environ))[0]}"
    environ.update(common.for_tools(environ, me.rank, me.size, me.local_rank, me.local_size, workers, coordinator))
    return me.rank


def how_joined() -> str:
    """How this process joined a group of two or more: ``mldist.init``, ``jax.distributed``,
    ``tf.distribute``, or ``alone``. Reads the libraries' state only if they were imported."""
    context = sys.modules.get("mldist.runtime.context")
    ctx = getattr(getattr(context, "STATE", None), "ctx", None)
    if ctx is not None and ctx.size > 1:
        return "mldist.init"
    if compat.jax_formed_group():
        return "jax.distributed"
    if compat.tf_formed_cluster():
        return "tf.distribute"
    return joined.ALONE


def _note(where: Path, rank: int) -> None:
    with contextlib.suppress(Exception):  # at exit, with the libraries half torn down: never a traceback of ours
        joined.write(where, rank, how_joined())
