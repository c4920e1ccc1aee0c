"""Horovod's process and build queries on mldist's runtime, and its reduction-op constants.

``init`` starts mldist (``mldist.init``); ``rank``/``size``/... then answer as
Horovod's do, and raise ``NotInitializedError`` (a ``ValueError``, as in
Horovod) before ``init`` or after ``shutdown``.

Example::

    import mldist.horovod as hvd
    hvd.init()
    if hvd.rank() == 0:
        print(f"{hvd.size()} workers on {hvd.cross_size()} node(s)")
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
from dataclasses import dataclass
from typing import Any

from .. import runtime
from ..errors import ConfigError, NotInitializedError, UnsupportedError
from ..placement import detect
from .pickled import gather_objects

# Horovod's ReduceOp values (users compare and store them as ints).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
#: Horovod op -> mldist.allreduce op (Average is a sum scaled by 1/size; Adasum is refused).
WIRE_OPS = {Average: "sum", Sum: "sum", Min: "min", Max: "max", Product: "prod"}


@dataclass(frozen=True)
class Nodes:
    """Which node each rank is on, as Horovod's cross communicator sees it."""

    cross_rank: int
    cross_size: int
    homogeneous: bool


class ProcessSet:
    """Horovod's process set: some ranks that run collectives among themselves (MPI engine).

    Args:
        ranks_or_comm: world ranks, or an mpi4py communicator whose ranks form the set.

    Example::

        evens = hvd.add_process_set([0, 2])
        hvd.allreduce(x, process_set=evens)     # on ranks 0 and 2 only
    """

    def __init__(self, ranks_or_comm: Any) -> None:
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator: its members' world ranks
            from mpi4py import MPI

            group = ranks_or_comm.Get_group()
            ranks_or_comm = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), MPI.COMM_WORLD.Get_group())
        self.ranks: list[int] | None = sorted({int(r) for r in ranks_or_comm})
        self.process_set_id: int | None = None
        self.subset: Any = None

    def size(self) -> int:
        return len(self.ranks or ())

    def rank(self) -> int:
        """This rank's place in the set (-1 outside it)."""
        return self.ranks.index(rank()) if self.included() and self.ranks else -1

    def included(self) -> bool:
        return rank() in (self.ranks or ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks or ()))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _ProcessSet(ProcessSet):
    """Every rank (Horovod's ``global_process_set``, id 0)."""

    def __init__(self) -> None:
        self.ranks, self.process_set_id, self.subset = None, 0, None

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, ranks=all)"


global_process_set = _ProcessSet()
_state: dict[str, Any] = {"initialized": False, "nodes": None}


def _nodes_from_names(names: list[str], me: int) -> Nodes:
    """Node layout from every rank's node name, in rank order.

    Example:
        >>> _nodes_from_names(["a", "a", "b", "b"], 2)
        Nodes(cross_rank=1, cross_size=2, homogeneous=True)
    """
    order = list(dict.fromkeys(names))
    counts = {n: names.count(n) for n in order}
    return Nodes(order.index(names[me]), len(order), len(set(counts.values())) == 1)


def _discover_nodes(ctx: runtime.Context) -> Nodes:
    """One collective only when the launcher does not say where every rank is."""
    if ctx.local_size == ctx.size:
        return Nodes(0, 1, True)
    placement = detect(os.environ)
    if placement.rank_nodes is not None:
        return _nodes_from_names([str(n) for n in placement.rank_nodes], ctx.rank)
    key = f"node{placement.node_index}" if placement.node_index is not None else socket.gethostname()
    return _nodes_from_names([str(k) for k in gather_objects(key)], ctx.rank)


def check_process_set(process_set: Any) -> None:
    """Raise unless ``process_set`` is None, the global set, or a registered set this rank is in."""
    if process_set is None or process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise ConfigError(f"process_set={process_set!r}: pass a hvd.ProcessSet (hvd.add_process_set([0, 1]))")
    if process_set.process_set_id is None:
        raise ConfigError(f"{process_set!r} is not registered: hvd.add_process_set(...) or init(process_sets=...)")
    if not process_set.included():
        raise ConfigError(f"rank {rank()} is not in {process_set!r}; only its ranks may run its collectives")


def scope(process_set: Any) -> Any:
    """A context in which collectives run over ``process_set`` (checked as :func:`check_process_set`)."""
    from ..runtime.engines import subsets

    check_process_set(process_set)
    return subsets.within(None if process_set is None else process_set.subset)


