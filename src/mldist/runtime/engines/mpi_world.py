"""The MPI engine's world: its communicators, departures, abort and Horovod's join.

:mod:`mldist.runtime.engines.mpi_engine` moves the bytes; this module holds what its collectives run
over (a private duplicate of ``COMM_WORLD``, or a process set's communicator while one runs)
and how a rank leaves that world: together at the end (:mod:`mldist.runtime.engines.mpi_exit`'s
departures), alone on an error (``MPI_Abort``), or by joining (``hvd.join``).

Example::

    start()                                   # mldist.init() does this
    comm = world()                            # what mldist.runtime.engines.subsets.split divides
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...base import hosts, processwide
from ...placement.hierarchy import Hierarchy, requested, tiers
from ..watch import stall
from ..watch.leave import TOGETHER, ending_code
from . import mpi_join, mpi_wait
from .mpi_exit import Departures


class World:
    """The engine's communicators (private duplicates of ``COMM_WORLD``) and departures."""

    comm: Any = None
    departures: Departures | None = None
    #: The communicator of the collective running now: ``comm``, or a process set's (see :func:`watched`).
    active: Any = None
    #: The slow-rank account's rounds' own duplicate (:class:`mldist.runtime.watch.straggler_gather.MpiAside`).
    aside: Any = None
    #: Whether the world's all-reduces go through one rank per node (:func:`arrange`), and why.
    hierarchy: Hierarchy | None = None
    #: With ``hierarchy.on``: this node's ranks (``COMM_TYPE_SHARED``), and the node leaders' (None elsewhere).
    node: Any = None
    leaders: Any = None
    #: With ``hierarchy.on`` and every node alike: the ranks of this node's local rank on every node (the rails).
    rails: Any = None
    #: A rank has joined (hvd.join) in the collective running now: its all-reduce goes flat, as joined ranks answer.
    joined = False


def start(comm: Any = None, one_node: int = 0) -> Any:
    """Take a private duplicate of ``comm`` (default ``COMM_WORLD``); collective: every rank calls it.

    A duplicate keeps mldist's traffic apart from the user's own mpi4py calls; a second one
    carries the departure messages (:mod:`mldist.runtime.engines.mpi_exit`), whose exit handler then
    makes this rank wait for the others at the end instead of hanging in MPI_Finalize. Then it decides
    whether the world's all-reduces go in tiers (:func:`arrange`); ``one_node``: the world's size where this rank's
    placement puts the whole world on its node (``placement.size == placement.local_size``), else 0.
    """
    if World.comm is None:
        from mpi4py import MPI

        world = comm or MPI.COMM_WORLD
        mpi_wait.wait(world.Ibarrier(), mpi_wait.START_NAP)  # ranks start at different times; the early ones sleep here
        # The three duplicates at once, waited for without busy-polling: each blocking Dup spun on every rank, and
        # on a node with more ranks than cores that took the cores from the ranks it waited for.
        (mine, made), (departures, made_too), (aside, made_last) = (world.Idup() for _ in range(3))
        for request in (made, made_too, made_last):
            mpi_wait.wait(request)
        World.comm = World.active = mine
        World.departures = Departures(departures, world.Get_rank(), world.Get_size())
        World.departures.watch()
        World.aside = aside  # the slow-rank rounds, posted from the watch threads (straggler_gather)
        processwide.at_exit("atexit: MPI's departures", _at_exit)
        arrange(requested(os.environ), one_node)
    return World.comm


def arrange(setting: str, one_node: int = 0) -> Hierarchy:
    """Decide, once, whether the world's all-reduces are hierarchical; make the communicators they need.

    Collective. The facts come from MPI itself, so every rank decides alike: the nodes are the ranks
    that share MPI's processor name (the host's name, by which Open MPI's ``COMM_TYPE_SHARED`` groups
    them too), gathered as 64-bit keys (:func:`mldist.base.hosts.key64`, :func:`each_ranks`); from them
    their count, the largest and smallest one, and whether every node's ranks are numbered in a row
    (:func:`node_facts`). Where hierarchy is on, the node's communicator carries the on-node steps (shared
    memory); between nodes, with every node alike, one communicator per local rank (the rails: local rank r
    of every node), else one of each node's lowest rank (:mod:`mldist.runtime.engines.mpi_tiers`).

    Args:
        setting: "auto", "on" or "off" (:func:`mldist.placement.hierarchy.requested`).
        one_node: the world's size where this rank's placement puts the whole world on its node, else 0.
    """
    from mpi4py import MPI

    if World.hierarchy is not None:
        return World.hierarchy
    comm = World.comm
    if _one_node(comm, one_node):  # the facts MPI would give, without its one blocking call (below)
        World.hierarchy = tiers(setting, 1, comm.Get_size())
        return World.hierarchy
    # Each rank's node from one nonblocking gather of a key of its node's name, not from MPI's Split_type:
    # that blocking call busy-polls (on a node with more ranks than cores a spinning rank takes the core from
    # the ranks it waits for) and, as every new communicator, agrees on an id in rounds over the network:
    # 37 s of a 50 s `mldist run -H` of 16 test hosts x 2 ranks. A node's communicator is made only where
    # the tiers need one.
    keys = each_ranks(comm, hosts.key64(MPI.Get_processor_name()), np.uint64, mpi_wait.START_NAP)
    facts = node_facts(keys)
    World.hierarchy = tiers(setting, facts.nodes, facts.per_node, facts.even, in_a_row=facts.in_a_row)
    if not World.hierarchy.on:
        return World.hierarchy
    rank = comm.Get_rank()
    node = comm.Split(facts.first[rank], rank)  # (colour: the node's lowest rank; the same group as Split_type's)
    even, leader = facts.even, node.Get_rank() == 0
    if even:  # local rank r of every node: one all-reduce per local rank, side by side
        World.node, World.rails = node, comm.Split(node.Get_rank(), rank)
    else:
        leaders = comm.Split(0 if leader else MPI.UNDEFINED, rank)
        World.node, World.leaders = node, (None if leaders == MPI.COMM_NULL else leaders)
    return World.hierarchy


