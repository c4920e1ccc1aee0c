"""Known collective failures as one line that names the rank and the cause.

TensorFlow reports a dead peer or mismatched shapes as pages of C++ context.
``init`` installs :func:`one_line_errors` as ``sys.excepthook`` so that such
an error, or any MldistError, ends a worker with one line instead, through
the runtime's one exit path (:func:`mldist.runtime.leave.leave`).

Example:
    >>> explain_failure("... Shape mismatch in the collective instance 100 ...")[:27]
    'workers passed tensors of d'
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from ..errors import MldistError
from .context import current
from .leave import error_line, leave, tell

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


def describe(kind: type[BaseException], exc: BaseException) -> tuple[str, bool]:
    """How an uncaught exception is said in one line, and whether its traceback is worth showing.

    Example:
        >>> describe(ValueError, ValueError("bad value\\nmore"))
        ('raised ValueError: bad value', True)
    """
    if isinstance(exc, MldistError):
        return str(exc), False
    if explained := explain_failure(str(exc)):
        return f"{explained} ({kind.__name__})", False
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"raised {kind.__name__}" + (f": {first}" if first else ""), True


def one_line_errors(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None, previous: Any = sys.excepthook
) -> None:
    """``sys.excepthook``: one line naming the rank and the exception; with 2+ workers the rank then leaves.

    Unknown exceptions keep their traceback (printed first). With 2+ workers the process ends
    through :func:`leave`: on the MPI engine a normal exit would wait in MPI_Finalize for ranks
    that may be blocked in a collective with this one.
    """
    message, traceback_too = describe(kind, exc)
    if traceback_too:
        previous(kind, exc, tb)
    ctx = current()
    if ctx is None or ctx.size == 1:
        tell(error_line(message))
        return
    leave(message, 130 if issubclass(kind, KeyboardInterrupt) else 1)
