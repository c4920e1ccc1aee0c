"""The MPI engine decides its tiers without blocking MPI calls (issue 62).

A blocking MPI call busy-polls: with 64 ranks on 2 cores, the ranks spinning in ``arrange``'s three
``Allreduce`` took the cores from the ranks they waited for (27 ms of CPU per rank at 16 ranks, more at
64). They are nonblocking now, waited for with naps (``mpi_wait.wait``). The blocking ``Split_type`` that
found the nodes (37 s of a 50 s run over 16 test hosts x 2 ranks) gave way to one nonblocking all-gather
of each rank's node key; a node's communicator is split only where the tiers are on.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from mldist.base import hosts
from mldist.runtime.engines import mpi_world


class _Done:
    def Test(self) -> bool:  # mpi4py's spelling
        return True


class _Comm:
    """One rank's communicator that records the MPI calls made on it."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def Split_type(self, kind: Any, key: int) -> _Comm:
        self.calls.append("Split_type")
        return _Comm(self.calls)

    def Ibarrier(self) -> _Done:
        self.calls.append("Ibarrier")
        return _Done()

    def Iallreduce(self, send: Any, buf: np.ndarray[Any, Any], op: Any) -> _Done:
        self.calls.append("Iallreduce")  # one rank: the buffer is already the result
        return _Done()

    def Iallgather(self, send: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> _Done:
        self.calls.append("Iallgather")
        out[:] = send  # one rank
        return _Done()

    def Allreduce(self, *args: Any) -> None:
        self.calls.append("Allreduce")

    def Split(self, *args: Any) -> _Comm:
        self.calls.append("Split")
        return _Comm(self.calls)

    def Free(self) -> None:
        self.calls.append("Free")


def _fake_mpi(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A one-rank world; the calls made."""
    fake = types.SimpleNamespace(COMM_TYPE_SHARED=1, IN_PLACE=None, SUM="sum", MAX="max", MIN="min", UNDEFINED=-1)
    fake.Get_processor_name = lambda: "nid001"
    fake.SUM = "sum"
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
    monkeypatch.setattr(sys.modules.get("mpi4py") or types.SimpleNamespace(), "MPI", fake, raising=False)
    calls: list[str] = []
    monkeypatch.setattr(mpi_world.World, "comm", _Comm(calls))
    monkeypatch.setattr(mpi_world.World, "hierarchy", None)
    return calls


def test_arrange_finds_the_nodes_with_one_nonblocking_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_mpi(monkeypatch)
    decided = mpi_world.arrange("on", one_node=2)  # the placement's world (2) is not this communicator's (1)
    # the one-node MIN, then every rank's node key (an all-gather as an all-reduce: libnbc's all-gather is
    # linear); no Split_type, no blocking call, no communicator
    assert calls == ["Iallreduce", "Iallreduce"]
    assert not decided.on and decided.nodes == 1


def test_the_node_facts_from_every_ranks_key() -> None:
    keys = np.array([hosts.key64(name) for name in ("a", "a", "b", "b", "c", "c")], np.uint64)
    assert mpi_world.node_facts(keys) == (3, 2, True, True, [0, 0, 2, 2, 4, 4])
    apart = np.array([hosts.key64(name) for name in ("a", "b", "a", "b", "b")], np.uint64)
    assert mpi_world.node_facts(apart) == (2, 3, False, False, [0, 1, 0, 1, 1])
    assert hosts.key64("nid001") != hosts.key64("nid002") != hosts.key64("")


def test_a_world_on_one_node_is_decided_without_the_blocking_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_mpi(monkeypatch)
    decided = mpi_world.arrange("on", one_node=1)  # every rank on this node: one nonblocking MIN
    assert calls == ["Iallreduce"]
    assert (decided.on, decided.nodes, decided.reason) == (False, 1, "one node: the flat all-reduce never leaves it")
