"""``horovod.common.util``: the helpers of Horovod's that scripts and test suites import.

Example:
    >>> is_version_greater_equal_than("2.21.0", "2.6.0"), is_version_greater_equal_than("2.16.1-tf", "2.17")
    (True, False)
"""

from __future__ import annotations

import re

from ..basics import gloo_built, mpi_built, nccl_built

__all__ = ["gloo_built", "is_version_greater_equal_than", "mpi_built", "nccl_built"]


def _numbers(version: str) -> tuple[int, ...]:
    """The leading dotted numbers of a version string ("2.16.1rc0" and "2.16.1-tf" give (2, 16, 1))."""
    found = re.match(r"[0-9]+(?:\.[0-9]+)*", version.strip())
    if found is None:
        raise ValueError(f"{version!r} is not a version (it must start with numbers, e.g. 2.16.1)")
    return tuple(int(part) for part in found.group(0).split("."))


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Whether version ``ver`` is at least ``target``, comparing their numbers (Horovod's helper)."""
    mine, wanted = _numbers(ver), _numbers(target)
    width = max(len(mine), len(wanted))
    return mine + (0,) * (width - len(mine)) >= wanted + (0,) * (width - len(wanted))
