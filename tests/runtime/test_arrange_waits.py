"""The MPI engine decides its tiers without blocking all-reduces (issue 62).

A blocking MPI call busy-polls: with 64 ranks on 2 cores, the ranks spinning in ``arrange``'s three
``Allreduce`` took the cores from the ranks they waited for (27 ms of CPU per rank at 16 ranks, more at
64). They are nonblocking now, waited for with naps (``mpi_wait.wait``), and the one blocking call left
(``Split_type``: MPI has no nonblocking one) comes after a nonblocking barrier, with every rank there.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

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
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
    monkeypatch.setattr(sys.modules.get("mpi4py") or types.SimpleNamespace(), "MPI", fake, raising=False)
    calls: list[str] = []
    monkeypatch.setattr(mpi_world.World, "comm", _Comm(calls))
    monkeypatch.setattr(mpi_world.World, "hierarchy", None)
    return calls


def test_arrange_makes_no_blocking_all_reduce_and_meets_before_the_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_mpi(monkeypatch)
    decided = mpi_world.arrange("off", one_node=2)  # the placement's world (2) is not this communicator's (1)
    assert "Allreduce" not in calls
    assert calls == ["Iallreduce", "Ibarrier", "Split_type", "Iallreduce", "Iallreduce", "Iallreduce", "Free"]
    assert not decided.on


def test_a_world_on_one_node_is_decided_without_the_blocking_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_mpi(monkeypatch)
    decided = mpi_world.arrange("on", one_node=1)  # every rank on this node: one nonblocking MIN
    assert calls == ["Iallreduce"]
    assert (decided.on, decided.nodes, decided.reason) == (False, 1, "one node: the flat all-reduce never leaves it")
