"""Asking thousands of hosts at once without a thread per host: TCP connects and ssh probes in a window.

``mldist run -H`` checks every host before mpiexec starts (mpiexec would wait for ever on a silent
one), and an elastic run asks them again after a failure. With 4,096 hosts, one thread or one ssh
per host in waves of 64 takes minutes. Here a host is asked in two steps, each a sliding window of
non-blocking work that one thread polls with :mod:`selectors`:

1. :func:`tcp_screen`: a TCP connect to its ssh port (when ssh reaches the hosts directly: no
   ProxyCommand, no HostName alias; :func:`direct_port` asks ``ssh -G`` of a sample). A host that
   does not take the connection within the timeout, refuses it, or whose name does not resolve is
   silent at once, without an ssh process;
2. :func:`run_all`: the command (``ssh HOST true``) only for the hosts that took it.

So a check of H hosts takes about one connect timeout for the silent ones and one more for the
rest, whatever H; the window is bounded by the open-file limit (:func:`window`), and
:func:`descriptor_plan` says what a launch over hosts holds open in all.

Example:
    >>> window(4096, soft_limit=20000)
    2048
    >>> descriptor_plan(4096, 4)["total"] < 4096
    True
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import selectors
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: Descriptors the launcher keeps beside its probes and pipes (Python, its imports, the run directory).
BASE_FDS = 64
#: Most TCP connects in flight at once: two windows cover 4,096 hosts, and a launch stays under 4,096 files.
TCP_WINDOW = 2048
#: Most ssh processes at once (each a process and its stderr pipe).
SSH_WINDOW = 256
#: Descriptors left free under the soft limit while probing (the launcher's own files, mpiexec's pipes).
RESERVE_FDS = 128
#: Open rank logs of a run on hosts: one per host, at least 8, at most 256; the others open when they write.
LOGS_MIN, LOGS_MAX = 8, 256
#: Hosts whose ``ssh -G`` is asked to tell whether ssh reaches them directly.
SAMPLE = 8


def window(hosts: int, soft_limit: int, cap: int = TCP_WINDOW) -> int:
    """How many probes may be in flight at once: at most ``cap``, and what the open-file limit leaves.

    Example:
        >>> window(10, 1024), window(4096, 1024), window(4096, 20000)
        (10, 896, 2048)
    """
    return max(1, min(hosts, cap, soft_limit - RESERVE_FDS))


def open_logs(hosts: int, ranks: int) -> int:
    """How many rank logs the launcher keeps open for a run on ``hosts`` hosts (grows with hosts).

    Example:
        >>> open_logs(4, 8), open_logs(4, 16), open_logs(4096, 16384)
        (8, 8, 256)
    """
    return min(ranks, max(LOGS_MIN, min(hosts, LOGS_MAX)))


def descriptor_plan(hosts: int, slots: int, soft_limit: int = 1 << 20) -> dict[str, int]:
    """The launcher's open files for ``hosts`` hosts of ``slots`` ranks each, part by part, and the peak.

    The host check and the run do not overlap: the peak is the base and the larger of the two. Remote
    ranks' output reaches the launcher through mpiexec's two pipes (its daemons carry it, one stream
    per host), so nothing here grows with the ranks.

    Example:
        >>> descriptor_plan(4096, 4)
        {'base': 64, 'host check': 2048, 'mpiexec pipes': 2, 'rank logs': 256, 'total': 2112}
    """
    check = max(window(hosts, soft_limit), window(hosts, soft_limit, SSH_WINDOW))
    logs = open_logs(hosts, hosts * slots)
    plan = {"base": BASE_FDS, "host check": check, "mpiexec pipes": 2, "rank logs": logs}
    plan["total"] = BASE_FDS + max(check, 2 + logs)
    return plan


def soft_limit() -> int:
    """This process's soft open-file limit (a large number when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def direct_port(agent: Sequence[str], hosts: Sequence[str], env: Mapping[str, str]) -> int | None:
    """The port ssh connects to when it reaches ``hosts`` directly, else None (a ProxyCommand or ProxyJump,
    a HostName other than the name, a program that is not ssh): asked of ``ssh -G`` for a sample of them.

    Example::

        direct_port(["ssh", "-F", "/t/cfg"], ["hx1", "hx2"], os.environ)   # 22
    """
    if not hosts or os.path.basename(agent[0]) != "ssh":
        return None
    picks = sorted({round(i * (len(hosts) - 1) / max(1, SAMPLE - 1)) for i in range(SAMPLE)})
    sample = [hosts[i] for i in picks]
    try:
        with ThreadPoolExecutor(max_workers=len(sample)) as pool:
            said = list(pool.map(lambda h: _ssh_g(agent, h, env), sample))
    except (OSError, subprocess.SubprocessError):
        return None
    ports = set()
    for host, options in zip(sample, said, strict=True):
        direct = options.get("hostname", "").lower() == host.lower()
        proxied = any(options.get(key, "none") != "none" for key in ("proxycommand", "proxyjump"))
        if not direct or proxied or not options.get("port", "").isdigit():
            return None
        ports.add(int(options["port"]))
    return ports.pop() if len(ports) == 1 else None