def each_ranks(comm: Any, mine: int, dtype: Any, nap: float = mpi_wait.LONGEST_NAP) -> np.ndarray[Any, Any]:
    """Every rank's one integer (``mine`` on this rank), in rank order; collective, nonblocking, waited for with naps.

    An all-gather done as an all-reduce: each rank fills its own slot of zeros and the sum gathers them.
    Open MPI's nonblocking all-gather (libnbc) is linear, each rank sending to every other: at 16,384 ranks
    268 million messages and a connection to every peer; the all-reduce is Rabenseifner's (mldist's setting),
    log N rounds, and its N slots are never below the power of two it needs.

    Example::

        keys = each_ranks(comm, hosts.key64(MPI.Get_processor_name()), np.uint64)
    """
    from mpi4py import MPI

    values = np.zeros(comm.Get_size(), dtype)
    values[comm.Get_rank()] = mine
    mpi_wait.wait(comm.Iallreduce(MPI.IN_PLACE, values, MPI.SUM), nap)
    return values


class NodeFacts(NamedTuple):
    """What :func:`node_facts` finds in every rank's node key."""

    nodes: int
    per_node: int
    even: bool
    in_a_row: bool
    #: Each rank's node's lowest rank.
    first: list[int]


def node_facts(keys: Any) -> NodeFacts:
    """The nodes that every rank's node key (``keys[rank]``) makes: how many, the largest one, whether all
    hold as many ranks, whether each node's ranks are numbered in a row, and each rank's node's lowest rank.

    Example:
        >>> node_facts(np.array([7, 7, 9, 9], np.uint64))
        NodeFacts(nodes=2, per_node=2, even=True, in_a_row=True, first=[0, 0, 2, 2])
        >>> node_facts(np.array([7, 9, 7], np.uint64))[1:4]
        (2, False, False)
    """
    lowest: dict[int, int] = {}
    counts: dict[int, int] = {}
    highest: dict[int, int] = {}
    for rank, key in enumerate(keys.tolist()):
        lowest.setdefault(key, rank)
        counts[key] = counts.get(key, 0) + 1
        highest[key] = rank
    sizes = counts.values()
    in_a_row = all(highest[k] - lowest[k] + 1 == counts[k] for k in counts)
    first = [lowest[key] for key in keys.tolist()]
    return NodeFacts(len(counts), max(sizes), min(sizes) == max(sizes), in_a_row, first)


def _one_node(comm: Any, mine: int) -> bool:
    """Whether every rank of ``comm`` says its placement puts the whole world, of ``comm``'s size, on its node
    (``mine``: that size, else 0; one nonblocking MIN).

    Then ``COMM_TYPE_SHARED`` makes one group: one node, every rank on it, numbered in a row. Its
    ``Split_type`` is blocking, and on 16 ranks of 2 cores it made each rank yield about 3,700 times.
    Any rank that does not know (no launcher's local size) or whose world is another makes all ask MPI.
    """
    from mpi4py import MPI

    alone = np.array([int(mine == comm.Get_size())], np.int64)
    mpi_wait.wait(comm.Iallreduce(MPI.IN_PLACE, alone, MPI.MIN))
    return bool(alone[0])


def _at_exit() -> None:
    """At interpreter exit: codes every rank takes together (0, 75) wait for the others (see mpi_exit)."""
    code = ending_code()
    if World.departures is not None and (code is None or code in TOGETHER):
        World.departures.depart(0 if code is None else code)


def aside(rank: int, size: int) -> Any:
    """The slow-rank rounds: ``MPI_Igather`` on the world's duplicate kept for them (made at start)."""
    from ..watch.straggler_gather import MpiAside

    return MpiAside(World.aside, size)


def abort(code: int) -> None:
    """End every rank of the job now with ``code`` (after an error on this rank).

    A plain exit would run MPI_Finalize, which waits for every rank: a peer blocked in a
    collective with this rank would then wait forever, and so would this rank.
    """
    if World.comm is not None:
        World.comm.Abort(code)


def join() -> int:
    """Horovod's join on this engine: answer the others' all-reduces until all have joined; the last to join."""
    departures = World.departures
    token: list[Any] = []

    def begin() -> None:
        if departures is not None:
            departures.begin("join")
        token.append(stall.begin("join"))

    def end() -> None:
        stall.end(token.pop())
        if departures is not None:
            departures.end()

    return mpi_join.join_rounds(World.comm, World.comm.Get_rank(), begin, end)


def world() -> Any:
    """The engine's communicator of all ranks (:func:`mldist.runtime.engines.subsets.split` divides it)."""
    return World.comm


def watched(
    body: Callable[..., list[np.ndarray[Any, Any]]], what: str, comm: Any = None
) -> Callable[..., list[np.ndarray[Any, Any]]]:
    """``body`` run over ``comm`` (a process set's; None: the world), marked as a collective in flight.

    Only the world's collectives count for the departures (a process set's involve some ranks).
    """

    def run(*arrays: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
        departures = World.departures if comm is None else None
        if departures is not None:
            departures.begin(what)
        token = stall.begin(what)
        World.active = comm or World.comm
        try:
            return body(*arrays)
        finally:
            World.active = World.comm
            stall.end(token)
            if departures is not None:
                departures.end()

    return run
