"""Where the workers of ``mldist run`` go: ``-n``, ``-H``/``--hostfile``, a discovery script, or the nodes of the
batch allocation it runs in; and the flags that the rest of the command line leaves without effect.

Example:
    >>> import argparse
    >>> unused_flag(argparse.Namespace(local=False, hosts=None, hostfile=None, host_discovery_script=None,
    ...     slots_per_host=None, reset_limit=None, elastic_timeout=None, min_np=None, max_np=None,
    ...     connect_timeout=5.0))[:42]
    '--connect-timeout 5 is the time other host'
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import ConfigError
from ..launch.hosts import parse_hosts, read_hostfile, read_nodefile, this_host
from ..placement.allocation import allocation


def placement(args: argparse.Namespace) -> tuple[int, tuple[tuple[str, int], ...], Any]:
    """-n/-np, the hosts and the allocation: -H or --hostfile naming only this host just count workers here;
    inside a batch allocation (not --local), its nodes and tasks."""
    nprocs = args.nprocs
    if args.hosts is not None and not args.hosts.strip(","):
        raise ConfigError(f"-H {args.hosts!r} names no host: give host:slots,... (e.g. node1:2,node2:2)")
    if problem := unused_flag(args):
        raise ConfigError(problem)
    hosts = read_hostfile(args.hostfile) if args.hostfile else parse_hosts(args.hosts) if args.hosts else ()
    if not hosts and args.host_discovery_script:
        hosts = _discovered(args)
    slots = sum(n for _, n in hosts)
    if hosts and all(host in this_host() for host, _ in hosts):
        if nprocs is not None and nprocs != slots:
            raise ConfigError(f"-np {nprocs} but -H gives {slots} slots on this host; make them agree")
        if args.network_interface is not None:
            named = ",".join(f"{host}:{n}" for host, n in hosts)
            given = f"--hostfile {args.hostfile} ({named})" if args.hostfile else f"-H {named}"
            raise ConfigError(
                f"--network-interface {args.network_interface!r} chooses the network between hosts, but {given} "
                "names only this host, whose workers talk over loopback: drop --network-interface, or name the "
                "other hosts"
            )
        return slots, (), None
    if not hosts and not args.local and (found := allocation(os.environ)) is not None:
        return _in_allocation(found, nprocs)
    if nprocs is None and not hosts:
        raise ConfigError("say how many workers: mldist run -n 2 -- python train.py")
    return (slots if nprocs is None else nprocs), hosts, None


def unused_flag(args: argparse.Namespace) -> str:
    """The line refusing a flag that the rest of the command line leaves without effect ("" if none).

    Args:
        args: ``mldist run``'s parsed flags.

    Example:
        >>> unused_flag(argparse.Namespace(local=True, hosts="a:1,b:1", hostfile=None, host_discovery_script=None,
        ...     slots_per_host=None, reset_limit=None, elastic_timeout=None, min_np=None, max_np=None,
        ...     connect_timeout=None))[:54]
        '--local keeps the workers on this node, but -H sends t'
    """
    listed = "-H" if args.hosts else "--hostfile" if args.hostfile else ""
    other_hosts = listed or ("--host-discovery-script" if args.host_discovery_script else "")
    if args.local and other_hosts:
        return (
            f"--local keeps the workers on this node, but {other_hosts} sends them to other hosts over ssh: "
            "give one of the two"
        )
    if args.slots_per_host is not None and not args.host_discovery_script:
        return (
            f"--slots-per-host {args.slots_per_host} is the slots of hosts that --host-discovery-script lists "
            "without them; without a script give the slots with each host (-H node1:2,node2:2) or -n"
        )
    elastic = args.min_np is not None or args.max_np is not None or args.host_discovery_script
    for flag, value in (("--reset-limit", args.reset_limit), ("--elastic-timeout", args.elastic_timeout)):
        if value is not None and not elastic:
            return f"{flag} {value:g} is for an elastic run; add --min-np N (with -H or --hostfile), or drop {flag}"
    if args.connect_timeout is not None and not other_hosts:
        return (
            f"--connect-timeout {args.connect_timeout:g} is the time other hosts have to answer over ssh; "
            "give -H or --hostfile, or drop it"
        )
    return ""


def _in_allocation(found: Any, nprocs: int | None) -> tuple[int, tuple[tuple[str, int], ...], Any]:
    """-n and the hosts of a batch allocation: -n defaults to its tasks and may not exceed them."""
    hosts = read_nodefile(found.nodefile) if found.nodefile else ()
    if not found.nodefile:  # Slurm: its tasks spread over its nodes
        each = -(-found.slots // max(len(found.nodes), 1))
        hosts = tuple((node, each) for node in found.nodes)
    slots = sum(n for _, n in hosts) if found.nodefile else found.slots
    if not hosts or slots < 1:
        raise ConfigError(f"inside {found.scheduler} job {found.job_id}, but it names no nodes; use --local")
    if nprocs is not None and nprocs > slots:
        raise ConfigError(
            f"-n {nprocs} is more than the {slots} task(s) of {found.scheduler} job {found.job_id} "
            f"({len(hosts)} node(s)); give -n {slots} or less, or --local for this node only"
        )
    return (slots if nprocs is None else nprocs), hosts, found


def _discovered(args: argparse.Namespace) -> tuple[tuple[str, int], ...]:
    """The hosts ``--host-discovery-script`` lists now: the first round's."""
    from ..launch.config import ElasticConfig
    from ..launch.elastic import discover

    path = executable(args.host_discovery_script)
    return discover(ElasticConfig(1, 1, discovery=path, slots=args.slots_per_host or 1), os.environ)


def executable(given: str) -> str:
    """The absolute path of the ``--host-discovery-script`` ``given``, when it is an executable file."""
    path = os.path.abspath(given)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigError(f"--host-discovery-script {given!r} is not an executable file (chmod +x it)")
    return path