def _ssh_g(agent: Sequence[str], host: str, env: Mapping[str, str]) -> dict[str, str]:
    res = subprocess.run([*agent, "-G", host], capture_output=True, text=True, timeout=10, env=dict(env), check=True)
    return dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)


#: A refused or unreachable connect, in ssh's words (mldist.launch.hosts.why_silent reads them).
_SAID = {
    errno.ECONNREFUSED: "connect to host {host} port {port}: Connection refused",
    errno.EHOSTUNREACH: "connect to host {host} port {port}: No route to host",
    errno.ENETUNREACH: "connect to host {host} port {port}: Network is unreachable",
}


def _address(host: str, port: int, listed: Mapping[str, str] | None = None) -> tuple[int, tuple[object, ...]] | None:
    """Where ``host``'s ssh port is: its /etc/hosts line (``listed``), else the resolver's first answer."""
    with contextlib.suppress(OSError, UnicodeError, ValueError):
        if listed and host.lower() in listed:
            address = listed[host.lower()]
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return int(family), (address, port)
        family, _, _, _, found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        return int(family), tuple(found)
    return None


def hosts_file(nsswitch: str = "/etc/nsswitch.conf", path: str = "/etc/hosts") -> dict[str, str]:
    """Each name of /etc/hosts and its first address, read once, when the resolver asks that file first
    ({} otherwise): glibc reads the whole file again for every name, and a cluster's file lists every node
    (4,096 names in a 4,096-line file: seconds of parsing).

    Example::

        hosts_file()   # {"localhost": "127.0.0.1", "node1": "10.1.0.1", ...}
    """
    try:
        lines = Path(nsswitch).read_text().splitlines()
        order = next((line.split(":", 1)[1].split() for line in lines if line.strip().startswith("hosts:")), [])
        if order[:1] != ["files"]:
            return {}
        table = Path(path).read_text(errors="replace").splitlines()
    except (OSError, IndexError):
        return {}
    found: dict[str, str] = {}
    for line in table:
        address, *names = line.split("#", 1)[0].split() or [""]
        for name in names:
            found.setdefault(name.lower(), address)
    return found


def _said(code: int, host: str, port: int) -> str:
    """ssh's words for a connect that failed with errno ``code``."""
    return _SAID.get(code, "ssh: connect to host {host} port {port}: " + os.strerror(code)).format(host=host, port=port)


