"""The suite's own scheduling (tests/conftest.py): pytest-xdist's workers take the groups longest first."""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import pytest

from helpers import ROOT


def _suite_conftest() -> types.ModuleType:
    """tests/conftest.py as a module of its own name (every test folder has a module named conftest)."""
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Item:
    """What the ordering reads of a collected test: its id and its slow mark."""

    def __init__(self, nodeid: str, slow: bool = False) -> None:
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str) -> object:
        return True if name == "slow" and self.slow else None


class _Worker:
    """A pytest-xdist worker as the scheduler sees it: it is sent test indexes."""

    def __init__(self, name: str) -> None:
        self.gateway, self.shutting_down, self.sent = types.SimpleNamespace(id=name), False, []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def _first_units(ids: list[str], workers: int) -> tuple[list[set[str]], list[str]]:
    """Drive the suite's scheduler on ``ids`` (ordered as collection orders them) with ``workers`` workers: each
    worker's first groups, and the groups still queued."""
    conftest = _suite_conftest()
    items: list[Any] = [_Item(nodeid, slow=nodeid.endswith("slow")) for nodeid in ids]
    conftest.pytest_collection_modifyitems(items)
    ordered = [item.nodeid for item in items]
    option = types.SimpleNamespace(numprocesses=workers, tx=[f"{workers}*popen"], loadscopereorder=True)
    config = types.SimpleNamespace(option=option, getvalue=lambda name: getattr(option, name))
    log = types.SimpleNamespace(loadscopesched=lambda *args: None)
    scheduler = conftest.pytest_xdist_make_scheduler(config, log)
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, ordered)
    scheduler.schedule()
    got = [{conftest.group_of(ordered[i]) or "single" for i in node.sent} for node in nodes]
    return got, list(scheduler.workqueue)


def test_the_longest_groups_start_first_whatever_their_number_of_tests() -> None:
    # More digits tests than Slurm or hosts tests, and the singles and digits collected first: xdist's own
    # order (the most tests first) would start digits and leave Slurm queued.
    ids = [f"tests/cli/test_a.py::test_{i}" for i in range(5)] + ["tests/cli/test_a.py::test_slow"]
    ids += [f"tests/training/test_runlog.py::test_{i}" for i in range(9)]
    ids += [f"tests/launch/test_hosts.py::test_{i}" for i in range(6)]
    ids += [f"tests/slurm/test_slurm.py::test_{i}" for i in range(4)]
    got, queued = _first_units(ids, 3)
    assert got == [{"slurm"}, {"hosts"}, {"digits"}]
    assert queued[0] == "tests/cli/test_a.py::test_slow"  # then the single tests, the slow ones first


def test_every_group_has_its_place_in_the_order() -> None:
    conftest = _suite_conftest()
    names = {name for _, name in conftest.GROUPS}
    assert names <= set(conftest.LONGEST_FIRST), names - set(conftest.LONGEST_FIRST)
    items: list[Any] = [_Item("tests/slurm/test_x.py::test_y")]
    conftest.LONGEST_FIRST = ("hosts",)
    with pytest.raises(pytest.UsageError, match=r"group 'slurm' .*add it to LONGEST_FIRST"):
        conftest.pytest_collection_modifyitems(items)
