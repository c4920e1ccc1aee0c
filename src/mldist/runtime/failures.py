"""Known collective failures as one line that names the rank and the cause.

TensorFlow reports a dead peer or mismatched shapes as pages of C++ context.
``init`` installs :func:`one_line_errors` as ``sys.excepthook`` so that such
an error, or any MldistError, ends a worker with one line instead.

Example:
    >>> explain_failure("... Shape mismatch in the collective instance 100 ...")[:27]
    'workers passed tensors of d'
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any, NoReturn

from ..errors import MldistError

#: Collective failures, recognised by a fragment of their message.
COLLECTIVE_FAILURES: tuple[tuple[str, str], ...] = (
    (
        "Shape mismatch in the collective",
        "workers passed tensors of different shapes to one collective; every rank must run the "
        "same steps on same-shaped batches (mldist.data.shard drops the uneven remainder)",
    ),
    (
        "The tasks have crashed",
        "another worker died or stopped answering; its own output names the first error",
    ),
    (
        "Collective ops is aborted",
        "a collective was aborted because another worker died or closed its connection; "
        "the launcher's output names the rank that failed first",
    ),
)


def explain_failure(message: str) -> str | None:
    """One-line explanation of a known collective failure, else None.

    Args:
        message: the exception's text.
    """
    for fragment, explanation in COLLECTIVE_FAILURES:
        if fragment in message:
            return explanation
    return None


def fatal(message: str, code: int = 1) -> NoReturn:
    """Print ``mldist: error (rank R): message`` and end the process at once with ``code``.

    For errors found inside a graph callback on every rank at once: raising there
    would make TensorFlow log the Python traceback twice before any hook could run.
    """
    from .worker import current

    ctx = current()
    where = f" (rank {ctx.rank})" if ctx is not None else ""
    print(f"mldist: error{where}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def one_line_errors(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None, previous: Any = sys.excepthook
) -> None:
    """``sys.excepthook``: mldist errors and known collective failures print as one line naming the rank.

    On the MPI engine the process then aborts the MPI job: exiting normally would run
    MPI_Finalize, which waits for ranks that may be blocked in a collective with this one.
    """
    from .worker import current

    ctx = current()
    where = f" (rank {ctx.rank})" if ctx is not None else ""
    if isinstance(exc, MldistError):
        print(f"mldist: error{where}: {exc}", file=sys.stderr, flush=True)
    elif explained := explain_failure(str(exc)):
        print(f"mldist: error{where}: {explained} ({kind.__name__})", file=sys.stderr, flush=True)
    else:
        previous(kind, exc, tb)
    if ctx is not None and ctx.communication == "mpi":
        from .mpi_engine import abort

        abort(130 if issubclass(kind, KeyboardInterrupt) else 1)
