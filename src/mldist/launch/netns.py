"""A private network namespace for the workers of one ``mldist run`` (TensorFlow's engines).

TensorFlow's gRPC server listens on every interface with no authentication, and
any process that reaches a worker's port can run operations inside it. When the
workers of a run share one host, they need nothing but loopback: ``mldist run``
starts a holder process in a new network namespace (``unshare``; a user namespace
too when not root), brings its loopback up, and starts every worker inside it
(``nsenter``). Other hosts and other users' processes cannot reach the ports; the
workers have no other network either, which ``--network host`` restores.

Run as a module, this is the holder: it brings ``lo`` up, prints ``ready`` and
keeps the namespace alive until its stdin (a pipe from the launcher) closes.

Example::

    net = PrivateNetwork.start()          # None if the platform does not allow it
    argv = net.enter(["python", "train.py"]) if net else ["python", "train.py"]
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence

from ..base.procs import die_with_parent

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_READY_SECONDS = 10.0


def loopback_up() -> None:
    """Bring ``lo`` up in this process's network namespace (a new one starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def holder_argv(as_root: bool, python: str = sys.executable) -> list[str]:
    """The holder's command: a new network namespace (and user namespace unless root).

    Example:
        >>> holder_argv(True, "python")
        ['unshare', '--net', '--', 'python', '-m', 'mldist.launch.netns']
    """
    user = [] if as_root else ["--user", "--map-root-user"]
    return ["unshare", "--net", *user, "--", python, "-m", "mldist.launch.netns"]


def enter_argv(holder: int, as_root: bool, command: Sequence[str]) -> list[str]:
    """``command`` run inside the holder's namespaces, keeping this user's credentials.

    Example:
        >>> enter_argv(42, True, ["python", "train.py"])
        ['nsenter', '--net=/proc/42/ns/net', '--', 'python', 'train.py']
    """
    user = [] if as_root else [f"--user=/proc/{holder}/ns/user", "--preserve-credentials"]
    return ["nsenter", f"--net=/proc/{holder}/ns/net", *user, "--", *command]


class PrivateNetwork:
    """A running holder; ``enter`` wraps worker commands, ``close`` ends the namespace."""

    def __init__(self, holder: subprocess.Popen[bytes], as_root: bool) -> None:
        self.holder, self.as_root = holder, as_root

    @classmethod
    def start(cls) -> PrivateNetwork | str:
        """A private network, or the reason there is none (tools missing, namespaces not allowed)."""
        missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
        if missing:
            return f"{' and '.join(missing)} not found"
        as_root = os.geteuid() == 0

        holder = subprocess.Popen(
            holder_argv(as_root),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], _READY_SECONDS)
        if ready and holder.stdout.readline().strip() == b"ready":
            return cls(holder, as_root)
        holder.kill()
        _, err = holder.communicate()
        lines = err.decode(errors="replace").strip().splitlines()
        return f"unshare failed: {lines[-1] if lines else 'no answer'}"

    def enter(self, command: Sequence[str]) -> list[str]:
        """``command`` inside this network."""
        return enter_argv(self.holder.pid, self.as_root, command)

    def close(self) -> None:
        """End the holder (and with it the namespace once the workers are gone)."""
        if self.holder.stdin is not None:
            self.holder.stdin.close()
        try:
            self.holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()


def main() -> int:
    """The holder: loopback up, ``ready``, then wait for the launcher to close stdin."""
    try:
        loopback_up()
    except OSError as exc:
        print(f"cannot bring the loopback up: {exc.strerror}", file=sys.stderr, flush=True)
        return 1
    print("ready", flush=True)
    while sys.stdin.buffer.read(4096):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
