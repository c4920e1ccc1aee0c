"""Whether the MPI engine's all-reduce goes through one rank per node: decided once, from the placement.

Over a network the flat all-reduce of ``R`` ranks per node sends each node's share across the link
in more steps and with more bytes than one rank per node needs. The hierarchical all-reduce
reduces on each node first (shared memory), all-reduces among one rank per node (the node
leaders) over the network, and broadcasts the result back on the node. It pays where there are
several nodes *and* more than one rank on some node; elsewhere the flat all-reduce already is
what it would do, and nothing changes.

The switch: ``MLDIST_HIERARCHICAL`` (``auto``, the default; ``1`` on where it applies; ``0`` off),
else Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (``1``/``0``), else ``auto``. ``auto`` stays flat
for now: on the 1 Gbit/s test link (2 emulated hosts x 2 ranks sharing 2 cores, quiet) the tiers were
as fast as the flat all-reduce for 1.4 MB and 7 % slower for 14 MB, so nothing yet shows where they
are faster; ``1`` asks for them.

Example:
    >>> tiers("on", nodes=2, per_node=2).on, tiers("auto", nodes=2, per_node=2).on, tiers("on", 1, 4).on
    (True, False, False)
    >>> tiers("off", nodes=8, per_node=4).reason
    'turned off (MLDIST_HIERARCHICAL=0 or HOROVOD_HIERARCHICAL_ALLREDUCE=0)'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..base import envvalues
from ..base.envparse import yes_no
from ..errors import ConfigError
from .detect import Placement

#: Horovod's switch, honoured when mldist's own is unset (``mldist.horovod`` scripts set it).
HOROVOD = "HOROVOD_HIERARCHICAL_ALLREDUCE"


@dataclass(frozen=True)
class Hierarchy:
    """Whether the all-reduce is hierarchical, why, and the facts it rests on.

    Args:
        on: reduce on the node, all-reduce among the node leaders, broadcast on the node.
        reason: why, in words (for ``mldist env`` and the docs).
        nodes: how many nodes the ranks span.
        per_node: the most ranks on one node.
    """

    on: bool
    reason: str
    nodes: int
    per_node: int

    @property
    def said(self) -> str:
        """One line for ``mldist env``.

        Example:
            >>> tiers("on", 2, 2).said
            'hierarchical (2 nodes x up to 2 ranks: reduce on the node, all-reduce among 2 node leaders, broadcast)'
        """
        return f"{'hierarchical' if self.on else 'flat'} ({self.reason})"


def requested(env: Mapping[str, str]) -> str:
    """The setting: ``MLDIST_HIERARCHICAL``, else ``HOROVOD_HIERARCHICAL_ALLREDUCE``, else "auto".

    Raises ConfigError (one line naming the value and the fix) for a value that is none of them.

    Example:
        >>> requested({}), requested({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}), requested({"MLDIST_HIERARCHICAL": "0"})
        ('auto', 'on', 'off')
    """
    mine = envvalues.HIERARCHICAL.read(env)
    if mine != "auto" or not env.get(HOROVOD, "").strip():
        return mine
    said = yes_no(env[HOROVOD])
    if said is None:
        raise ConfigError(f"{HOROVOD}={env[HOROVOD]!r} is not 1 or 0: set 1 (on) or 0 (off), or unset it")
    return "on" if said else "off"


def tiers(setting: str, nodes: int, per_node: int) -> Hierarchy:
    """The all-reduce for ``nodes`` nodes of up to ``per_node`` ranks under ``setting`` ("auto", "on", "off").

    "on" turns hierarchy on where it can help (several nodes, more than one rank on some node);
    "auto" stays flat there until the tiers are measured faster (see the module's docstring).

    Example:
        >>> tiers("on", nodes=4, per_node=1).reason
        'one rank per node: the flat all-reduce already crosses the network once per node'
    """
    if nodes <= 1:
        return Hierarchy(False, "one node: the flat all-reduce never leaves it", nodes, per_node)
    if per_node <= 1:
        why = "one rank per node: the flat all-reduce already crosses the network once per node"
        return Hierarchy(False, why, nodes, per_node)
    if setting == "off":
        return Hierarchy(False, f"turned off (MLDIST_HIERARCHICAL=0 or {HOROVOD}=0)", nodes, per_node)
    if setting == "auto":
        why = f"auto: {nodes} nodes x up to {per_node} ranks stay flat; MLDIST_HIERARCHICAL=1 reduces on the node first"
        return Hierarchy(False, why, nodes, per_node)
    why = (
        f"{nodes} nodes x up to {per_node} ranks: reduce on the node, all-reduce among {nodes} node leaders, broadcast"
    )
    return Hierarchy(True, why, nodes, per_node)


def shape(placement: Placement) -> tuple[int, int]:
    """``(nodes, ranks per node)`` as the launcher describes them (the engine asks MPI itself).

    Example:
        >>> shape(Placement("openmpi", rank=0, size=8, local_rank=0, local_size=4))
        (2, 4)
        >>> shape(Placement("slurm", size=3, local_size=2, hosts=("a", "b")))
        (2, 2)
    """
    if placement.hosts:
        return len(placement.hosts), placement.local_size
    per_node = max(1, placement.local_size)
    return -(-placement.size // per_node), per_node
