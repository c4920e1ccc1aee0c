"""``horovod.runner.util.threads.in_thread``: a function in a background thread, as Horovod's.

Example:
    >>> done = []
    >>> in_thread(done.append, args=(1,)).join(); done
    [1]
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any


def in_thread(
    target: Callable[..., Any],
    args: Sequence[Any] = (),
    name: str | None = None,
    daemon: bool = True,
    silent: bool = False,
) -> threading.Thread:
    """Start ``target(*args)`` in a new thread and return the thread.

    Args:
        target: the function.
        args: its arguments.
        name: the thread's name.
        daemon: whether the thread may be left running at exit (Horovod's default: yes).
        silent: swallow any exception ``target`` raises.
    """

    def quietly(*given: Any) -> None:
        with contextlib.suppress(Exception):
            target(*given)

    thread = threading.Thread(target=quietly if silent else target, args=tuple(args), name=name, daemon=daemon)
    thread.start()
    return thread
