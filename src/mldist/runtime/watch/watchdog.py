"""Workers of ``mldist run`` end with their launcher, even behind a wrapper that forks.

The launcher asks the kernel to kill each worker it starts when it dies
(``PR_SET_PDEATHSIG``), but that reaches only its direct child: a ``train.sh``
that runs ``python`` without ``exec`` leaves the Python process behind, holding
its ports. So ``mldist.init()`` watches the launcher named in
``MLDIST_LAUNCHER_PID`` (a pidfd: no polling, no confusion with a reused pid)
and, when it is gone, kills the worker's own process group: the wrapper, this
process and whatever else the worker started.

Example::

    watch_launcher(os.environ)   # mldist.init() does this
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Mapping

from ...base import envvalues
from ...errors import ConfigError

_POLL_SECONDS = 1.0


def _in_own_group(launcher: int, env: Mapping[str, str]) -> bool:
    """Whether this process's group is one ``mldist run`` made for its worker, apart from the launcher's.

    ``mldist run`` starts every worker in a new session, or (mpiexec's shim, ``MLDIST_WORKER_GROUP=1``)
    in a new process group; anything else (the variable set by hand in a shell, a worker started some
    other way) is left alone.
    """
    group = os.getpgrp()
    if group != os.getsid(0) and not envvalues.WORKER_GROUP.read(env):
        return False
    try:
        return os.getpgid(launcher) != group
    except ProcessLookupError:
        return True  # the launcher is already gone: this group is what it left behind


def _stop_group(launcher: int) -> None:
    with contextlib.suppress(OSError):  # stderr may be a pipe to the dead launcher: nobody reads it
        print(f"mldist: the launcher (pid {launcher}) is gone; stopping this worker", file=sys.stderr, flush=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _wait_for_exit(launcher: int) -> None:
    try:
        fd = os.pidfd_open(launcher)
    except ProcessLookupError:
        _stop_group(launcher)
        return
    except (OSError, AttributeError):  # no pidfds (old kernel): poll
        while True:
            try:
                os.kill(launcher, 0)
            except ProcessLookupError:
                _stop_group(launcher)
                return
            except PermissionError:
                pass
            threading.Event().wait(_POLL_SECONDS)
    select.select([fd], [], [])
    _stop_group(launcher)


def watch_launcher(env: Mapping[str, str]) -> bool:
    """Start the watch if ``env`` names a launcher in another process group; whether it started."""
    # A value that is not a pid was set by hand, not by mldist run: the worker is left alone, as when unset.
    try:
        launcher = envvalues.LAUNCHER_PID.read(env)
    except ConfigError:
        return False
    if launcher is None or not _in_own_group(launcher, env):
        return False
    threading.Thread(target=_wait_for_exit, args=(launcher,), name="mldist-watchdog", daemon=True).start()
    return True
