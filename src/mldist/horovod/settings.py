"""Horovod's environment variables on mldist, and Horovod's timeline.

- ``HOROVOD_FUSION_THRESHOLD`` (bytes; 0 turns fusion off) is the capacity of one fused
  collective, as mldist's ``bucket_bytes``.
- ``HOROVOD_TIMELINE=FILE`` records every rank from ``hvd.init()`` to the end of the
  script into one Chrome trace at FILE (rank 0 writes it); ``hvd.start_timeline(FILE)`` and
  ``hvd.stop_timeline()`` do the same for a stretch of the script (call both on every rank).
- ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``/``0`` turns the MPI engine's hierarchical all-reduce on or
  off (reduce on the node, all-reduce among one rank per node, broadcast on the node;
  :mod:`mldist.placement.hierarchy`) when ``MLDIST_HIERARCHICAL`` is unset. Unset, the all-reduce stays
  flat (the tiers are not yet measured faster).
- Horovod's other tuning variables (cycle time, autotune, stall check, cache, hierarchical
  allgather, ...) have no counterpart: rank 0 says so in one line.

Example::

    os.environ["HOROVOD_FUSION_THRESHOLD"] = str(32 << 20)
    hvd.init()                      # fused collectives of at most 32 MiB
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import runtime
from ..base import processwide
from ..errors import ConfigError
from ..runtime.collect.buckets import DEFAULT_BUCKET_BYTES
from ..runtime.collect.profiling import Recording
from ..runtime.watch.leave import ending_code

#: Variables Horovod reads that change nothing here (mldist fuses per step and has its own stall watch).
NO_EFFECT = (
    "HOROVOD_CYCLE_TIME",
    "HOROVOD_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG",
    "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_HIERARCHICAL_ALLGATHER",
    "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_BATCH_D2D_MEMCOPIES",
    "HOROVOD_NUM_NCCL_STREAMS",
    "HOROVOD_MPI_THREADS_DISABLE",
    "HOROVOD_DISABLE_GROUP_FUSION",
    "HOROVOD_RESPONSE_CACHE_CAPACITY",
    "HOROVOD_THREAD_AFFINITY",
)
_DIGITS = re.compile(r"[0-9]{1,15}")
_timeline: dict[str, Recording | None] = {"active": None}


def fusion_bytes(env: Mapping[str, str] | None = None) -> int:
    """The fused collective's capacity: ``HOROVOD_FUSION_THRESHOLD`` bytes (0: one tensor each), else mldist's.

    Example:
        >>> fusion_bytes({"HOROVOD_FUSION_THRESHOLD": "0"}), fusion_bytes({}) == DEFAULT_BUCKET_BYTES
        (1, True)
    """
    text = (os.environ if env is None else env).get("HOROVOD_FUSION_THRESHOLD", "").strip()
    if not text:
        return DEFAULT_BUCKET_BYTES
    if not _DIGITS.fullmatch(text):
        raise ConfigError(f"HOROVOD_FUSION_THRESHOLD={text!r} is not a number of bytes; e.g. 67108864 (64 MiB)")
    return max(1, int(text))


def ignored(env: Mapping[str, str]) -> list[str]:
    """The set variables of :data:`NO_EFFECT`.

    Example:
        >>> ignored({"HOROVOD_CYCLE_TIME": "5", "HOME": "/root"})
        ['HOROVOD_CYCLE_TIME']
    """
    return [name for name in NO_EFFECT if env.get(name)]


def apply(env: Mapping[str, str]) -> None:
    """At ``hvd.init()``: check the fusion threshold, name the variables with no effect, start ``HOROVOD_TIMELINE``."""
    fusion_bytes(env)
    if (names := ignored(env)) and runtime.rank() == 0:
        print(f"mldist: {', '.join(names)} have no effect in mldist (Horovod tuning)", file=sys.stderr, flush=True)
    if env.get("HOROVOD_TIMELINE") and _timeline["active"] is None:
        start_timeline(env["HOROVOD_TIMELINE"])
        processwide.at_exit("atexit: Horovod's timeline", _stop_at_exit)


def _stop_at_exit() -> None:
    if _timeline["active"] is not None and ending_code() in (None, 0):  # all ranks end here together
        stop_timeline()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record every rank from now on; :func:`stop_timeline` writes one Chrome trace at ``file_path``.

    Call it on every rank (it starts with a barrier). ``mark_cycles`` has no counterpart.
    """
    if _timeline["active"] is not None:
        raise ConfigError("a timeline is already being recorded; call hvd.stop_timeline() first")
    target = Path(file_path)
    rec = Recording(target.parent / f".{target.name}.ranks", target)
    rec.start()
    _timeline["active"] = rec


def stop_timeline() -> None:
    """Stop recording and write the timeline (rank 0 merges every rank's events); nothing if none runs."""
    rec: Any = _timeline["active"]
    _timeline["active"] = None
    if rec is not None:
        rec.stop()
