"""The MPI engine's data all-reduce: flat, or in tiers (the node, then one rank per node, then the node).

With several ranks per node over a network, the flat all-reduce sends each node's share across
the link in more steps and with more bytes than one rank per node needs (measured on two test hosts
over 1 Gbit/s, 2 ranks per host: the 1.4 MB all-reduce took 1.8-1.9x one rank per host's). In
tiers, each bucket is

1. reduce-scattered on the node (``MPI_Ireduce_scatter`` over the node's communicator: shared memory),
   so each of its R ranks holds the node's sum of 1/R of the buffer,
2. each share all-reduced among the ranks of its local rank on every node (the rails: R all-reduces of
   n/R side by side, as NCCL's and Horovod's many-leader schemes) with the flat path's own call
   (:func:`mldist.runtime.engines.mpi_join.allreduce`: nonblocking, Open MPI's Rabenseifner; bf16 and fp16
   travel as their 16 bits with their own sum, as in the flat path),
3. gathered back on the node (``MPI_Iallgatherv``).

Where nodes hold different numbers of ranks, one leader per node does it instead (:func:`in_tiers`:
``MPI_Ireduce`` into the node's lowest rank, the leaders' all-reduce, ``MPI_Ibcast``).

Each call is nonblocking and polled as the flat path's is (:func:`mldist.runtime.engines.mpi_wait.drive`),
bucket after bucket on the progress thread, so buckets overlap backprop as before. Whether the
tiers are used is decided once, when the engine starts (:func:`mldist.runtime.engines.mpi_world.arrange`);
a process set's collectives, and the all-reduces answered by a rank that has joined (``hvd.join``),
stay flat.

Example::

    allreduce(MPI.IN_PLACE, buffer, MPI.SUM, mpi_wait.drive)    # in the engine's progress thread
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import mpi_join
from .mpi_world import World

#: How long the node's other ranks sleep between polls while the leader all-reduces: short beside a transfer
#: (1.4 MB take 11 ms at 1 Gbit/s), long beside a poll.
NAP = 0.0002


def tiered() -> bool:
    """Whether the collective running now goes in tiers: the world's, hierarchy on, no rank joined."""
    hierarchy = World.hierarchy
    return hierarchy is not None and hierarchy.on and World.active is World.comm and not World.joined


def allreduce(send: Any, out: np.ndarray[Any, Any], op: Any, poll: Callable[[Any], None]) -> None:
    """One data all-reduce into ``out`` (``send``: ``MPI.IN_PLACE`` or the input), flat or in tiers.

    Every rank is already there (they met in the agreement all-reduce), and every rank of the world
    picks alike (:func:`tiered` rests on facts every rank shares).
    """
    if not tiered():
        mpi_join.allreduce(World.active, send, out, op, poll)
    elif World.rails is not None:
        in_rails(World.node, World.rails, send, out, op, poll)
    else:
        in_tiers(World.node, World.leaders, send, out, op, poll)


def shares(count: int, parts: int) -> tuple[list[int], list[int]]:
    """``count`` elements cut into ``parts`` runs as even as can be: their counts and offsets.

    Example:
        >>> shares(10, 4)
        ([3, 3, 2, 2], [0, 3, 6, 8])
    """
    counts = [count // parts + (i < count % parts) for i in range(parts)]
    return counts, [sum(counts[:i]) for i in range(parts)]


def in_rails(node: Any, rails: Any, send: Any, out: np.ndarray[Any, Any], op: Any, poll: Callable[[Any], None]) -> None:
    """Reduce-scatter on ``node``, all-reduce each share among its ``rails``, allgather on ``node``.

    Each of the node's R ranks owns 1/R of the buffer: the node's sum of it lands there
    (``MPI_Ireduce_scatter``, shared memory), local rank r all-reduces its share with local rank r of
    every other node (R all-reduces of n/R side by side, the same n bytes over each node's link as one
    leader sends, but from R ranks at once), and the node's ranks gather the shares back
    (``MPI_Iallgatherv``). The one extra buffer is a share.

    Args:
        node: this node's communicator (``COMM_TYPE_SHARED``); every node has as many ranks.
        rails: local rank r of every node (this rank's).
        send, out, op, poll: as :func:`in_tiers`'s.
    """
    from mpi4py import MPI

    counts, offsets = shares(out.size, node.Get_size())
    share = np.empty(counts[node.Get_rank()], out.dtype)
    poll(node.Ireduce_scatter(out if send is MPI.IN_PLACE else send, share, counts, op))
    mpi_join.allreduce(rails, MPI.IN_PLACE, share, op, poll)
    poll(node.Iallgatherv(share, [out, (counts, offsets)]))


def in_tiers(
    node: Any, leaders: Any, send: Any, out: np.ndarray[Any, Any], op: Any, poll: Callable[[Any], None]
) -> None:
    """Reduce on ``node`` into its rank 0, all-reduce among ``leaders`` (None off the leaders), broadcast on ``node``.

    Args:
        node: this node's communicator (``COMM_TYPE_SHARED``); its rank 0 is the leader.
        leaders: the leaders' communicator on a leader, None on the other ranks.
        send, out: as :func:`allreduce`'s.
        op: the MPI operation.
        poll: waits for a request, moving it on (:func:`mldist.runtime.engines.mpi_wait.drive`).
    """
    from mpi4py import MPI

    mine = out if send is MPI.IN_PLACE else send
    alone = node.Get_size() == 1  # a node of one rank (uneven placements): nothing to do on it
    if leaders is None:
        poll(node.Ireduce(mine, None, op, root=0))
        poll = idle  # the network's turn: leave the core to the leader
    else:
        if not alone:
            poll(node.Ireduce(send, out, op, root=0))
        elif send is not MPI.IN_PLACE:
            np.copyto(out, send)
        mpi_join.allreduce(leaders, MPI.IN_PLACE, out, op, poll)
    if not alone:
        poll(node.Ibcast(out, root=0))


def idle(request: Any) -> None:
    """Wait for a request that waits on the network, polling every :data:`NAP` seconds: a node's other ranks
    while the leader all-reduces (polling without pause would take the core from it where ranks share cores)."""
    while not request.Test():
        time.sleep(NAP)
