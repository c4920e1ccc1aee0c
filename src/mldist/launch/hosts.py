"""Hosts for ``mldist run -H`` / ``--hostfile`` and ``horovod.run(hosts=)``: ``(host, slots)`` pairs, and
the check that each answers over mpiexec's ssh before the run starts (:func:`silent_hosts`).

Example:
    >>> parse_hosts("node1:2,node2")
    (('node1', 2), ('node2', 1))
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..placement.allocation import read_nodefile as _nodefile
from ..placement.hostlist import host_entry
from . import fanout
from .config import CONNECT_TIMEOUT


def parse_hosts(text: str, flag: str = "-H") -> tuple[tuple[str, int], ...]:
    """``(host, slots)`` of a ``host:slots,...`` list (or hostfile lines joined by commas).

    Example:
        >>> parse_hosts("node1:2,node2")
        (('node1', 2), ('node2', 1))
    """
    out: list[tuple[str, int]] = []
    for number, item in enumerate(text.split(","), 1):
        if not item.strip():  # 'a,,b' or 'a,': a host left out by a slip, not a separator to skip
            raise ConfigError(f"{flag} {text!r}: entry {number} is empty; write host:slots,... (e.g. node1:2,node2:2)")
        entry = host_entry(item)
        if entry is None:
            raise ConfigError(f"{flag} {text!r}: write host:slots,... (e.g. node1:2,node2:2)")
        if entry[0] in {host for host, _ in out}:
            raise ConfigError(f"{flag} {text!r} names {entry[0]} twice; name each host once with all its slots")
        out.append((entry[0], 1 if entry[1] is None else entry[1]))
    if not out or sum(slots for _, slots in out) < 1:
        raise ConfigError(f"{flag} {text!r} gives no slots")
    return tuple(out)


def read_hostfile(path: str) -> tuple[tuple[str, int], ...]:
    """The hosts of a hostfile: 'host', 'host:slots' or 'host slots=N' per line; '#' starts a comment."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"--hostfile {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # a program or an image named by a slip
        raise ConfigError(
            f"--hostfile {path!r} is not a text file of hosts (byte {exc.start} is not UTF-8); "
            "write 'host', 'host:2' or 'host slots=2' lines"
        ) from None
    items: list[tuple[str, int]] = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        entry = host_entry(line, hostfile=True)
        if entry is None:
            raise ConfigError(f"--hostfile {path!r} line {number}: {line!r}; write 'host', 'host:2' or 'host slots=2'")
        items.append((entry[0], 1 if entry[1] is None else entry[1]))
    if not items:
        raise ConfigError(f"--hostfile {path!r} names no host; write 'host', 'host:2' or 'host slots=2' lines")
    slots: dict[str, int] = {}
    for host, n in items:  # a host on several lines has their slots together, as in Open MPI's hostfiles
        slots[host] = slots.get(host, 0) + n
    return parse_hosts(",".join(f"{host}:{n}" for host, n in slots.items()), "--hostfile")


def this_host() -> set[str]:
    """The names under which this host may appear in a host list."""
    return {"localhost", "127.0.0.1", socket.gethostname().lower(), socket.getfqdn().lower()}  # as host_entry gives


def read_nodefile(path: str) -> tuple[tuple[str, int], ...]:
    """The hosts of a PBS node file (one line per slot), in order."""
    try:
        return _nodefile(path)
    except OSError as exc:
        raise ConfigError(f"PBS node file {path!r}: {exc.strerror}; use --local") from None


#: Seconds beyond ``--connect-timeout`` the whole check may take (a login that hangs after the handshake).
_CHECK_SLACK = 2.0
#: ssh's own words, and what they mean for the user: the first that matches ssh's last line wins.
_SSH_SAYS = (
    ("Could not resolve hostname", "the name does not resolve (not in /etc/hosts or DNS); check the spelling"),
    ("Name or service not known", "the name does not resolve (not in /etc/hosts or DNS); check the spelling"),
    ("Connection refused", "nothing listens for ssh there (is sshd running?)"),
    ("Permission denied", "it refuses the login (a key-based login must work: ssh HOST true)"),
    ("Host key verification failed", "its host key is unknown or changed (ssh HOST once to check it)"),
    ("No route to host", "no route leads there (is it up, on this network?)"),
)


def ssh_agent(env: Mapping[str, str], connect_timeout: float) -> list[str]:
    """The command mpiexec reaches the hosts with (Open MPI's ``plm_ssh_agent``), for a check of its own:
    never a password prompt, and a bound on the connection and the handshake.

    Example:
        >>> ssh_agent({"PRTE_MCA_plm_ssh_agent": "ssh -F /t/cfg"}, 5)
        ['ssh', '-F', '/t/cfg', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=5']
    """
    agent = env.get("PRTE_MCA_plm_ssh_agent") or env.get("OMPI_MCA_plm_rsh_agent") or "ssh"
    wait = max(1, round(connect_timeout))  # ssh takes whole seconds
    return [*shlex.split(agent.split(":")[0]), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={wait}"]


#: ssh's keepalives on mpiexec's sessions to the hosts: a host whose sshd answers none for
#: ServerAliveInterval x ServerAliveCountMax seconds (frozen, or cut off: no connection ever closes) ends its
#: session, so mpiexec reports it lost instead of waiting for its daemon for ever.
KEEPALIVE = ("-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")


def keepalive_agent(env: Mapping[str, str]) -> str | None:
    """mpiexec's ssh agent (``PRTE_MCA_plm_ssh_agent``) with :data:`KEEPALIVE`, or None to leave it as it is:
    an agent that is not ssh (rsh, a site's wrapper) or that sets ServerAlive options of its own.

    Example:
        >>> keepalive_agent({"PRTE_MCA_plm_ssh_agent": "ssh -F /t/cfg : rsh"})
        'ssh -F /t/cfg -o ServerAliveInterval=5 -o ServerAliveCountMax=3 : rsh'
        >>> keepalive_agent({"PRTE_MCA_plm_ssh_agent": "/site/bin/launch"}) is None
        True
    """
    agent = env.get("PRTE_MCA_plm_ssh_agent") or env.get("OMPI_MCA_plm_rsh_agent") or "ssh"
    first, colon, rest = agent.partition(":")  # Open MPI's alternatives: "ssh : rsh"
    words = shlex.split(first)
    if not words or os.path.basename(words[0]) != "ssh" or "ServerAlive" in first:
        return None
    return f"{first.strip()} {' '.join(KEEPALIVE)}" + (f" {colon}{rest}" if colon else "")


def why_silent(host: str, said: str, timeout: float, timed_out: bool = False) -> str:
    """The reason a host failed the check, in words, from ssh's stderr (``said``), its last line kept.

    Example:
        >>> why_silent("b", "ssh: Could not resolve hostname b: Name or service not known", 10)[:46]
        'host b: the name does not resolve (not in /etc'
        >>> why_silent("hx2", "", 3, timed_out=True)[:46]
        'host hx2 does not answer over ssh within 3 s; '
    """
    last = next((line.strip() for line in reversed(said.splitlines()) if line.strip()), "")
    if timed_out or "timed out" in last:
        return (
            f"host {host} does not answer over ssh within {timeout:g} s; check that it is up, or give it "
            "longer (--connect-timeout)"
        )
    meaning = next((words for text, words in _SSH_SAYS if text in last), "ssh to it fails")
    return f"host {host}: {meaning} ({last[:160] or 'ssh said nothing'})"


def silent_hosts(hosts: Sequence[str], env: Mapping[str, str], timeout: float = CONNECT_TIMEOUT) -> dict[str, str]:
    """The hosts that do not run ``true`` over mpiexec's ssh within ``timeout`` seconds, each with the reason
    (:func:`why_silent`), in the order given; thousands of hosts in about twice ``timeout``.

    When ssh reaches the hosts directly (:func:`mldist.launch.fanout.direct_port`), a TCP connect to the ssh
    port finds the silent ones first, all at once; ssh then runs only on those that took it, in a window
    (:func:`mldist.launch.fanout.run_all`). ssh's ConnectTimeout bounds its connection and the handshake;
    the process's own timeout bounds the rest (a login that hangs afterwards, on a home directory that
    does not answer).

    Args:
        hosts: the host names, as mpiexec will reach them (ssh resolves them, with its config's aliases).
        env: the environment mpiexec gets (its ssh agent: ``PRTE_MCA_plm_ssh_agent``).
        timeout: ``--connect-timeout``.

    Example::

        silent_hosts(["node1", "node2"], os.environ, 10)   # {} when both answer
    """
    agent, limit = ssh_agent(env, timeout), fanout.soft_limit()
    port = fanout.direct_port(agent, hosts, env)
    screened = {} if port is None else fanout.tcp_screen(hosts, port, timeout, fanout.window(len(hosts), limit))
    found = {host: why_silent(host, said, timeout, timed_out=not said) for host, said in screened.items()}
    rest = [host for host in hosts if host not in screened]
    most = fanout.window(len(rest), limit, fanout.SSH_WINDOW)
    for host, (code, said) in fanout.run_all(
        rest, lambda h: [*agent, h, "true"], env, timeout + _CHECK_SLACK, most
    ).items():
        if said.startswith(fanout.NOT_STARTED):
            why = said[len(fanout.NOT_STARTED) :]
            found[host] = f"host {host}: ssh does not run ({why}); set PRTE_MCA_plm_ssh_agent"
        elif code != 0:
            found[host] = why_silent(host, said, timeout, timed_out=code is None)
    return {host: found[host] for host in hosts if host in found}


def summary(silent: Mapping[str, str], named: int = 5) -> str:
    """One line for the hosts that failed the check: the first one's reason, then how many more and the
    first few of their names (thousands of hosts stay one short line).

    Example:
        >>> summary({"a": "host a: no", "b": "host b: no"})
        'host a: no; b failed the check too'
        >>> summary({f"s{i}": f"host s{i}: no" for i in range(4096)})
        'host s0: no; 4095 more of 4096 hosts failed the check too (s1, s2, s3, s4, s5, ...)'
    """
    first = next(iter(silent.values()))
    names = list(silent)[1:]
    if not names:
        return first
    if len(names) <= named:
        return f"{first}; {', '.join(names)} failed the check too"
    return f"{first}; {len(names)} more of {len(silent)} hosts failed the check too ({', '.join(names[:named])}, ...)"


def network_of(address: str, table: str) -> str | None:
    """The network (CIDR) of the interface holding ``address``, from ``ip -o -4 addr show`` output.

    Example:
        >>> network_of("10.1.2.3", "3: ib0    inet 10.1.2.3/16 brd 10.1.255.255 scope global ib0")
        '10.1.0.0/16'
    """
    for match in re.finditer(r"\binet ([0-9.]+/[0-9]{1,2})\b", table):
        iface = ipaddress.ip_interface(match.group(1))
        if str(iface.ip) == address:
            return str(iface.network)
    return None


def reaching_network(host: str) -> str | None:
    """The network of this host's interface that reaches ``host`` (IPv4), or None when it cannot tell.

    The default of ``--network-interface``: Open MPI would otherwise listen and connect on
    every interface (docker bridges, management networks) of every host.
    """
    try:
        target = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # UDP: no packet is sent, the kernel only picks the route
            local = probe.getsockname()[0]
        table = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None
    network = network_of(local, table)
    return None if network is None or ipaddress.ip_network(network).is_loopback else network


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from Linux's /proc; [] elsewhere).

    Example:
        >>> import os, subprocess
        >>> child = subprocess.Popen(["sleep", "5"])
        >>> child.pid in children(os.getpid()), child.kill(), child.wait()
        (True, None, -9)
    """
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:  # after the name: state, ppid
                found.append(int(stat.parent.name))
    return found


#: Open MPI's help texts stand between two lines of dashes.
_RULE = re.compile(rb"-{20,}\s*")
#: Open MPI's notices said in mldist's words: what the notice holds, and the words for the lost host.
_NOTICES = (
    (
        re.compile(rb"A daemon failed to report back.*?Remote host:\s+(\S+)", re.DOTALL),
        "it stopped answering: down, or its link cut; Open MPI's daemon there did not report back",
    ),
)


class Notices:
    """mpiexec's own lines, one at a time; Open MPI's help texts are held until whole, and those of
    :data:`_NOTICES` (a host cut off, which Open MPI blames on a firewall) are not shown: mldist says them.

    Example:
        >>> n = Notices()
        >>> n.feed(b"-" * 60 + b"\\n"), n.feed(b"A daemon failed to report back after being spawned.\\n")
        (([], [], None), ([], [], None))
        >>> n.feed(b"  Remote host:   hx3\\n")[2], n.feed(b"-" * 60 + b"\\n")[2][0]
        (None, 'hx3')
    """

    def __init__(self) -> None:
        self.block: list[bytes] | None = None

    def feed(self, line: bytes | None) -> tuple[list[bytes], list[bytes], tuple[str, str] | None]:
        """The lines to show now, the lines of a notice kept from the terminal, and ``(host, words)`` when a
        notice of :data:`_NOTICES` ended with this line; ``None`` at the end of the output (what is held)."""
        if not line:  # the end of the output (None), or a line that was only a NUL byte (b"")
            held, self.block = (self.block or [], None) if line is None else ([], self.block)
            return held, [], None
        if self.block is None:
            if _RULE.fullmatch(line):
                self.block = [line]
                return [], [], None
            return [line], [], None
        self.block.append(line)
        if not _RULE.fullmatch(line):
            if len(self.block) < 80:
                return [], [], None
            held, self.block = self.block, None  # no help text after all
            return held, [], None
        text, held, self.block = b"".join(self.block), self.block, None
        for pattern, words in _NOTICES:
            if found := pattern.search(text):
                return [], held, (found.group(1).decode(errors="replace"), words)
        return held, [], None
