"""The one way a worker ends on an error: one line naming the rank, then the engine's abort or an exit.

Every fatal path of the runtime (a collective that cannot go on, a stalled
collective, an uncaught exception, a non-zero ``sys.exit``) ends here, in
:func:`leave`. The line goes to stderr, to the stderr the worker had when
``init`` ran (a test runner or a logging setup may have redirected fd 2 since),
and to ``mldist run``'s notes directory (``MLDIST_NOTES``), from which the
launcher puts it in its own report and in the rank's log.

How the others learn of it: under ``mldist run`` (``MLDIST_NOTES`` set) the
process simply exits with the code and the launcher stops the group, naming
this rank; under a bare launcher (``mpiexec``, ``srun``) the MPI engine aborts
the job (``MPI_Abort``), which every MPI launcher turns into the end of all ranks.

Example::

    leave("rank 1 passed int32 where the others passed float32", code=1)   # never returns
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from ...base import envvalues
from ...base.files import atomic_write
from ...errors import REQUEUE_CODE, ConfigError
from .. import compat
from ..context import STATE, current

#: The launcher's private directory for each rank's last words (``note-R``).
NOTES = envvalues.NOTES.name
#: Exit codes that every rank takes together (so the rank waits for the others, as MPI_Finalize would).
TOGETHER = (0, REQUEUE_CODE)


class _Stderr:
    """A duplicate of fd 2 taken by ``init``, for the last line when fd 2 was redirected later."""

    fd: int | None = None


def remember_stderr() -> None:
    """Keep a duplicate of this process's stderr (``init`` calls it once)."""
    if _Stderr.fd is None:
        with contextlib.suppress(OSError):
            _Stderr.fd = os.dup(2)


def error_line(message: str, rank: int | None = None) -> str:
    """``mldist: error (rank R): message``; the rank from ``init`` when not given.

    Example:
        >>> error_line("boom", 3)
        'mldist: error (rank 3): boom'
    """
    if rank is None:
        ctx = current()
        rank = ctx.rank if ctx is not None else None
    where = f" (rank {rank})" if rank is not None else ""
    return f"mldist: error{where}: {message}"


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def tell(line: str, env: Mapping[str, str] = os.environ) -> None:
    """Write ``line`` where the user will see it, whatever became of fd 2; never raises."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(line, file=sys.stderr, flush=True)
    saved = _Stderr.fd
    if saved is not None and not _same_file(saved, 2):
        with contextlib.suppress(OSError):
            os.write(saved, (line + "\n").encode())
    notes, ctx = envvalues.NOTES.read(env) or "", current()
    rank = ctx.rank if ctx is not None else _env_rank(env)
    if notes and os.path.isdir(notes):
        with contextlib.suppress(OSError):
            atomic_write(Path(notes) / f"note-{rank}", line + "\n", mode=0o600)


def _env_rank(env: Mapping[str, str]) -> int | str:
    """``MLDIST_RANK`` before ``init`` made a context: "" when unset or not a rank (:func:`tell` never raises).

    Example:
        >>> _env_rank({"MLDIST_RANK": "3"}), _env_rank({}), _env_rank({"MLDIST_RANK": "x"})
        (3, '', '')
    """
    with contextlib.suppress(ConfigError):
        rank = envvalues.RANK.read(env)
        return "" if rank is None else rank
    return ""


def supervised(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``mldist run`` supervises this worker (it stops the others when this one exits)."""
    return bool(envvalues.NOTES.read(env))


def leave(message: str, code: int = 1) -> NoReturn:
    """Print ``mldist: error (rank R): message`` (see :func:`tell`) and end the process with ``code``.

    On the MPI engine outside ``mldist run`` this aborts the MPI job, so that ranks blocked in a
    collective with this one end too; a plain exit would wait for them in MPI_Finalize.
    """
    tell(error_line(message))
    engine = STATE.engine
    if engine is not None and not supervised():
        engine.abort(code)
    os._exit(code)


class Exit(SystemExit):
    """The SystemExit ``sys.exit`` raises once ``init`` ran: it remembers a code that ends the script.

    When the interpreter ends on it, it is freed from C with no Python frame on the stack:
    that is how a caught ``sys.exit(2)`` (argparse in a library, a test runner) tells itself
    apart from the one that really ends the process. Nothing more explicit tells them apart:
    that last one is freed before ``atexit`` runs and before ``sys.is_finalizing()`` turns true,
    and Python hands its exit code to no hook (:func:`mldist.runtime.compat.freed_by_the_interpreter`).
    """

    def __del__(self) -> None:
        if compat.freed_by_the_interpreter():
            _Ending.seen, _Ending.code = True, self.code


class _Ending:
    """The SystemExit that is ending the interpreter, once seen."""

    seen = False
    code: object = None


def sys_exit(status: object = None) -> NoReturn:
    """``sys.exit`` once ``init`` ran with 2+ workers (:mod:`mldist.runtime.start.patches`): raise :class:`Exit`.

    A literal ``raise SystemExit(n)`` is not seen.
    """
    raise Exit(status)


def ending_code() -> int | None:
    """The exit code the interpreter is ending with, when a ``sys.exit`` gave it, else None.

    Example:
        >>> ending_code() is None
        True
    """
    if not _Ending.seen:
        return None
    code = _Ending.code
    return 0 if code is None else code if isinstance(code, int) else 1


def at_exit() -> None:
    """``atexit`` (2+ workers): say how this rank leaves; on MPI, a code not taken together ends the group now.

    Codes 0 and 75 (requeue) are what every rank does at the end; for them the MPI and JAX
    engines' own exit handlers, which run next, wait for the others as MPI_Finalize would.
    """
    ctx, code = current(), ending_code()
    if ctx is None or ctx.size == 1 or code is None or code in TOGETHER:
        return
    message = f"exited with code {code} (sys.exit)"
    # An engine whose own exit handler waits for every rank (MPI_Finalize, jax.distributed's shutdown
    # barrier): a rank leaving alone must not reach it, or it waits for peers blocked on it.
    if STATE.engine is not None and STATE.engine.waits_at_exit:
        leave(message, code)
    tell(error_line(message))