class _Connects:
    """Non-blocking connects in flight, polled by one selector; each host with its own deadline."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port, self.timeout = port, timeout
        self.sel = selectors.DefaultSelector()
        self.flying: dict[socket.socket, tuple[str, float]] = {}
        self.silent: dict[str, str] = {}

    def start(self, host: str, found: tuple[int, tuple[object, ...]] | None) -> None:
        if found is None:
            self.silent[host] = f"ssh: Could not resolve hostname {host}: Name or service not known"
            return
        sock = socket.socket(found[0], socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(found[1])
        if code in (0, errno.EINPROGRESS):
            self.sel.register(sock, selectors.EVENT_WRITE)
            self.flying[sock] = (host, time.monotonic() + self.timeout)
            return
        self.silent[host] = _said(code, host, self.port)
        sock.close()

    def poll(self, most_s: float) -> None:
        """Wait up to ``most_s`` (or the nearest deadline) for connects to end; note those that failed."""
        soonest = min((t for _, t in self.flying.values()), default=time.monotonic())
        for key, _ in self.sel.select(max(0.0, min(soonest - time.monotonic(), most_s))):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            host, _ = self.flying[sock]
            if code := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.silent[host] = _said(code, host, self.port)
            self.drop(sock)
        now = time.monotonic()
        for sock, (host, deadline) in list(self.flying.items()):
            if now >= deadline:
                self.silent[host] = ""
                self.drop(sock)

    def drop(self, sock: socket.socket) -> None:
        del self.flying[sock]
        self.sel.unregister(sock)
        sock.close()

    def close(self) -> None:
        for sock in list(self.flying):
            self.drop(sock)
        self.sel.close()


def tcp_screen(hosts: Sequence[str], port: int, timeout: float, most: int) -> dict[str, str]:
    """The hosts whose ssh port does not take a TCP connection within ``timeout`` seconds, each with ssh's
    words for it ("" for a timeout, else "Could not resolve hostname", "Connection refused", ...).

    At most ``most`` connects are in flight; each host gets its full ``timeout`` from its own connect.
    Names resolve in a few threads (a resolver may wait on DNS) while the first connects are under way;
    more than 64 are looked up in /etc/hosts first, read once (:func:`hosts_file`).

    Example::

        tcp_screen(["hx1", "hx9"], 22, 5, 2048)   # {"hx9": ""} when hx9 drops the packets
    """
    connects, listed = _Connects(port, timeout), hosts_file() if len(hosts) > 64 else {}
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        resolved = zip(hosts, pool.map(lambda h: _address(h, port, listed), hosts), strict=True)
        try:
            for host, found in resolved:
                while len(connects.flying) >= most:
                    connects.poll(0.5)
                connects.start(host, found)
                connects.poll(0.0)
            while connects.flying:
                connects.poll(0.5)
        finally:
            connects.close()
    return {host: connects.silent[host] for host in hosts if host in connects.silent}


#: How :func:`run_all`'s stderr of a host begins when its command could not start (then the reason).
NOT_STARTED = "mldist: cannot start: "
#: What :func:`run_all` found for a host: its exit code (None: it did not end in time) and its stderr.
Outcome = tuple[int | None, str]


def run_all(
    hosts: Sequence[str],
    argv: Callable[[str], list[str]],
    env: Mapping[str, str],
    timeout: float,
    most: int = SSH_WINDOW,
) -> dict[str, Outcome]:
    """``argv(host)`` for every host, at most ``most`` at once, each killed ``timeout`` seconds after its
    start: the exit code (None when killed or when it could not start) and the stderr of each.

    One thread polls every process's stderr pipe (:mod:`selectors`); its end is the process's end.

    Example::

        run_all(["hx1"], lambda h: ["ssh", h, "true"], os.environ, 12)   # {"hx1": (0, "")}
    """
    found: dict[str, Outcome] = {}
    todo, said = list(reversed(hosts)), {h: bytearray() for h in hosts}
    sel = selectors.DefaultSelector()
    flying: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    try:
        while todo or flying:
            while todo and len(flying) < most:
                host = todo.pop()
                try:
                    proc = subprocess.Popen(argv(host), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, env=dict(env))  # fmt: skip
                except OSError as exc:
                    found[host] = (None, f"{NOT_STARTED}{argv(host)[0]}: {exc.strerror}")
                    continue
                assert proc.stderr is not None
                sel.register(proc.stderr, selectors.EVENT_READ, host)
                flying[host] = (proc, time.monotonic() + timeout)
            soonest = min(t for _, t in flying.values()) if flying else time.monotonic()
            for key, _ in sel.select(max(0.0, min(soonest - time.monotonic(), 0.5))):
                host, chunk = key.data, os.read(key.fd, 65536)
                said[host] += chunk[: max(0, 8192 - len(said[host]))]
                if not chunk:  # its stderr closed: the process ended (or closed it; wait briefly)
                    proc, _ = flying.pop(host)
                    sel.unregister(key.fileobj)
                    proc.stderr.close()  # type: ignore[union-attr]
                    found[host] = (_ended(proc), said[host].decode(errors="replace"))
            now = time.monotonic()
            for host, (proc, deadline) in list(flying.items()):
                if now >= deadline:
                    del flying[host]
                    sel.unregister(proc.stderr)  # type: ignore[arg-type]
                    proc.kill()
                    proc.wait()
                    proc.stderr.close()  # type: ignore[union-attr]
                    found[host] = (None, said[host].decode(errors="replace"))
    finally:
        for proc, _ in flying.values():
            proc.kill()
            proc.wait()
        sel.close()
    return {host: found[host] for host in hosts}


def _ended(proc: subprocess.Popen[bytes]) -> int | None:
    """The exit code of a process whose stderr closed: it ends at once, or is killed after a second."""
    try:
        return proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
