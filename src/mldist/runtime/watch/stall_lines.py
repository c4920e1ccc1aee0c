"""The lines of the stall watch (:mod:`mldist.runtime.watch.stall`): the timeout it reads, and what a rank says when a
collective passes it, naming the late ranks or, when every rank reached it, the engine and what to try next.

Example:
    >>> stall_message(1, "nccl", "allreduce(sum)", 612.0, 600.0)[:46]
    'rank 1 waited 612 s in allreduce(sum) (engine '
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...base import envvalues, progress

#: What to try next, per engine.
HINTS: Mapping[str, str] = {
    "nccl": "NCCL collectives stall on some clusters (network, driver or NCCL_* settings): "
    "set MLDIST_COMMUNICATION=ring (mldist run --communication ring) to use TensorFlow's RING "
    "collectives instead",
    "ring": "a peer stopped making progress (stuck in its input pipeline or I/O, or running other "
    "steps); check the other ranks' output, or try MLDIST_COMMUNICATION=mpi on CPUs",
    "mpi": "another rank did not reach this collective (stuck, or running other steps); check the "
    "other ranks' output, or try MLDIST_COMMUNICATION=ring",
}


def collective_timeout(env: Mapping[str, str]) -> float:
    """Seconds from ``MLDIST_COLLECTIVE_TIMEOUT`` (default :data:`DEFAULT_TIMEOUT`; 0: no watch).

    A bad value is a ConfigError (:data:`mldist.base.envvalues.COLLECTIVE_TIMEOUT`).

    Example:
        >>> collective_timeout({}), collective_timeout({"MLDIST_COLLECTIVE_TIMEOUT": "0"})
        (600.0, 0.0)
    """
    return envvalues.COLLECTIVE_TIMEOUT.read(env)


def stall_message(rank: int, engine: str, what: str, seconds: float, timeout: float) -> str:
    """The one line a rank prints before the watch ends it.

    Args:
        rank: this rank.
        engine: "nccl", "ring" or "mpi".
        what: the collective ("allreduce(sum)", "broadcast", ...).
        seconds: how long it has been in flight.
        timeout: the limit it passed.

    Example:
        >>> "MLDIST_COMMUNICATION=ring" in stall_message(0, "nccl", "allreduce(sum)", 601, 600)
        True
    """
    hint = HINTS.get(engine, "check the other ranks' output")
    return (
        f"rank {rank} waited {seconds:.0f} s in {what} (engine {engine}) for the other workers, more than "
        f"{envvalues.COLLECTIVE_TIMEOUT.name}={timeout:g}; {hint}; {RAISE_IT}"
    )


#: The end of every stall message.
RAISE_IT = "raise MLDIST_COLLECTIVE_TIMEOUT if one step really takes this long (0 turns the watch off)"


def late_message(rank: int, engine: str, late: Sequence[str], seconds: float, timeout: float) -> str:
    """The stall message that names the late ranks (``late``: :func:`late_lines`).

    Example:
        >>> late_message(0, "mpi", ["rank 1 has not reached collective #3 broadcast after 9 s: ..."], 9, 8)[:36]
        'rank 1 has not reached collective #3'
    """
    setting = f"{envvalues.COLLECTIVE_TIMEOUT.name}={timeout:g}"
    tail = f"rank {rank} waited {seconds:.0f} s (engine {engine}), more than {setting}"
    return "\n".join([*late, f"{tail}; {RAISE_IT}"])


#: How many late ranks a stall line lists in full; the rest are counted.
LISTED = 4


def _where(record: progress.Record, now: float) -> str:
    """Where a late rank is: its collective in flight, or its code; how old that news is."""
    current, last = progress.in_flight(record, now), progress.finished_last(record)
    doing = f"is in {current}" if current else f"is in {record.stack[0]}" if record.stack else "is in no Python code"
    done = f"it finished {last[0]} at {progress.clock(last[1])}" if last else "it finished no collective"
    fresh = f" ({progress.STALE_WHY}; this is {record.age(now):.0f} s old)" if record.stale(now) else ""
    return f"{done} and {doing}{fresh}"


def late_lines(
    rank: int,
    number: int,
    what: str,
    waited: float,
    records: Mapping[int, progress.Record],
    size: int,
    where: Path | None,
    now: float | None = None,
) -> list[str]:
    """The lines naming the ranks that keep ``rank`` waiting in its collective ``number`` (``what``).

    A rank is late when it has begun fewer collectives than ``number``; a rank at the same
    number in another collective is out of step (the two sides named). Empty when every rank
    reached the collective (the engine itself stalls), or when nothing is known of any other rank.

    Args:
        rank: the waiting rank.
        number, what, waited: its collective in flight: number, name, seconds so far.
        records: every rank's record (see :func:`mldist.base.progress.read`).
        size: the number of ranks.
        where: the progress folder (named when a rank's record is missing), or None.
        now: the time (default: now).

    Example:
        >>> from mldist.base.progress import Record
        >>> r1 = Record(1, "n2", 9, 57, 57, None, (57, "allreduce(sum)", 0.0), ("stuck.py:9 f: sleep(60)",), 20.0)
        >>> late_lines(0, 58, "allreduce(sum)", 20.0, {1: r1}, 2, None, now=21.0)[0][:70]
        'rank 1 has not reached collective #58 allreduce(sum) after 20 s: it fi'
    """
    now = time.time() if now is None else now
    others = [r for r in range(size) if r != rank]
    if not any(r in records for r in others):
        return []
    late = [r for r in others if r not in records or records[r].began < number]
    apart = [
        r for r in others if r in records and (c := records[r].current) is not None and c[0] == number and c[1] != what
    ]
    lines = []
    for r in late[:LISTED]:
        head = f"rank {r} has not reached collective #{number} {what} after {waited:.0f} s"
        if r in records:
            lines.append(f"{head}: {_where(records[r], now)}")
        else:
            lines.append(
                f"{head}: nothing is known of it (no record in {where or 'a progress folder'}; "
                "ranks on other nodes need a folder every node sees: MLDIST_RUN_DIR)"
            )
    if len(late) > LISTED:
        lines.append(f"and {len(late) - LISTED} more late rank(s): {', '.join(map(str, late[LISTED:]))}")
    for r in apart[:LISTED]:
        theirs = records[r].current
        assert theirs is not None
        lines.append(f"rank {rank} is in #{number} {what} while rank {r} is in #{number} {theirs[1]}")
    return lines
