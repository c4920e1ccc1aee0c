"""``mldist stacks`` at scale: ranks at the same place with the same frames are one block, the others listed.

16,384 ranks in one all-reduce are one block ("16,383 ranks (0-16, 18-16383) in collective #58
allreduce(sum) for 12-13 s" and their frames); the rank elsewhere gets its own block, as every
rank did before. Jobs of up to :data:`FOLD_ABOVE` ranks are shown rank by rank, and so is any job
with ``mldist stacks --all``.

Example:
    >>> from mldist.base.progress import Record
    >>> rs = {r: Record(r, "n", 1, 5, 4, (5, "allreduce(sum)", 90.0), None, ("t.py:3 f: x()",), 99.0)
    ...       for r in range(20)}
    >>> rs[7] = Record(7, "n", 1, 4, 4, None, (4, "allreduce(sum)", 95.0), ("d.py:8 g: y()",), 99.0)
    >>> lines = grouped(rs, lambda r: [f"rank {r.rank} alone"], now=100.0)
    >>> lines[0], lines[1], lines[2]
    ('19 ranks (0-6, 8-19) in collective #5 allreduce(sum) for 10 s', '    t.py:3 f: x()', 'rank 7 alone')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .progress import Record

#: Jobs of up to this many ranks are shown rank by rank.
FOLD_ABOVE = 8
#: How many rank ranges a folded block's head lists before it counts the rest.
RANGES = 8


def place(record: Record, now: float) -> tuple[str, float | None]:
    """Where a rank is, without its durations (the same for every rank there), and since when (or None)."""
    stale = " (stale record)" if record.stale(now) else ""
    if record.current is not None:
        number, what, since = record.current
        return f"in collective #{number} {what}{stale}", since
    if record.last is not None:
        number, what, when = record.last
        return f"between collectives, the last finished #{number} {what}{stale}", when
    return f"before its first collective{stale}", None


def ranges(ranks: Iterable[int]) -> str:
    """``0-6, 8-19``: sorted ranks as runs, the first :data:`RANGES` of them, then how many more.

    Example:
        >>> ranges([0, 1, 2, 5, 7, 8]), ranges(range(0, 40, 2))[-9:]
        ('0-2, 5, 7-8', ' 12 more)')
    """
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    shown = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:RANGES]]
    more = f" (and {len(runs) - RANGES} more)" if len(runs) > RANGES else ""
    return ", ".join(shown) + more


def grouped(
    records: Mapping[int, Record], describe: Callable[[Record], list[str]], now: float, every: bool = False
) -> list[str]:
    """The lines of ``mldist stacks``: folded blocks, largest first, then each rank alone as ``describe`` says.

    Args:
        records: every rank's record, by rank.
        describe: one rank's block (its head line and frames).
        now: the time, for durations.
        every: every rank by itself (``--all``), as for jobs of up to :data:`FOLD_ABOVE` ranks.
    """
    if every or len(records) <= FOLD_ABOVE:
        return [line for record in records.values() for line in describe(record)]
    groups: dict[tuple[str, tuple[str, ...]], list[Record]] = {}
    for record in records.values():
        groups.setdefault((place(record, now)[0], record.stack), []).append(record)
    lines: list[str] = []
    for (where, stack), members in sorted(groups.items(), key=lambda item: -len(item[1])):
        if len(members) == 1:
            continue
        times = [now - t for r in members if (t := place(r, now)[1]) is not None]
        span = _span(times, ", {} s ago" if where.startswith("between") else " for {} s")
        lines.append(f"{len(members):,} ranks ({ranges(r.rank for r in members)}) {where}{span}")
        lines.extend(f"    {frame}" for frame in stack or ("(no Python frames)",))
    for members in groups.values():
        if len(members) == 1:
            lines.extend(describe(members[0]))
    return lines


def _span(seconds: list[float], form: str) -> str:
    """``form`` with the range of ``seconds`` ("12" or "12-13"); "" without any.

    Example:
        >>> _span([12.2, 13.4], " for {} s"), _span([3.0, 3.1], " for {} s"), _span([], "x")
        (' for 12-13 s', ' for 3 s', '')
    """
    if not seconds:
        return ""
    low, high = f"{min(seconds):.0f}", f"{max(seconds):.0f}"
    return form.format(low if low == high else f"{low}-{high}")
