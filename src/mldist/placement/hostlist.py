"""Parsers for Slurm's compact host and task lists.

Slurm writes node lists as ``gpu[01-04,07],login1`` and tasks per node as
``3(x2),2``; both are expanded here without calling ``scontrol``, which is
not available inside every container.

Example:
    >>> expand_hostlist("gpu[01-02,07],cpu5")
    ['gpu01', 'gpu02', 'gpu07', 'cpu5']
    >>> expand_tasks_per_node("3(x2),2")
    [3, 3, 2]
"""

from __future__ import annotations

import ipaddress
import re

from ..errors import ConfigError, DetectionError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise DetectionError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise DetectionError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


def _expand_ranges(body: str, source: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise DetectionError(f"bad range {item!r} in host list {source!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise DetectionError(f"descending range {item!r} in host list {source!r}")
        # Slurm pads every number to the width of the range's first number.
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(name: str, source: str) -> list[str]:
    """Expand one host expression, possibly with several bracket groups."""
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[: m.start()], name[m.end() :]
    return [host for num in _expand_ranges(m.group(1), source) for host in _expand_one(head + num + tail, source)]


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list expression into host names, in order.

    Args:
        text: e.g. ``"node[1-3]"`` or ``"gpu[01-04,07],login1"``.

    Example:
        >>> expand_hostlist("n[9-11]")
        ['n9', 'n10', 'n11']
    """
    return [h for part in _split_top_level(text) for h in _expand_one(part, text)]


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand ``SLURM_STEP_TASKS_PER_NODE`` (e.g. ``"3(x2),2"``) to a list.

    Args:
        text: Slurm's compressed count list.

    Example:
        >>> expand_tasks_per_node("2(x3)")
        [2, 2, 2]
    """
    counts: list[int] = []
    for item in text.split(","):
        m = _TASKS.match(item.strip())
        if not m:
            raise DetectionError(f"bad tasks-per-node item {item!r} in {text!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


#: A host name of a host list (``-H``, ``--hostfile``, a discovery script's lines): a name or an address,
#: never a shell word.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
#: The one grammar of a host list's entry: ``host`` or ``host:slots``; hostfiles also say ``host slots=N``.
#: The name part is wide on purpose: a name that :data:`HOST_NAME` refuses gets its own message.
_ENTRY = re.compile(r"([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]{2,45}\])(?::([0-9]{1,4}))?")
_HOSTFILE_ENTRY = re.compile(r"([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]{2,45}\])(?:(?::|\s+slots=)([0-9]{1,4}))?")
#: The name this host's IPv6 loopback (``[::1]``) is given: the workers then start here, as for ``localhost``.
LOOPBACK = "localhost"


def _host(name: str, text: str) -> str:
    """A host list's name as mldist carries it: lower case (host names are case-insensitive), ``[::1]`` as
    :data:`LOOPBACK`; another IPv6 address is refused, with why."""
    if not name.startswith("["):
        return name.lower()
    try:
        address = ipaddress.IPv6Address(name[1:-1])
    except ValueError:
        raise ConfigError(f"host list entry {text!r}: {name} is not an IPv6 address (e.g. [::1])") from None
    if address.is_loopback:
        return LOOPBACK
    raise ConfigError(
        f"host list entry {text!r}: mldist run carries host names and IPv4 addresses to mpiexec and ssh, "
        f"not IPv6 addresses other than this host's [::1]; give the name of {address} (from /etc/hosts or DNS)"
    )


def host_entry(text: str, hostfile: bool = False) -> tuple[str, int | None] | None:
    """``(host, slots)`` of one entry of a host list (slots None where it gives none), or None when the
    entry is not ``host`` or ``host:slots`` (with ``hostfile``: ``host slots=N`` too).

    Host names come back in lower case, as DNS, /etc/hosts and ssh take them; ``[::1]`` (this host's IPv6
    loopback) as ``localhost``; another IPv6 address is a ConfigError that says why (see :func:`_host`).

    Example:
        >>> host_entry("node1:2"), host_entry("node1"), host_entry("node1 slots=4", hostfile=True)
        (('node1', 2), ('node1', None), ('node1', 4))
        >>> host_entry("LOCALHOST:2"), host_entry("[::1]:2")
        (('localhost', 2), ('localhost', 2))
        >>> host_entry("node1; rm -rf /") is None
        True
    """
    match = (_HOSTFILE_ENTRY if hostfile else _ENTRY).fullmatch(text)
    if match is None:
        return None
    return _host(match.group(1), text), int(match.group(2)) if match.group(2) is not None else None
