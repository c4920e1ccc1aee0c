"""Hosts for ``mldist run -H`` / ``--hostfile`` and ``horovod.run(hosts=)``: ``(host, slots)`` pairs.

Example:
    >>> parse_hosts("node1:2,node2")
    (('node1', 2), ('node2', 1))
"""

from __future__ import annotations

import re
import socket

from ..errors import ConfigError
from ..placement.allocation import nodefile_hosts

_HOST_SLOTS = re.compile(r"([A-Za-z0-9_.-]+)(?::([0-9]{1,4}))?")


def parse_hosts(text: str, flag: str = "-H") -> tuple[tuple[str, int], ...]:
    """``(host, slots)`` of a ``host:slots,...`` list (or hostfile lines joined by commas).

    Example:
        >>> parse_hosts("node1:2,node2")
        (('node1', 2), ('node2', 1))
    """
    out = []
    for item in filter(None, text.split(",")):
        match = _HOST_SLOTS.fullmatch(item)
        if not match:
            raise ConfigError(f"{flag} {text!r}: write host:slots,... (e.g. node1:2,node2:2)")
        out.append((match.group(1), int(match.group(2) or 1)))
    if not out or sum(slots for _, slots in out) < 1:
        raise ConfigError(f"{flag} {text!r} gives no slots")
    return tuple(out)


_HOSTFILE_LINE = re.compile(r"([A-Za-z0-9_.-]+)(?:(?::|\s+slots=)([0-9]{1,4}))?")


def read_hostfile(path: str) -> tuple[tuple[str, int], ...]:
    """The hosts of a hostfile: 'host', 'host:slots' or 'host slots=N' per line; '#' starts a comment."""
    try:
        lines = open(path).read().splitlines()  # noqa: SIM115 - a small text file
    except OSError as exc:
        raise ConfigError(f"--hostfile {path!r}: {exc.strerror}") from None
    items = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _HOSTFILE_LINE.fullmatch(line)
        if not match:
            raise ConfigError(f"--hostfile {path!r} line {number}: {line!r}; write 'host', 'host:2' or 'host slots=2'")
        items.append(f"{match.group(1)}:{match.group(2) or 1}")
    return parse_hosts(",".join(items), "--hostfile")


def this_host() -> set[str]:
    """The names under which this host may appear in a host list."""
    return {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}


def read_nodefile(path: str) -> tuple[tuple[str, int], ...]:
    """The hosts of a PBS node file (one line per slot), in order."""
    try:
        text = open(path).read()  # noqa: SIM115 - a small text file
    except OSError as exc:
        raise ConfigError(f"PBS node file {path!r}: {exc.strerror}; use --local") from None
    return nodefile_hosts(text)
