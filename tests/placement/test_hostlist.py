"""Slurm host lists and tasks-per-node strings (``mldist.placement.hostlist``)."""

from __future__ import annotations

import pytest

from mldist.errors import DetectionError
from mldist.placement.hostlist import expand_hostlist, expand_tasks_per_node


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("n[9-11],login1", ["n9", "n10", "n11", "login1"]),
        ("node1,node2", ["node1", "node2"]),
        ("r[1-2]n[0-1]", ["r1n0", "r1n1", "r2n0", "r2n1"]),
        ("x3005c0s13b0n0", ["x3005c0s13b0n0"]),
        ("a[008-010]", ["a008", "a009", "a010"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-04", "gpu]1[", "n[a-b]", "n[5-3]"])
def test_bad_hostlists_are_named(text: str) -> None:
    with pytest.raises(DetectionError, match="host list"):
        expand_hostlist(text)


def test_tasks_per_node() -> None:
    assert expand_tasks_per_node("3(x2),2") == [3, 3, 2]
    assert expand_tasks_per_node("1") == [1]
    with pytest.raises(DetectionError, match="tasks-per-node"):
        expand_tasks_per_node("3(2)")
