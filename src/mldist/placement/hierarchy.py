"""Whether the MPI engine's all-reduce goes in tiers over the nodes: decided once, from the placement.

Over a network the flat all-reduce of ``R`` ranks per node can send each node's share across the
link in more steps and with more bytes than one rank per node needs. In tiers, each node's ranks
reduce-scatter the buffer on the node (shared memory), local rank r all-reduces its share with local
rank r of every other node (R all-reduces of n/R side by side), and the node's ranks gather the
shares back; where nodes hold different numbers of ranks, one leader per node reduces, all-reduces and
broadcasts instead. It can only pay where there are several nodes *and* more than one rank on some
node; elsewhere the flat all-reduce already is what it would do, and nothing changes.

Open MPI's flat all-reduce (Rabenseifner's, which mldist selects) halves the buffer between ranks 1
apart, then 2, 4, ...: with each node's ranks numbered in a row and a power of two of them per node,
its first steps stay on the node and its network steps carry n/R per rank, the tiers' bytes already
(measured on 2 test hosts x 2 ranks at 1 Gbit/s: flat and in tiers alike, both at the link's bound
on a quiet machine). With 3 ranks per node (a power of two it is not) its folding step sends halves
across the link, and with ranks numbered round robin over the nodes its first steps do: there the
tiers were 2.5x and 1.8x faster on 14 MB.

The switch: ``MLDIST_HIERARCHICAL`` (``auto``, the default; ``1`` on where it applies; ``0`` off),
else Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (``1``/``0``), else ``auto``. ``auto`` turns the
tiers on where every node holds as many ranks and the flat all-reduce's first steps would not stay on
the node (ranks not in a row per node, or not a power of two per node); elsewhere it stays flat.

Example:
    >>> tiers("on", nodes=2, per_node=2).on, tiers("auto", nodes=2, per_node=2).on, tiers("on", 1, 4).on
    (True, False, False)
    >>> tiers("auto", nodes=2, per_node=3).on, tiers("auto", nodes=2, per_node=2, in_a_row=False).on
    (True, True)
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
        even: every node holds ``per_node`` ranks (then the node's ranks share the work between nodes).
        in_a_row: every node's ranks are numbered in a row (the flat all-reduce's first steps can stay on it).
    """

    on: bool
    reason: str
    nodes: int
    per_node: int
    even: bool = True
    in_a_row: bool = True

    @property
    def said(self) -> str:
        """One line for ``mldist env``.

        Example:
            >>> tiers("on", 2, 2).said
            'hierarchical (2 nodes x 2 ranks: reduce-scatter on the node, 2 all-reduces across nodes, allgather)'
            >>> tiers("on", 2, 3, even=False).said
            'hierarchical (2 nodes x up to 3 ranks: reduce on the node, all-reduce among 2 node leaders, broadcast)'
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


def tiers(setting: str, nodes: int, per_node: int, even: bool = True, in_a_row: bool = True) -> Hierarchy:
    """The all-reduce for ``nodes`` nodes of up to ``per_node`` ranks under ``setting`` ("auto", "on", "off").

    "on" turns the tiers on where they can help (several nodes, more than one rank on some node);
    "auto" where, moreover, every node holds as many ranks and the flat all-reduce would not keep its
    first steps on the node (see the module's docstring).

    Args:
        setting: "auto", "on" or "off" (:func:`requested`).
        nodes: how many nodes the ranks span.
        per_node: the most ranks on one node.
        even: every node holds ``per_node`` ranks.
        in_a_row: every node's ranks are numbered in a row.

    Example:
        >>> tiers("on", nodes=4, per_node=1).reason
        'one rank per node: the flat all-reduce already crosses the network once per node'
        >>> tiers("auto", nodes=2, per_node=4).reason
        'auto: 2 nodes x 4 ranks in a row: flat halves on the node first; MLDIST_HIERARCHICAL=1 for tiers'
    """
    facts = (nodes, per_node, even, in_a_row)
    if nodes <= 1:
        return Hierarchy(False, "one node: the flat all-reduce never leaves it", *facts)
    if per_node <= 1:
        return Hierarchy(
            False, "one rank per node: the flat all-reduce already crosses the network once per node", *facts
        )
    if setting == "off":
        return Hierarchy(False, f"turned off (MLDIST_HIERARCHICAL=0 or {HOROVOD}=0)", *facts)
    if setting == "auto" and not even:
        why = (
            f"auto: {nodes} nodes of up to {per_node} ranks, not all alike, stay flat; MLDIST_HIERARCHICAL=1 for tiers"
        )
        return Hierarchy(False, why, *facts)
    if setting == "auto" and in_a_row and per_node & (per_node - 1) == 0:
        why = f"auto: {nodes} nodes x {per_node} ranks in a row: flat halves on the node first"
        return Hierarchy(False, why + "; MLDIST_HIERARCHICAL=1 for tiers", *facts)
    if even:  # each local rank all-reduces its share with the same local rank of every other node
        why = f"{nodes} nodes x {per_node} ranks: reduce-scatter on the node, {per_node} all-reduces across nodes"
        return Hierarchy(True, why + ", allgather", *facts)
    why = f"{nodes} nodes x up to {per_node} ranks: reduce on the node, all-reduce among {nodes} node leaders"
    return Hierarchy(True, why + ", broadcast", *facts)


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
