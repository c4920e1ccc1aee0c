"""From a Placement to a cluster spec: worker addresses and ports.

Two steps follow detection. Host discovery gives every rank a host: from the
launcher's host list when it has one, else through a ``discover`` function
the caller passes (the runtime's is an allgather over mpi4py).
Port assignment gives every rank a port derived from the job/step identity
and the global rank, so two emulated nodes sharing 127.0.0.1 (or two jobs
on one node) never pick the same port.

Example:
    >>> from mldist.placement.detect import Placement
    >>> p = Placement("slurm", rank=1, size=2, hosts=("n1", "n2"), rank_nodes=(0, 1),
    ...               job_key="41.0")
    >>> build_cluster_spec(p, {}).workers
    ('n1:29024', 'n2:29025')
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..base import envvalues, hosts
from ..base.envparse import whole
from ..errors import ConfigError, DetectionError
from .detect import Placement

#: Ports are handed out from [base, base + PORT_SPAN), below Linux's ephemeral range.
PORT_SPAN = envvalues.PORT_SPAN
DEFAULT_PORT_BASE = envvalues.DEFAULT_PORT_BASE
_BLOCK = 64

Discover = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class ClusterSpec:
    """Every rank's address, and this process's place among them.

    Args:
        rank, size, local_rank, local_size: as detected.
        workers: ``host:port`` of every rank, indexed by rank.
        launcher: the detected launcher's name.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    workers: tuple[str, ...]
    launcher: str

    @property
    def address(self) -> str:
        """This rank's own ``host:port``."""
        return self.workers[self.rank]

    def tf_config(self) -> str:
        """The TF_CONFIG JSON that MultiWorkerMirroredStrategy reads."""
        return json.dumps({"cluster": {"worker": list(self.workers)}, "task": {"type": "worker", "index": self.rank}})


def port_base(env: Mapping[str, str]) -> int:
    """The first port mldist may use: ``MLDIST_PORT_BASE`` or 20000 (:data:`mldist.base.envvalues.PORT_BASE`).

    Example:
        >>> port_base({}), port_base({"MLDIST_PORT_BASE": "24000"})
        (20000, 24000)
    """
    return envvalues.PORT_BASE.read(env)


def assign_ports(job_key: str, size: int, base: int) -> list[int]:
    """Ports for ranks ``0..size-1`` of one job step.

    Ranks of one step get consecutive ports, so ranks sharing an address never
    collide; the step's block is chosen from the job key, so consecutive
    numeric job ids get different blocks.

    Args:
        job_key: e.g. ``"4711.0"`` (job id and step id) or ``""``.
        size: number of ranks.
        base: first usable port.

    Example:
        >>> assign_ports("7.0", 2, 20000)[:2]
        [23584, 23585]
    """
    block = _BLOCK * -(-size // _BLOCK)
    if block > PORT_SPAN:
        raise ConfigError(f"{size} workers need more than {PORT_SPAN} ports; set MLDIST_WORKERS")
    slots = PORT_SPAN // block
    parts = job_key.split(".")
    if job_key and all(whole(0)(p) is not None for p in parts[:2]):
        # Numeric ids: adjacent jobs and steps land in adjacent blocks.
        key = int(parts[0]) * 8 + (int(parts[1]) % 8 if len(parts) > 1 else 0)
    else:
        key = zlib.crc32(job_key.encode())
    start = base + (key % slots) * block
    return [start + r for r in range(size)]


def no_discovery(my_host: str) -> Sequence[str]:
    """A ``discover`` for callers that cannot gather host names (raises with the fix)."""
    raise DetectionError(
        "the launcher gives ranks but no host list: install mpi4py "
        "(pip install mpi4py) or set MLDIST_WORKERS=host:port,... for all ranks"
    )


def my_hostname(env: Mapping[str, str]) -> str:
    """The name peers use to reach this process: ``MLDIST_HOST`` or the host name."""
    return envvalues.HOST.read(env) or hosts.hostname()


def build_cluster_spec(placement: Placement, env: Mapping[str, str], discover: Discover = no_discovery) -> ClusterSpec:
    """Resolve every rank's ``host:port``.

    Args:
        placement: result of :func:`mldist.placement.detect.detect`.
        env: environment (for ``MLDIST_WORKERS``, ``MLDIST_PORT_BASE``, ``MLDIST_HOST``).
        discover: gathers host names from all ranks when the launcher gives none
            (the runtime passes an allgather over mpi4py).

    Example:
        >>> build_cluster_spec(Placement("none"), {}).size
        1
    """
    p = placement
    listed = envvalues.WORKERS.read(env)
    if listed is not None and p.workers is None:
        workers = listed
        if len(workers) != p.size:
            raise ConfigError(f"{envvalues.WORKERS.name} lists {len(workers)} addresses for a world of size {p.size}")
    elif p.workers is not None:
        workers = p.workers
    elif p.size == 1:
        workers = (f"localhost:{assign_ports(p.job_key, 1, port_base(env))[0]}",)
    else:
        if p.hosts is not None and p.rank_nodes is not None:
            hosts = [p.hosts[n] for n in p.rank_nodes]
        else:
            hosts = list(discover(my_hostname(env)))
        ports = assign_ports(p.job_key, p.size, port_base(env))
        workers = tuple(f"{h}:{port}" for h, port in zip(hosts, ports, strict=True))
    for w in workers:
        host, _, port = w.rpartition(":")
        if not host or whole(1, 65535)(port) is None:
            raise ConfigError(f"worker address {w!r} is not host:port")
    return ClusterSpec(p.rank, p.size, p.local_rank, p.local_size, workers, p.launcher)