def honours_process_set(fn: Any) -> Any:
    """``fn`` run inside :func:`scope` of its ``process_set`` argument."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with scope(signature.bind_partial(*args, **kwargs).arguments.get("process_set")):
            return fn(*args, **kwargs)

    return run


def set_size() -> int:
    """Ranks of the process set collectives run over now (the world outside a scope)."""
    from ..runtime.collect.collectives import world

    return world()[0]


def set_rank() -> int:
    """This rank within the process set collectives run over now."""
    from ..runtime.collect.collectives import world

    return world()[1]


def _check_comm(comm: Any) -> None:
    """Accept ``comm`` only if it names the whole world (a rank list or an mpi4py communicator)."""
    if comm is None:
        return
    world = runtime.init().size
    if isinstance(comm, list | tuple):
        if sorted(comm) != list(range(world)):
            raise UnsupportedError(
                f"init(comm={comm!r}): mldist runs on all {world} ranks; start the script with -n {len(comm)} instead"
            )
        return
    if not hasattr(comm, "Get_size"):
        raise UnsupportedError(f"init(comm={comm!r}): pass an mpi4py communicator or a list of ranks")
    from mpi4py import MPI

    if MPI.Comm.Compare(comm, MPI.COMM_WORLD) not in (MPI.IDENT, MPI.CONGRUENT):
        raise UnsupportedError(
            f"init(comm=...) with {comm.Get_size()} of {MPI.COMM_WORLD.Get_size()} MPI ranks: mldist runs on the "
            "whole world; start the script with that many ranks instead"
        )


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start mldist (as ``mldist.init()``) and answer Horovod's queries from then on.

    Args:
        comm: None, a list of all ranks, or an mpi4py communicator spanning the whole world.
        process_sets: see :func:`mldist.horovod.process_sets.init` (``hvd.init``), which registers them.

    Example::

        hvd.init()
    """
    ctx = runtime.init()
    _check_comm(comm)
    if _state["nodes"] is None:
        _state["nodes"] = _discover_nodes(ctx)
    _state["initialized"] = True
    from .settings import apply

    apply(os.environ)


def shutdown() -> None:
    """Mark Horovod as shut down: queries raise until ``init`` runs again (the engine stays up)."""
    _state["initialized"] = False


def is_initialized() -> bool:
    """Whether ``init`` ran (and ``shutdown`` did not since)."""
    return bool(_state["initialized"])


def context() -> runtime.Context:
    """mldist's context; raises NotInitializedError (a ValueError) before ``hvd.init()``."""
    if not _state["initialized"]:
        raise NotInitializedError("Horovod has not been initialized; use hvd.init() (mldist.horovod)")
    # Not runtime.context: once anything imports the submodule mldist.runtime.context, that name is the module.
    from ..runtime.start.worker import context as current

    return current()


def rank() -> int:
    """This process's rank, 0..size-1."""
    return context().rank


def size() -> int:
    """The number of processes."""
    return context().size


def local_rank() -> int:
    """This process's rank among the processes on its node."""
    return context().local_rank


def local_size() -> int:
    """The number of processes on this node."""
    return context().local_size


def _nodes() -> Nodes:
    context()
    nodes = _state["nodes"]
    assert isinstance(nodes, Nodes)
    return nodes


def cross_rank() -> int:
    """The index of this process's node (its rank among processes with the same local rank)."""
    return _nodes().cross_rank


def cross_size() -> int:
    """The number of nodes."""
    return _nodes().cross_size


def is_homogeneous() -> bool:
    """Whether every node runs the same number of processes."""
    return _nodes().homogeneous


def mpi_built() -> bool:
    """Whether the MPI engine can run here (mpi4py is installed)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpi_enabled() -> bool:
    """Whether this run's collectives go through MPI (its workers form one MPI world)."""
    ctx = runtime.current()
    return ctx is not None and ctx.decision.mpi_world


def mpi_threads_supported() -> bool:
    """Whether the MPI library was initialised with MPI_THREAD_MULTIPLE (False without MPI)."""
    context()
    if not mpi_enabled():
        return False
    from mpi4py import MPI

    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def gloo_built() -> bool:
    """False: mldist has no Gloo; its TensorFlow RING engine takes that place."""
    return False


def gloo_enabled() -> bool:
    """False: see :func:`gloo_built`."""
    return False


def cuda_built() -> bool:
    """Whether the installed TensorFlow was built with CUDA."""
    import tensorflow as tf

    return bool(tf.test.is_built_with_cuda())


def rocm_built() -> bool:
    """Whether the installed TensorFlow was built with ROCm."""
    import tensorflow as tf

    return bool(tf.test.is_built_with_rocm())


def nccl_built() -> bool:
    """Whether NCCL collectives can run: TensorFlow's NCCL engine needs a CUDA build."""
    return cuda_built()


def ddl_built() -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not supported (MPI engine on CPUs)."""
    return False
