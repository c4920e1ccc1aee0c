"""Known collective failures as one line that names the rank and the cause.

TensorFlow reports a dead peer or mismatched shapes as pages of C++ context.
``init`` installs :func:`one_line_errors` as ``sys.excepthook`` so that such
an error, or any MldistError, ends a worker with one line instead, through
the runtime's one exit path (:func:`mldist.runtime.watch.leave.leave`).

Example:
    >>> explain_failure("... Shape mismatch in the collective instance 100 ...")[:27]
    'workers passed tensors of d'
"""

from __future__ import annotations

import re
import sys
from types import TracebackType
from typing import Any

from ...errors import CollectiveMismatch, ConfigError, MldistError
from ..context import current
from .frames import _library, _short
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
    (
        "passed to device_put is not the same on each process",
        "on KERAS_BACKEND=jax every worker must build the model with the same initial weights: "
        "seed alike on every rank (keras.utils.set_random_seed(N), not N + rank) or not at all "
        "(mldist.init() seeds all ranks alike)",
    ),
    (
        "JAX distributed service detected fatal errors",
        "another worker died or stopped answering JAX's coordinator; its own output names the first error",
    ),
)


_MISMATCH = re.compile(r"workers passed tensors of different [^\n]*")
#: How TensorFlow's autograph opens the error of a traced function (``tf.function``, ``fit``): the frames
#: it went through, then the error itself on the last line.
USER_CODE = "in user code:"
_FRAME = re.compile(r'File "([^"\n]+)", line ([0-9]+), in ')
_NAMED = re.compile(r"[A-Za-z_][\w.]*: ")


def traced(kind: type[BaseException], message: str) -> str | None:
    """What went wrong inside a traced function, as autograph's ``in user code:`` error says it: its last
    line, and the user's ``file:line`` (the innermost frame outside the libraries); None for other errors.

    Example:
        >>> traced(TypeError, 'in user code:\\n\\n    File "/t/s.py", line 6, in f  *\\n        return fns(x)\\n\\n'
        ...        "    TypeError: 'list' object is not callable\\n")
        "TypeError: 'list' object is not callable (at /t/s.py:6)"
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) < 2 or lines[0] != USER_CODE:
        return None
    frames = _FRAME.findall(message)
    mine = [f for f in frames if not _library(f[0])] or frames
    where = f" (at {_short(mine[-1][0])}:{mine[-1][1]})" if mine else ""
    said = lines[-1] if _NAMED.match(lines[-1]) else f"{kind.__name__}: {lines[-1]}"
    return said + where


def mismatch_line(message: str) -> str | None:
    """The CollectiveMismatch line inside a (TensorFlow) error's text, else None.

    Example:
        >>> mismatch_line("{{node PyFunc}} CollectiveMismatch: workers passed tensors of different shapes (a)\\nMore")
        'workers passed tensors of different shapes (a)'
    """
    found = _MISMATCH.search(message)
    return found.group(0).strip() if found else None


class Deferred:
    """A mismatch found while an eager call's graph runs, raised by that call once the graph returns.

    Raising inside the graph would make TensorFlow log the error with a traceback on every
    rank before the caller sees it; the eager call raises it cleanly instead.
    """

    active = 0
    found: str | None = None

    @classmethod
    def note(cls, line: str) -> bool:
        """Keep ``line`` for the eager call in progress (True), or False when none is (raise it now)."""
        if cls.active:
            cls.found = line
        return bool(cls.active)

    @classmethod
    def take(cls) -> str | None:
        found, cls.found = cls.found, None
        return found


#: TensorFlow error classes that are also mldist errors, made on first use (importing TensorFlow).
_BOTH: dict[tuple[str, type[Exception]], type[Exception]] = {}


def _tf_error(tf_name: str, ours: type[Exception], line: str) -> Exception:
    """``tf.errors.<tf_name>`` that is also ``ours``, with ``line`` as its whole text."""
    if (tf_name, ours) not in _BOTH:
        import tensorflow as tf

        base = getattr(tf.errors, tf_name)

        def __init__(self: Any, message: str) -> None:
            base.__init__(self, None, None, message)

        def __str__(self: Any) -> str:
            return str(self.message)

        attrs = {"__init__": __init__, "__str__": __str__, "__doc__": f"{tf_name}, and {ours.__name__}."}
        _BOTH[(tf_name, ours)] = type(f"{ours.__name__}Error", (base, ours), attrs)
    return _BOTH[(tf_name, ours)](line)


def mismatch(line: str) -> Exception:
    """Horovod's error for ranks that disagreed: a ``tf.errors.FailedPreconditionError`` that is also
    a :class:`CollectiveMismatch`, with the one ``line`` as its text.
    """
    return _tf_error("FailedPreconditionError", CollectiveMismatch, line)


def invalid_argument(line: str) -> Exception:
    """A ``tf.errors.InvalidArgumentError`` that is also a :class:`ConfigError` (Horovod's type for
    bad arguments to a collective; mldist's one line as its text)."""
    return _tf_error("InvalidArgumentError", ConfigError, line)


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
        >>> describe(KeyboardInterrupt, KeyboardInterrupt())
        ('stopped by SIGINT (Ctrl-C)', False)
    """
    if isinstance(exc, MldistError):
        return str(exc), False
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or the launcher passing on its SIGINT: no traceback
        return "stopped by SIGINT (Ctrl-C)", False
    if line := mismatch_line(str(exc)):
        return line, False
    if explained := explain_failure(str(exc)):
        return f"{explained} ({kind.__name__})", False
    if said := traced(kind, str(exc)):
        return f"raised {said}", True
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
