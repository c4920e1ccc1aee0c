"""Process helpers shared by the launcher and the tools: free ports, dying with the parent, start-up noise.

``mldist run`` (mldist.launch) and the tools that start a process of their own
(``mldist tensorboard``) or read a worker's output (``mldist env``) need the same
few things; they live here so that the tools need not import the launcher.

Example:
    >>> len(set(free_ports(2)))
    2
    >>> bool(STARTUP_NOISE.search(b"I0000 cpu_feature_guard.cc:210] This TensorFlow binary is optimized"))
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import signal
import socket

#: TensorFlow's start-up notices, printed by every rank (some twice): shown only with ``--verbose``.
STARTUP_NOISE = re.compile(
    rb"oneDNN custom operations are on|All log messages before absl::InitializeLog\(\) is called"
    rb"|cpu_feature_guard\.cc|To enable the following instructions:|rebuild TensorFlow with the appropriate"
    rb"|Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered"
    rb"|oneDNN supports DT_HALF only|TF-TRT Warning|Could not find cuda drivers|port\.cc:\d+\] oneDNN"
)
_PR_SET_PDEATHSIG = 1  # prctl's option number (linux/prctl.h)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that are free now (all held open while choosing).

    Args:
        n: how many ports.
        host: the address they are free on.

    Example:
        >>> len(set(free_ports(3)))
        3
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (runs between fork and exec).

    Example::

        subprocess.Popen(argv, preexec_fn=die_with_parent)
    """
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
