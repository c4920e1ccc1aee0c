"""What mldist's start-up hook does in each worker (see ``runtime/hook/sitecustomize.py``).

Two things, both for scripts that never call mldist:

- The variables other tools read (:mod:`mldist.placement.common`: ``RANK`` and the rest,
  Keras's ``KERAS_DISTRIBUTION_*``, ``TF_CONFIG`` when asked), from mldist's placement, where
  the launcher could not set them per rank (the ranks of a batch job, started by srun,
  mpiexec, aprun or PALS). Never over a value already set. Once the script imports JAX, JAX's
  own ``jax.distributed.initialize()`` finds the group too (:func:`mldist.runtime.start.patches.jax_own_initialize`).
- At exit, a note on whether this worker joined a group, and how (:mod:`mldist.base.joined`):
  the launcher says one line when the workers never formed one (``MLDIST_GROUP_NOTE=0``: no note).
  A worker that finishes alone while another rank of its launch waits to join (its mark, from
  :func:`joining`) ends the job instead: one line, exit code 2, so that any launcher ends the others,
  which MPI's or JAX's start-up would keep waiting for ever.

The hook imports this module only in a Python that a launcher's variables make a worker
(``sitecustomize.py`` looks first, reading the environment alone). Nothing here imports TensorFlow
or JAX; importing mldist costs a worker that never imports it itself about 60 ms at start, more
on a loaded machine (one that does pays it anyway); any other Python, about a millisecond.

Example::

    begin(os.environ)   # the hook does this at start-up
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from ...base import envvalues, joined, processwide, progress
from ...base.envparse import Setting
from ...errors import MldistError
from ...placement import common
from ...placement.cluster import assign_ports, build_cluster_spec, port_base
from ...placement.detect import detect
from .. import compat

#: The worker's own pid, for the Python processes it starts in turn (they inherit PYTHONPATH).
_FIRST = envvalues.HOOK_PID.name
#: The entry of :data:`mldist.base.processwide.PATCHES` for the variables the hook sets.
_TOOLS = "os.environ: the tools' variables"


def begin(environ: MutableMapping[str, str]) -> None:
    """In a worker of two or more: fill in the tools' variables, and note at exit how it joined.

    Args:
        environ: the process's environment (``os.environ``), updated in place.
    """
    if envvalues.HOOK_PID.read(environ) not in (None, str(os.getpid())):
        return  # a Python the worker started (multiprocessing's spawn, a tool): the worker speaks for itself
    processwide.set_env(_TOOLS, _FIRST, str(os.getpid()), environ)
    rank = fill(environ)
    if rank is not None:  # JAX's own initialize() finds this group, once the script imports JAX
        from . import patches

        marks = patches.Marks(functools.partial(joining, environ, rank), functools.partial(not_joining, environ, rank))
        patches.jax_own_initialize(marks)
    where = progress.folder(environ)
    if rank is not None and where is not None and _wanted(envvalues.GROUP_NOTE, environ):
        # Registered before any library's: runs after their exit handlers (JAX's shutdown included).
        processwide.at_exit("atexit: the group note", _note, where, rank, joined.launch_key(environ))


def _wanted(setting: Setting[bool], environ: Mapping[str, str]) -> bool:
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
    values = common.for_tools(environ, me.rank, me.size, me.local_rank, me.local_size, workers, coordinator)
    processwide.update_env(_TOOLS, values, environ)
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


class _Said:
    """Whether this rank said a half-formed group's line already (:func:`joining`): once per job is enough."""

    done = False


def joining(environ: Mapping[str, str], rank: int) -> None:
    """Before this rank joins a group of two or more (``mldist.init()``, ``hvd.init()``): mark it, with the
    user's line, where the ranks of its launch look (:func:`mldist.base.joined.mark`).

    MPI's start-up and JAX's wait for every rank, holding Python's lock for as long (MPI's): a rank of
    this launch that finished alone already means the group can never form. Then this rank says so in one
    line and exits 2 (a ``SystemExit``, before any start-up), which ends the job under any launcher.

    Args:
        environ: the process's environment.
        rank: this rank.

    Example::

        joining(os.environ, placement.rank)   # mldist.init() does this before the engine starts
    """
    where, launch = progress.folder(environ), joined.launch_key(environ)
    if where is None or not launch or not _wanted(envvalues.GROUP_NOTE, environ):
        return
    site = _site()
    joined.mark(where, rank, launch, site)  # first the mark, then the look: a rank finishing alone does the opposite
    notes = {r: how for r, how in joined.ended(where, launch).items() if r != rank}  # one file, not a listing
    alone = sorted(r for r, how in notes.items() if how == joined.ALONE)
    failed = sorted(r for r, how in notes.items() if how == joined.FAILED)
    if alone or failed:
        from ..watch import leave

        joined.unmark(where, rank)
        _Said.done = True
        leave.tell(leave.error_line(joined.half_formed(alone, {rank: f"start-up ({site})"}, failed)), environ)
        raise SystemExit(2)


def not_joining(environ: Mapping[str, str], rank: int) -> None:
    """Remove this rank's mark after its join failed (the script may catch the error and go on alone)."""
    if (where := progress.folder(environ)) is not None:
        joined.unmark(where, rank)


def _site() -> str:
    """``file:line`` of the user's innermost frame (the line that calls ``mldist.init()``, ``hvd.init()``)."""
    from ..watch.frames import frames_of

    found = frames_of(sys._getframe(1), depth=1)
    return found[0].removeprefix("inside ").split(" ")[0] if found else "?"


def _places(where: Path, waits: Mapping[int, str]) -> dict[int, str]:
    """Where each waiting rank waits: in a collective when its record says so, else in start-up at its mark's line."""
    records = progress.read(where)
    places = {}
    for rank, site in waits.items():
        record = records.get(rank)
        if record is not None and record.current is not None:
            number, what, _ = record.current
            frame = f" ({record.stack[0]})" if record.stack else ""
            places[rank] = f"collective #{number} {what}{frame}"
        else:
            places[rank] = f"start-up ({site})"
    return places


def _half_formed_at_exit(where: Path, rank: int, launch: str) -> None:
    """This rank finishes alone: when ranks of its launch wait to join, say the line and exit 2 (never returns)."""
    if _Said.done or getattr(sys, "last_value", None) is not None:  # said already, or an uncaught error ends it
        return
    marked = {r: site for r, site in joined.marks(where, launch).items() if r != rank}  # one file, not a listing
    if not marked:
        return
    waits = joined.waiting(marked, joined.noted(where, marked, launch))
    if not waits:
        return
    from ..watch import leave

    alone = sorted({rank, *(r for r, how in joined.ended(where, launch).items() if how == joined.ALONE)})
    leave.tell(leave.error_line(joined.half_formed(alone, _places(where, waits))))
    os._exit(2)  # an exit handler cannot change the exit code otherwise


def _note(where: Path, rank: int, launch: str = "") -> None:
    with contextlib.suppress(Exception):  # at exit, with the libraries half torn down: never a traceback of ours
        how = how_joined()
        if how == joined.ALONE and getattr(sys, "last_value", None) is not None:
            how = joined.FAILED  # an uncaught error ended it (Python keeps it there for exit handlers)
        joined.write(where, rank, how, launch)
        if how == joined.ALONE and launch:
            _half_formed_at_exit(where, rank, launch)
